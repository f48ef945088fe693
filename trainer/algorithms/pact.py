"""PACT (Policy Aligned Critic Training): lambda = 1 advantages, TIS, importance-weighted targets.

Equations from ``PACT_SRPPO_SPEC.md`` (section "PACT"), in the notation of LI2SAO_SPEC: row
``i`` has action tokens ``u_1 < ... < u_M``; observation tokens between them are never read.
The critic's BCE loss is :func:`trainer.algorithms.critic.bce_value_loss`; the actor losses are
the existing DIS / PPO-clip losses on the TIS-weighted advantage ``w_t A_t``.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

from trainer.algorithms.gae import check_gae_inputs, discounted_returns
from trainer.algorithms.masks import ActionMask
from trainer.algorithms.policy_losses import _clipped_exp
from trainer.algorithms.validation import (
    require_floating,
    require_ndim,
    require_positive,
    require_rewards,
    require_rewards_in,
    require_rewards_per_row,
    require_same_device,
    require_same_shape,
)

LOG_SUM_GUARD = 1e4
"""Per-token bound on ``|log c|`` inside the product's log-sum (no real ratio comes near it)."""

CriticIS = Literal["token", "product", "first_order", "none"]
CRITIC_IS_MODES: tuple[str, ...] = get_args(CriticIS)


def pact_advantages(
    rewards: Tensor,
    values: Tensor,
    action_mask: Tensor | ActionMask,
    gamma: float = 1.0,
    *,
    check: bool = True,
) -> Tensor:
    """PACT's actor advantage: skip-observation GAE with ``lambda = 1``, ``[N, T]``.

    ``A_{u_j} = sum_{k >= j} gamma^(k - j) r_{u_k} - V(s_{u_j})``; for an outcome reward
    (``[N]``) and ``gamma = 1`` it is ``R - V(s_{u_j})`` (sec. 3.3, "PACT uses lambda = 1").
    ``values`` is the critic frozen before the iteration (``V_old``); no whitening. 0 off the
    action tokens, no gradient.
    """
    am = ActionMask.of(action_mask, check=check)
    if check:
        check_gae_inputs(rewards, values, am, gamma)
    dtype = torch.promote_types(rewards.dtype, values.dtype)
    # lambda = 1 telescopes (LI2SAO_SPEC appendix A.2, Eq. 36): A_t = G_t - V(s_t), with G
    # the discounted reward-to-go (R on every action token for an outcome and gamma = 1);
    # skip_observation_gae(..., lam=1)'s advantages without its returns (tested equal)
    returns = discounted_returns(rewards.detach().to(dtype), am, gamma, check=False)
    return returns.addcmul_(values.detach().to(dtype), am.weights(dtype), value=-1.0)


def pact_credit(
    rewards: Tensor,
    values: Tensor,
    action_mask: Tensor | ActionMask,
    gamma: float = 1.0,
    *,
    check: bool = True,
) -> Tensor:
    """Token credit of Theorem 1: the TD residual (GAE with ``lambda = 0``), ``[N, T]``.

    ``C_{u_j} = r_{u_j} + gamma V(s_{u_{j+1}}) - V(s_{u_j})`` with ``V(s_{u_{M+1}}) = 0``: for an
    outcome reward ``C_{u_M} = R - V(s_{u_M})``, and with ``gamma = 1`` the credit telescopes to
    ``sum_j C_{u_j} = R - V(s_{u_1})`` (Completeness). A diagnostic
    (``critic/mean_abs_credit``, App. E.2), not an actor advantage. Equal to
    ``skip_observation_gae(..., lam=0)[0]`` (tested), computed without the compaction: inside a
    span of consecutive action tokens the next action is the next position; only the last
    token of a span looks up the first token of the row's next span (one ``nonzero`` over the
    span ends and starts, a few per row). 0 off the action tokens, no gradient.
    """
    am = ActionMask.of(action_mask, check=check)
    if check:
        check_gae_inputs(rewards, values, am, gamma)
    dtype = torch.promote_types(rewards.dtype, values.dtype)
    rewards = rewards.detach().to(dtype)
    inner, ends, at_ends = _span_credit(rewards, values.detach().to(dtype), am, gamma)
    credit = F.pad(inner, (0, 1))
    credit[ends[:, 0], ends[:, 1]] = at_ends
    if rewards.ndim == 2:  # per-token rewards: r_t on every action token
        credit += rewards * am.weights(dtype)
    return credit


def _span_credit(
    rewards: Tensor, v: Tensor, am: ActionMask, gamma: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The credit of :func:`pact_credit` in two parts (inputs validated, one dtype).

    ``inner`` ``[N, T - 1]``: ``gamma V_{t+1} - V_t`` at action tokens followed by one, 0
    elsewhere. ``ends`` ``[E, 2]``: (row, position) of the last token of each span of
    consecutive action tokens, row-major; ``at_ends`` ``[E]``: their credit,
    ``gamma V(first token of the row's next span) - V_t``, or ``R - V_t`` (``[N]`` outcome
    rewards; 0 for per-token rewards, which the caller adds) at the row's last span.
    """
    weights = am.weights(v.dtype)
    # Thm. 1 inside a span: C_t = gamma V_{t+1} - V_t (x 0 elsewhere: the inputs are finite;
    # a product of float weights is the cheap form of the bool mask ``follows``)
    step = v[:, 1:] - v[:, :-1] if gamma == 1.0 else (v[:, 1:] * gamma).sub_(v[:, :-1])
    inner = step.mul_(weights[:, 1:]).mul_(weights[:, :-1])
    starts, ends = am.spans()  # first and last token of each span, row-major
    # span k ends at ends[k]; the next action is starts[k + 1] when it lies in the same row
    same_row = ends[:-1, 0] == starts[1:, 0]
    following = torch.zeros(ends.shape[0], dtype=v.dtype, device=v.device)
    following[:-1] = torch.where(same_row, v[starts[1:, 0], starts[1:, 1]] * gamma, 0.0)
    if rewards.ndim == 1:  # r_{u_M} = R after the row's last span (no bootstrap after u_M)
        last_span = torch.ones_like(following, dtype=torch.bool)
        last_span[:-1] = ~same_row
        following += torch.where(last_span, rewards[ends[:, 0]], 0.0)
    return inner, ends, following - v[ends[:, 0], ends[:, 1]]


def mean_abs_credit(rewards: Tensor, values: Tensor, am: ActionMask, gamma: float = 1.0) -> Tensor:
    """``critic/mean_abs_credit``: mean ``|C|`` over the action tokens (App. E.2), float64.

    :func:`pact_credit` for ``[N]`` outcome rewards without building the ``[N, T]`` tensor
    (inputs validated).
    """
    count = am.total(torch.float64)
    dtype = torch.promote_types(rewards.dtype, values.dtype)
    rewards = rewards.detach().to(dtype)
    inner, _, at_ends = _span_credit(rewards, values.detach().to(dtype), am, gamma)
    total = torch.linalg.vector_norm(inner, 1) + at_ends.abs().sum()  # sum |C|
    return total.to(torch.float64) / count


def _check_log_probs(am: ActionMask, **named: Tensor) -> None:
    for name, tensor in named.items():
        require_floating(name, tensor)
    first = next(iter(named))
    require_ndim(first, named[first], 2, "[N, T]")
    require_same_shape(action_mask=am.mask, **named)
    require_same_device(action_mask=am.mask, **named)


def _check_range(low_name: str, low: float, high_name: str, high: float) -> None:
    require_positive(low_name, low, allow_zero=True)
    require_positive(high_name, high)
    if not low < high:
        raise ValueError(f"{low_name} must be < {high_name}, got {low}, {high}")


def tis_weights(
    old_logp: Tensor,
    behavior_logp: Tensor,
    action_mask: Tensor | ActionMask,
    low: float = 0.0,
    high: float = 2.0,
    *,
    check: bool = True,
) -> Tensor:
    """Truncated importance weights ``w_t = clip(exp(old_t - mu_t), low, high)``, ``[N, T]``.

    The train/inference mismatch correction of PACT's actor (App. E.4, "TIS [0, 2]"): ``old``
    is the trainer's recomputation under the pre-update policy, ``mu`` the rollout engine's.
    Detached, 0 off the action tokens (the log-ratio is masked and clamped to +-20 before
    ``exp``).
    """
    am = ActionMask.of(action_mask, check=check)
    if check:
        _check_log_probs(am, old_logp=old_logp, behavior_logp=behavior_logp)
        _check_range("low", low, "high", high)
    weights = am.weights(old_logp.dtype)
    log_ratio = (old_logp.detach() - behavior_logp.detach()) * weights
    return _clipped_exp(log_ratio).clamp_(low, high).mul_(weights)  # App. E.4: TIS [low, high]


def _reverse_cumsum(x: Tensor) -> Tensor:
    """``y_t = sum_{t' >= t} x_{t'}`` along dim 1."""
    return x.flip(1).cumsum(dim=1).flip(1)


def pact_is_weights(
    new_logp: Tensor,
    old_logp: Tensor,
    action_mask: Tensor | ActionMask,
    mode: CriticIS = "token",
    *,
    check: bool = True,
) -> Tensor:
    """The critic's importance weight ``W_{u_j}`` by ``mode`` (see :func:`pact_critic_targets`).

    ``[N, T]``, 0 off the action tokens, no gradient. Log-ratios are masked, and clamped to
    +-20 before every ``exp`` (per token for ``"token"`` / ``"first_order"``, on the log-sum
    for ``"product"``), so every weight is finite; ratios that large lie far outside the
    acceptance range anyway.
    """
    am = ActionMask.of(action_mask, check=check)
    if check:
        _check_log_probs(am, new_logp=new_logp, old_logp=old_logp)
        _check_mode(mode)
    weights = am.weights(new_logp.dtype)
    if mode == "none":  # ablation "PACT w/o IS": W = 1
        return weights.clone()
    log_c = (new_logp.detach() - old_logp.detach()) * weights  # log c_t, 0 off actions
    if mode == "token":  # App. C.7 current-token target: W_{u_j} = c_{u_j}
        return _clipped_exp(log_c).mul_(weights)
    if mode == "product":  # sec. 4.3 I_t: W_{u_j} = prod_{k >= j} c_{u_k} (observations add 0)
        # the product in log space; the per-token guard only keeps absurd inputs from
        # overflowing the sum, the +-20 clamp before exp keeps W finite
        log_w = _reverse_cumsum(log_c.clamp(-LOG_SUM_GUARD, LOG_SUM_GUARD))
        return _clipped_exp(log_w).mul_(weights)
    if mode == "first_order":  # App. C.7 Y^FO: W_{u_j} = 1 + sum_{k >= j} (c_{u_k} - 1)
        excess = _clipped_exp(log_c).sub_(1.0)  # exactly 0 off actions (exp(0) - 1)
        return _reverse_cumsum(excess).add_(1.0).mul_(weights)
    raise ValueError(f"mode must be one of {CRITIC_IS_MODES}, got {mode!r}")


def _check_mode(mode: str) -> None:
    if mode not in CRITIC_IS_MODES:
        raise ValueError(f"mode must be one of {CRITIC_IS_MODES}, got {mode!r}")


def targets_from_weights(
    rewards: Tensor,
    is_weights: Tensor,
    am: ActionMask,
    mode: CriticIS,
    accept_low: float,
    accept_high: float,
) -> tuple[Tensor, Tensor]:
    """``(W R, keep)`` from the weights of :func:`pact_is_weights` (inputs already validated)."""
    targets = is_weights * rewards.detach().to(is_weights.dtype)[:, None]  # sec. 4.3: y = W R
    if mode == "none":  # the ablation keeps every action token
        return targets, am.mask.clone()
    in_range = (is_weights >= accept_low) & (is_weights <= accept_high)
    return targets, am.mask & in_range  # Table 3: critic IS acceptance range [0, 6]


def pact_critic_targets(
    rewards: Tensor,
    new_logp: Tensor,
    old_logp: Tensor,
    action_mask: Tensor | ActionMask,
    mode: CriticIS = "token",
    accept_low: float = 0.0,
    accept_high: float = 6.0,
    *,
    check: bool = True,
) -> tuple[Tensor, Tensor]:
    """Importance-weighted critic targets ``y_{u_j} = W_{u_j} R`` and their keep mask.

    ``c_t = exp(new_t - old_t)`` compares the actor after all actor steps of the iteration
    (``new``) with the pre-update policy (``old``); the weight ``W`` by ``mode``:
    ``"token"`` ``c_{u_j}`` (the paper's method, App. C.7), ``"product"``
    ``prod_{k >= j} c_{u_k}`` (exact, sec. 4.3), ``"first_order"``
    ``1 + sum_{k >= j} (c_{u_k} - 1)`` (App. C.7), ``"none"`` 1 (ablation "PACT w/o IS").
    Products and sums run over the action subsequence only.

    Args:
        rewards: ``[N]`` outcome rewards in ``[0, 1]`` (see :func:`normalize_rewards`).
        new_logp, old_logp: ``[N, T]`` log-probabilities; only action tokens are read.

    Returns:
        ``(targets, keep)``: ``targets`` ``[N, T]`` (``W R`` on action tokens, 0 elsewhere, no
        gradient); ``keep`` ``[N, T]`` bool, ``m_t and accept_low <= W_t <= accept_high``
        (Table 3 "critic IS acceptance range [0, 6]", bounds inclusive); every action token for
        ``"none"``.
    """
    am = ActionMask.of(action_mask, check=check)
    if check:
        require_rewards(rewards)
        require_rewards_per_row(rewards, am.shape[0])
        require_rewards_in(rewards, 0.0, 1.0, "normalise them first (normalize_rewards)")
        require_same_device(rewards=rewards, action_mask=am.mask)
        _check_range("accept_low", accept_low, "accept_high", accept_high)
    w = pact_is_weights(new_logp, old_logp, am, mode, check=check)
    return targets_from_weights(rewards, w, am, mode, accept_low, accept_high)
