"""SR-PPO (single-rollout Pass@k PPO): Monte Carlo advantages reweighted by the Pass@k factor.

Equations from ``PACT_SRPPO_SPEC.md`` (section "SR-PPO"): ``J_k = E[1 - (1 - q(s_0))^k]`` has
the gradient ``E[w_k(s_0) sum_t grad log pi (Y - b)]`` with ``w_k(q) = k (1 - q)^(k - 1)``;
the critic's prompt-state value ``q^ = V(s_{u_1})`` stands in for ``q(s_0)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from trainer.algorithms.masks import ActionMask
from trainer.algorithms.pact import pact_advantages
from trainer.algorithms.positions import first_action_values
from trainer.algorithms.validation import (
    require_floating,
    require_ndim,
    require_rewards,
    require_rewards_in,
)


def _check_k(k: float) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k < 1:
        raise ValueError(f"k must be a finite number >= 1, got {k!r}")


def srppo_passk_weights(initial_values: Tensor, k: float = 4.0, *, check: bool = True) -> Tensor:
    """Pass@k weights ``w^_i = k (1 - q^_i)^(k - 1)``, ``q^_i = clamp(V(s_{u_1}), 0, 1)``, ``[N]``.

    SR-PPO sec. 4.2. ``k >= 1`` (real values allowed); ``0^0 = 1``, so ``k = 1`` gives 1
    everywhere. Limits: ``w(0) = k``, ``w(1) = 0`` for ``k > 1``; ``int_0^1 w dq = 1``. No
    gradient.
    """
    if check:
        require_floating("initial_values", initial_values)
        require_ndim("initial_values", initial_values, 1, "[N] (one value per trajectory)")
        _check_k(k)
    q = initial_values.detach().clamp(0.0, 1.0)  # q^, clamped: a non-sigmoid V may leave [0, 1]
    return (1.0 - q).pow_(k - 1.0).mul_(k)  # sec. 4.2: w_k(q) = k (1 - q)^(k - 1)


def srppo_advantages(
    rewards: Tensor,
    values: Tensor,
    action_mask: Tensor | ActionMask,
    k: float = 4.0,
    gamma: float = 1.0,
    *,
    check: bool = True,
) -> Tensor:
    """SR-PPO's actor advantage ``A_{u_j} = w^_i (R_i - V(s_{u_j}))``, ``[N, T]``.

    The Monte Carlo advantage (GAE with ``gamma``, ``lambda = 1``: :func:`pact_advantages`)
    times the row's Pass@k weight from ``V(s_{u_1})`` (sec. 4.2). ``rewards`` ``[N]`` in
    ``[0, 1]``; ``values`` the critic frozen for the batch (``V_old``). Constants: no
    gradient, 0 off the action tokens, no whitening.
    """
    am = ActionMask.of(action_mask, check=check)
    if check:
        require_rewards(rewards)
        require_rewards_in(rewards, 0.0, 1.0, "normalise them first (normalize_rewards)")
        _check_k(k)
    passk = srppo_passk_weights(first_action_values(values.detach(), am, check=False), k)
    if gamma == 1.0 and rewards.ndim == 1:  # R - V(s_{u_j}) on every action token
        dtype = torch.promote_types(rewards.dtype, values.dtype)
        w = passk.to(dtype)[:, None]
        scaled_r = rewards.detach().to(dtype)[:, None] * w
        scaled = torch.addcmul(scaled_r, values.detach(), w, value=-1)
        return scaled.mul_(am.weights(dtype))  # sec. 4.2: A = w^ R - w^ V in one pass
    adv = pact_advantages(rewards, values, am, gamma, check=check)
    return adv.mul_(passk.to(adv.dtype)[:, None])  # sec. 4.2: A = w^ (R - V)
