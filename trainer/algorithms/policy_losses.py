"""Policy objectives: DIS (Eq. 8-9), PPO clip (Eq. 1) and GSPO (sequence-level ratio).

All three take the current log-probabilities ``logp`` (with gradient), the behaviour
log-probabilities recorded by the rollout engine, advantages (``[N]`` per trajectory or
``[N, T]`` per token; treated as constants) and the action mask, and return
``(loss, metrics)``: ``loss`` is the scalar to minimise (``-J``), ``metrics`` a dict of detached
0-dim tensors (no host synchronisation; the objective layer turns them into floats).

The log-ratio is set to 0 outside action tokens and clamped to +-20 *before* exponentiating,
so finite but arbitrary log-probabilities on observation or padding positions, or absurd
ratios, can never overflow into the loss or produce ``inf * 0`` in a gradient.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from torch import Tensor

from trainer.algorithms.masks import ActionMask
from trainer.algorithms.trajectories import per_trajectory_sum, require_dense_trajectory_index
from trainer.algorithms.validation import (
    require_floating,
    require_ndim,
    require_positive,
    require_same_device,
    require_same_shape,
)

Aggregation = Literal["seq-mean-token-mean", "token-mean"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)

PPO_LOG_RATIO_LIMIT = 20.0
"""All three losses clamp the log-ratio to +-20 (ratio ~5e8) so that ``exp`` stays finite."""


def _prepare(
    logp: Tensor,
    behavior_logp: Tensor,
    advantages: Tensor,
    action_mask: Tensor | ActionMask,
    check: bool,
    trajectory_index: Tensor | None = None,
) -> tuple[ActionMask, Tensor, Tensor, Tensor]:
    """Validate the common inputs; return ``(mask, weights, log-ratio, advantages)``.

    ``weights`` are the 0/1 mask in ``logp``'s dtype; the log-ratio is 0 off the action tokens
    (inputs are finite, so a product with the weights is exact and cheaper than ``where``);
    advantages come back as ``[N, 1]`` (broadcast, never materialised) or ``[N, T]``, detached.
    """
    am = ActionMask.of(action_mask, check=check)
    if check:
        require_floating("logp", logp)
        require_floating("behavior_logp", behavior_logp)
        require_floating("advantages", advantages)
        require_ndim("logp", logp, 2, "[N, T]")
        require_same_shape(logp=logp, behavior_logp=behavior_logp, action_mask=am.mask)
        require_same_device(
            logp=logp, behavior_logp=behavior_logp, advantages=advantages, action_mask=am.mask
        )
        if advantages.ndim == 1:
            if advantages.shape[0] != logp.shape[0]:
                raise ValueError(
                    f"shape mismatch: advantages{tuple(advantages.shape)} vs "
                    f"logp{tuple(logp.shape)} (expected [N] or [N, T])"
                )
        else:
            require_same_shape(advantages=advantages, logp=logp)
        if trajectory_index is not None:
            require_dense_trajectory_index(trajectory_index, am.mask)
    adv = advantages.detach()
    if adv.ndim == 1:
        adv = adv[:, None]
    weights = am.weights(logp.dtype)
    log_ratio = (logp - behavior_logp.detach()) * weights
    return am, weights, log_ratio, adv


def _aggregate(
    per_token: Tensor,
    adv: Tensor,
    am: ActionMask,
    aggregation: str,
    trajectory_index: Tensor | None = None,
) -> Tensor:
    """Eq. 1: ``J = mean_i (1/M_i) sum_t m_t l_t`` ("seq-mean-token-mean") or a token mean.

    ``l_t = per_token_t * A_t``; ``per_token`` must already be 0 off the action tokens. With a
    per-row advantage (``adv`` of shape ``[N, 1]``) the row sum is taken first and multiplied
    by ``A_i`` afterwards, which avoids a broadcast ``[N, T]`` product. ``i`` runs over
    trajectories: with a ``trajectory_index`` the rows (segments) of one trajectory share one
    ``1/M_i`` with ``M_i`` its action tokens over all its rows.
    """
    counts = am.row_counts(per_token.dtype)
    if adv.shape[1] == 1:
        row_sums = per_token.sum(dim=1) * adv[:, 0]
    else:
        row_sums = (per_token * adv).sum(dim=1)
    if aggregation != "seq-mean-token-mean":
        return row_sums.sum() / counts.sum()
    if trajectory_index is not None:
        k = int(trajectory_index.max()) + 1
        row_sums = per_trajectory_sum(row_sums, trajectory_index, k)
        counts = per_trajectory_sum(counts, trajectory_index, k)
    return (row_sums / counts).mean()  # Eq. 1 (LI2SAO_SPEC "Policy objective")


def _check_aggregation(aggregation: str) -> None:
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def _fraction(flags: Tensor, count: Tensor) -> Tensor:
    return torch.count_nonzero(flags).to(torch.float64) / count


def _abs_dev_mean(ratio: Tensor, count: Tensor) -> Tensor:
    """Mean ``|rho - 1|`` over action tokens, from a ratio that is exactly 1 off them."""
    with torch.no_grad():
        return (ratio - 1.0).abs_().sum().to(torch.float64) / count


def _clipped_exp(log_ratio: Tensor) -> Tensor:
    """``rho = exp(log rho)`` with the log-ratio clamped to +-20 so that ``exp`` stays finite."""
    return log_ratio.clamp(-PPO_LOG_RATIO_LIMIT, PPO_LOG_RATIO_LIMIT).exp()


def dis_policy_loss(
    logp: Tensor,
    behavior_logp: Tensor,
    advantages: Tensor,
    action_mask: Tensor | ActionMask,
    low: float = 0.7,
    high: float = 6.0,
    aggregation: Aggregation = "seq-mean-token-mean",
    *,
    trajectory_index: Tensor | None = None,
    check: bool = True,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Direct double-sided importance sampling: ``l_t = f(rho_t) * A_t`` (Eq. 8-9).

    ``f(x) = x`` for ``low < x < high`` and 0 otherwise: inside the interval the gradient is
    ``A_t * d(rho_t)``, outside it is exactly zero (the token is masked, not clipped).

    Metrics: ``masked_low_frac`` / ``masked_high_frac`` (action tokens with ``rho <= low`` /
    ``rho >= high``), ``rho_abs_dev_mean`` (mean ``|rho - 1|`` over action tokens).
    """
    if check:
        _check_aggregation(aggregation)
        require_positive("low", low, allow_zero=True)
        require_positive("high", high)
        if not low < high:
            raise ValueError(f"DIS interval needs low < high, got ({low}, {high})")
    am, _, log_ratio, adv = _prepare(
        logp, behavior_logp, advantages, action_mask, check, trajectory_index
    )
    rho = _clipped_exp(log_ratio)  # 1 off the action tokens (log-ratio 0 there)
    with torch.no_grad():  # interval tests in log space: rho > low <=> log rho > log low
        below = log_ratio <= (math.log(low) if low > 0 else -math.inf)
        above = log_ratio >= math.log(high)
        if not low < 1.0 < high:  # off-action tokens (rho = 1) would be flagged: mask them
            below, above = below & am.mask, above & am.mask
        keep = (am.mask & ~below & ~above).view(torch.uint8).to(rho.dtype)
    # Eq. 9: f(rho) = rho inside (low, high), else 0 -- value and gradient (the clamp only
    # touches ratios far outside the interval, whose factor is 0 anyway)
    f_rho = rho * keep
    # Eq. 8: l_t = f(rho_t) A_t, loss = -J
    loss = -_aggregate(f_rho, adv, am, aggregation, trajectory_index)
    count = am.total(torch.float64)
    metrics = {
        "masked_low_frac": _fraction(below, count),
        "masked_high_frac": _fraction(above, count),
        "rho_abs_dev_mean": _abs_dev_mean(rho.detach(), count),
    }
    return loss, metrics


def ppo_clip_policy_loss(
    logp: Tensor,
    behavior_logp: Tensor,
    advantages: Tensor,
    action_mask: Tensor | ActionMask,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    aggregation: Aggregation = "seq-mean-token-mean",
    *,
    trajectory_index: Tensor | None = None,
    check: bool = True,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip ``l_t = min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)`` (Eq. 1).

    ``trajectory_index`` (``[N]`` dense ``0..K-1``, optional) groups the rows of one
    trajectory under one ``1/M_i`` (see :func:`_aggregate`); None: every row is a trajectory.

    Metrics: ``clip_frac_low`` / ``clip_frac_high`` (action tokens whose clipped branch is the
    active one: ``A < 0, rho < 1 - eps_low`` / ``A > 0, rho > 1 + eps_high``), ``clip_frac``
    (their sum) and ``rho_abs_dev_mean``.
    """
    if check:
        _check_aggregation(aggregation)
        require_positive("eps_low", eps_low, allow_zero=True)
        require_positive("eps_high", eps_high, allow_zero=True)
    am, weights, log_ratio, adv = _prepare(
        logp, behavior_logp, advantages, action_mask, check, trajectory_index
    )
    rho = _clipped_exp(log_ratio)  # exactly 1 off the action tokens
    count = am.total(torch.float64)
    signs = adv if adv.shape[1] == 1 else _row_signs(adv)
    if signs is not None:  # one sign per row: per-row clip bounds, the advantages as they are
        per_token, low_frac, high_frac = _ppo_row_clip(
            rho, signs, weights, eps_low, eps_high, count
        )
    else:
        per_token, adv, low_frac, high_frac = _ppo_token_clip(
            rho, adv, weights, eps_low, eps_high, count
        )
    loss = -_aggregate(per_token, adv, am, aggregation, trajectory_index)  # Eq. 1
    metrics = {
        "clip_frac_low": low_frac,
        "clip_frac_high": high_frac,
        "clip_frac": low_frac + high_frac,
        "rho_abs_dev_mean": _abs_dev_mean(rho.detach(), count),
    }
    return loss, metrics


def _row_signs(adv: Tensor) -> Tensor | None:
    """``[N, 1]`` with each row's advantage sign (any value of that sign, 0 for an all-zero
    row) when no row of the ``[N, T]`` advantages mixes signs, else None.

    Outcome advantages usually have one sign per row: ``w (R - V)`` with ``R`` in ``{0, 1}``
    and a sigmoid ``V`` (SR-PPO, PACT with the PPO loss) is ``>= 0`` on a solved row and
    ``<= 0`` on a failed one. A row min and max decide; on an accelerator the ``bool``
    waits for it (one host synchronisation).
    """
    low, high = adv.amin(dim=1), adv.amax(dim=1)  # (row-wise aminmax is ~5x slower on CPU)
    if not bool(((low >= 0) | (high <= 0)).all()):
        return None
    return (low + high)[:, None]  # > 0, < 0 or 0 with the row's sign


def _ppo_row_clip(
    rho: Tensor, signs: Tensor, weights: Tensor, eps_low: float, eps_high: float, count: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Advantages of one sign per row (``signs`` ``[N, 1]``: the advantage of a per-row
    advantage, or :func:`_row_signs`): ``min(rho A, clip(rho) A)`` is
    ``A * clamp(rho, max=1 + eps_high)`` for ``A > 0`` and ``A * clamp(rho, min=1 - eps_low)``
    for ``A < 0`` -- one clamp with per-row bounds (same value and gradient as the min form);
    the aggregation multiplies by ``A`` (the row sum by ``A_i`` for a per-row advantage).

    Returns ``(per-token factor, low, high clip fractions)``. A token whose own advantage is 0
    in a row of one sign counts as clipped when its ratio is outside (its term is 0 either way).
    """
    positive, negative = signs > 0, signs < 0
    lower = torch.full_like(signs, -math.inf, dtype=rho.dtype).masked_fill_(negative, 1 - eps_low)
    upper = torch.full_like(signs, math.inf, dtype=rho.dtype).masked_fill_(positive, 1 + eps_high)
    bounded = torch.clamp(rho, min=lower, max=upper)
    with torch.no_grad():  # the clamp moved a token <=> its clipped branch is active
        low_frac = _fraction(bounded > rho, count)
        high_frac = _fraction(bounded < rho, count)
    return bounded * weights, low_frac, high_frac


def _ppo_token_clip(
    rho: Tensor, adv: Tensor, weights: Tensor, eps_low: float, eps_high: float, count: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-token advantages (``adv`` ``[N, T]``): where the clipped branch of
    ``min(rho A, clip(rho) A)`` is strictly the smaller one the term is the constant
    ``clip(rho) A``, elsewhere ``rho A``. So it is written as ``rho * slope + const`` with
    constant factors (``slope = A`` where unclipped, else 0): the min form's value and
    gradient, one product backwards. All float arithmetic (bool masks cost several times more
    on the CPU). Returns ``l_t`` itself, so the aggregation's advantages are ones.
    """
    with torch.no_grad():
        ratio = rho.detach()
        adv = adv * weights  # 0 off the actions: so are the value, slope and constant below
        gain = ratio * adv  # rho A
        value = torch.minimum(gain, ratio.clamp(1.0 - eps_low, 1.0 + eps_high).mul_(adv))
        deficit = gain.sub_(value)  # > 0 exactly where the clipped branch is active
        slope = (deficit == 0).to(adv.dtype).mul_(adv)
        const = torch.addcmul(value, ratio, slope, value=-1.0)
        clipped = torch.count_nonzero(deficit)  # 0 off the actions (rho = 1 there)
        high = torch.count_nonzero(deficit * (adv > 0))  # rho > 1 + eps_high, A > 0
    per_token = torch.addcmul(const, rho, slope)  # Eq. 1 (LI2SAO_SPEC "PPO clip")
    low_frac = (clipped - high).to(torch.float64) / count  # rho < 1 - eps_low, A < 0
    high_frac = high.to(torch.float64) / count
    return per_token, torch.ones_like(adv[:, :1]), low_frac, high_frac


def _active_clip_fractions(
    ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float, count: Tensor
) -> tuple[Tensor, Tensor]:
    """Fractions of action tokens where the clipped branch of ``min`` is the active one.

    ``ratio`` must be 1 off the action tokens (it then never falls outside the clip range
    there); ``adv`` is ``[N, T]`` (or broadcastable to it).
    """
    with torch.no_grad():
        low = (ratio < 1.0 - eps_low) & (adv < 0)
        high = (ratio > 1.0 + eps_high) & (adv > 0)
        return _fraction(low, count), _fraction(high, count)


def gspo_policy_loss(
    logp: Tensor,
    behavior_logp: Tensor,
    advantages: Tensor,
    action_mask: Tensor | ActionMask,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    *,
    trajectory_index: Tensor | None = None,
    check: bool = True,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: sequence ratio ``s_i = exp(mean_t log rho_t)`` (geometric mean), sequence clipping.

    Implemented in the GSPO-token form ``s_{i,t} = sg[s_i] * pi_t / sg[pi_t]``: its value is
    ``s_i`` on every token and its gradient is ``s_i * grad log pi_t``, so with a per-sequence
    advantage (``[N]``) the loss and gradient equal sequence-level GSPO exactly,
    ``-mean_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)``; per-token advantages
    (``[N, T]``) are also accepted. Aggregation is always the sequence mean of token means.
    With a ``trajectory_index`` a sequence is a trajectory: ``s_i`` and the token mean run over
    all its rows.

    Metrics: ``clip_frac_low`` / ``clip_frac_high`` / ``clip_frac`` (action tokens whose clipped
    branch is active), ``seq_ratio_abs_dev_mean`` (mean ``|s_i - 1|``) and
    ``rho_abs_dev_mean`` (token level, for comparison with the other losses).
    """
    if check:
        require_positive("eps_low", eps_low, allow_zero=True)
        require_positive("eps_high", eps_high, allow_zero=True)
    am, weights, log_ratio, adv = _prepare(
        logp, behavior_logp, advantages, action_mask, check, trajectory_index
    )
    with torch.no_grad():
        sums, counts = log_ratio.sum(dim=1), am.row_counts(log_ratio.dtype)
        if trajectory_index is not None:  # s_i over every row of trajectory i
            k = int(trajectory_index.max()) + 1
            sums = per_trajectory_sum(sums, trajectory_index, k)
            counts = per_trajectory_sum(counts, trajectory_index, k)
        seq_log_ratio = sums / counts
        seq_ratio = seq_log_ratio.clamp(-PPO_LOG_RATIO_LIMIT, PPO_LOG_RATIO_LIMIT).exp()
        row_ratio = seq_ratio if trajectory_index is None else seq_ratio[trajectory_index]
    own = (logp - logp.detach()) * weights  # value 0, gradient d log pi_t on action tokens
    token_ratio = row_ratio[:, None] * own.exp()  # value s_i, gradient s_i * d log pi_t
    clipped = token_ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.minimum(token_ratio * adv, clipped * adv)
    ones = torch.ones_like(row_ratio[:, None])
    loss = -_aggregate(per_token * weights, ones, am, "seq-mean-token-mean", trajectory_index)
    count = am.total(torch.float64)
    # the sequence ratio is 1 nowhere in particular: restrict the per-token test to actions
    seq = torch.where(am.mask, row_ratio[:, None], 1.0)
    low_frac, high_frac = _active_clip_fractions(seq, adv, eps_low, eps_high, count)
    metrics = {
        "clip_frac_low": low_frac,
        "clip_frac_high": high_frac,
        "clip_frac": low_frac + high_frac,
        "seq_ratio_abs_dev_mean": (seq_ratio - 1).abs().mean().to(torch.float64),
        "rho_abs_dev_mean": _abs_dev_mean(_clipped_exp(log_ratio.detach()), count),
    }
    return loss, metrics
