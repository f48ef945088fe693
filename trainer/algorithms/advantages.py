"""Sequence-level advantages and normalisation: GRPO (Eq. 2), the adaptive trace, whitening.

The token-level estimator (skip-observation GAE, Eq. 6-7) lives in :mod:`.gae`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from trainer.algorithms.groups import (
    group_all_equal,
    group_index,
    group_mean,
    group_unbiased_std,
)
from trainer.algorithms.masks import ActionMask
from trainer.algorithms.validation import (
    any_true,
    require_floating,
    require_group_ids,
    require_positive,
    require_rewards,
    require_rewards_in,
    require_same_device,
    require_same_shape,
)

AllReduce = Callable[[Tensor], Tensor]
"""A hook that sums a small tensor across data-parallel ranks (identity on one rank)."""


def grpo_advantages(
    rewards: Tensor, group_ids: Tensor, eps: float = 1e-6, *, check: bool = True
) -> Tensor:
    """GRPO advantage ``A_i = (R_i - mu_g) / (sigma_g + eps)`` per trajectory, ``[N]``.

    ``sigma_g`` is the unbiased (``n - 1``) standard deviation. A group of one, or a group whose
    rewards are all equal, gets exactly 0 (never NaN, never a rounding residue). Write the result
    on every action token of the row (the policy losses accept ``[N]`` advantages directly).
    """
    if check:
        require_rewards(rewards)
        require_group_ids(group_ids, rewards.shape[0])
        require_same_device(rewards=rewards, group_ids=group_ids)
        require_positive("eps", eps, allow_zero=True)
    rewards = rewards.detach()
    index = group_index(group_ids)
    mu = group_mean(rewards, index)  # Eq. 2 (LI2SAO_SPEC "GRPO advantage"): group mean
    sigma = group_unbiased_std(rewards, index, mu)  # Eq. 2: unbiased (n-1) std
    adv = (rewards - mu[index.inverse]) / (sigma[index.inverse] + eps)
    constant = group_all_equal(rewards, index)[index.inverse]
    return torch.where(constant, torch.zeros_like(adv), adv)


def normalize_rewards(
    rewards: Tensor, reward_min: float = 0.0, reward_max: float = 1.0, *, check: bool = True
) -> Tensor:
    """Outcome rewards mapped to ``[0, 1]``: ``R~ = (R - R_min) / (R_max - R_min)``, ``[N]``.

    PACT and SR-PPO need ``R in [0, 1]`` (PACT_SRPPO_SPEC "Notation", PACT appendix C.1: a
    positive affine map leaves the optimal policy unchanged). A reward outside
    ``[reward_min, reward_max]``, or ``reward_max <= reward_min``, is a ``ValueError``: never a
    silent clamp. The result carries no gradient.
    """
    if check:
        require_rewards(rewards)
        for name, bound in (("reward_min", reward_min), ("reward_max", reward_max)):
            if isinstance(bound, bool) or not isinstance(bound, (int, float)):
                raise ValueError(f"{name} must be a number, got {bound!r}")
            if not math.isfinite(bound):
                raise ValueError(f"{name} must be finite, got {bound!r}")
        if not reward_max > reward_min:
            raise ValueError(
                f"reward_max must be > reward_min, got reward_min={reward_min}, "
                f"reward_max={reward_max}"
            )
        require_rewards_in(
            rewards, reward_min, reward_max, "set reward_min / reward_max to the reward's range"
        )
    scaled = (rewards.detach() - reward_min) / (reward_max - reward_min)  # PACT App. C.1
    return scaled.clamp_(0.0, 1.0)  # rounding only: the inputs lie in range (checked above)


def adaptive_lambda(
    action_mask: Tensor | ActionMask,
    alpha: float = 1.5,
    *,
    dtype: torch.dtype = torch.float32,
    check: bool = True,
) -> Tensor:
    """Length-adaptive GAE trace ``lambda_i = clamp(1 - 1 / (alpha * M_i), 0, 1)``, ``[N]``.

    ``M_i`` is the number of action tokens of row ``i`` (LI2SAO_SPEC "Skip-observation GAE",
    appendix D.2). Longer trajectories get a trace closer to 1.
    """
    if check:
        require_positive("alpha", alpha)
    m = ActionMask.of(action_mask, check=check).row_counts(dtype)
    return (1.0 - 1.0 / (alpha * m)).clamp(0.0, 1.0)  # appendix D.2


def _mask_weights(mask: Tensor | ActionMask, like: Tensor, check: bool) -> Tensor:
    """0/1 weights of any-shaped ``mask`` (or an ActionMask) in ``like``'s dtype."""
    if isinstance(mask, ActionMask):
        return mask.weights(like.dtype)
    if check:
        require_same_shape(values=like, mask=mask)
        require_same_device(values=like, mask=mask)
        if mask.dtype != torch.bool and any_true((mask != 0) & (mask != 1)):
            raise ValueError("mask must hold only 0 and 1")
    flags = mask if mask.dtype == torch.bool else mask != 0
    return flags.view(torch.uint8).to(like.dtype)


def masked_moments(values: Tensor, mask: Tensor | ActionMask) -> Tensor:
    """``[3]`` float64 totals ``(count, sum, sum of squares)`` of ``values`` where ``mask``.

    These are additive, so data-parallel ranks can sum them with one all-reduce before
    :func:`whiten` turns them into a mean and a standard deviation. The sums run in the input
    dtype (torch's pairwise summation) and are returned in float64.
    """
    return _moments(values, _mask_weights(mask, values, check=False))


def _moments(values: Tensor, weights: Tensor) -> Tensor:
    with torch.no_grad():
        picked = values * weights
        totals = (weights.sum(), picked.sum(), (picked * values).sum())
        return torch.stack([t.to(torch.float64) for t in totals])


def whiten(
    values: Tensor,
    mask: Tensor | ActionMask,
    eps: float = 1e-8,
    *,
    all_reduce: AllReduce | None = None,
    check: bool = True,
) -> Tensor:
    """Masked whitening ``(x - mean) / (std + eps)`` over the positions where ``mask`` is 1.

    Mean and (population) standard deviation are taken over every masked entry of the whole
    tensor (all action tokens of the batch); with ``all_reduce`` the moments are first summed
    across data-parallel ranks, so every rank whitens with the global statistics. Positions
    outside the mask are 0 in the result. The result carries no gradient (advantages are
    constants of the policy objective).
    """
    if check:
        require_floating("values", values)
        require_positive("eps", eps, allow_zero=True)
    weights = _mask_weights(mask, values, check)
    values = values.detach()
    moments = _moments(values, weights)
    if all_reduce is not None:
        moments = all_reduce(moments)
    count, total, total_sq = moments.unbind()
    if check and not float(count) > 0:
        raise ValueError("mask selects no entry to whiten")
    mean = total / count
    std = (total_sq / count - mean * mean).clamp(min=0.0).sqrt()
    scale = (1.0 / (std + eps)).to(values.dtype)
    return (values - mean.to(values.dtype)) * scale * weights
