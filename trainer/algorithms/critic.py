"""Critic objectives: group-residual targets, clipped value loss (Eq. 10 / 5), ranking (Eq. 11),
and the BCE (+ MSE) loss of a sigmoid value head (PACT / SR-PPO).

The divergence mask that selects the supervised tokens of the bootstrap phase lives in
:mod:`.divergence`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from trainer.algorithms.groups import (
    cross_outcome_pairs,
    group_all_equal,
    group_index,
    group_mean,
    group_sum,
)
from trainer.algorithms.masks import ActionMask
from trainer.algorithms.trajectories import require_dense_trajectory_index
from trainer.algorithms.validation import (
    action_mask_bool,
    require_floating,
    require_group_ids,
    require_ndim,
    require_positive,
    require_rewards,
    require_same_device,
    require_same_shape,
)


def group_residual_targets(
    returns: Tensor,
    rewards: Tensor,
    group_ids: Tensor,
    action_mask: Tensor | ActionMask | None = None,
    *,
    trajectory_index: Tensor | None = None,
    check: bool = True,
) -> tuple[Tensor, Tensor]:
    """Centred critic targets ``G~_{i,t} = G_{i,t} - mu_g`` (section 4.1) and the group filter.

    Args:
        returns: ``[N, T]`` returns ``G`` (lambda = 1 targets).
        rewards: ``[N]`` outcome rewards; ``mu_g`` is their group mean.
        group_ids: ``[N]`` group ids.
        action_mask: optional ``[N, T]``; when given, targets are 0 outside action tokens.
        trajectory_index: optional ``[N]`` dense trajectory index (``0..K-1``) of each row:
            ``mu_g`` is then the mean over the group's trajectories, each counted once however
            many rows (segments) it has. None: every row is a trajectory.

    Returns:
        ``(targets, keep)``: ``targets`` ``[N, T]`` (no gradient); ``keep`` ``[N]`` bool, False
        for every member of a group whose rewards are all equal (dropped from the critic loss).
    """
    if check:
        require_floating("returns", returns)
        require_ndim("returns", returns, 2, "[N, T]")
        require_rewards(rewards)
        if returns.shape[0] != rewards.shape[0]:
            raise ValueError(
                f"shape mismatch: returns{tuple(returns.shape)} vs rewards{tuple(rewards.shape)}"
            )
        require_group_ids(group_ids, rewards.shape[0])
        require_same_device(returns=returns, rewards=rewards, group_ids=group_ids)
        if isinstance(action_mask, Tensor):
            require_same_shape(returns=returns, action_mask=action_mask)
            action_mask = action_mask_bool(action_mask, require_action_per_row=False)
        if trajectory_index is not None:
            require_dense_trajectory_index(trajectory_index, rewards)
    index = group_index(group_ids)
    rewards = rewards.detach()
    if trajectory_index is None:
        mu = group_mean(rewards, index)[index.inverse]
    else:  # one weight per trajectory, on its first row
        first = torch.zeros_like(rewards).index_fill_(0, _first_rows(trajectory_index), 1.0)
        mu = (group_sum(rewards * first, index) / group_sum(first, index))[index.inverse]
    targets = returns.detach() - mu[:, None].to(returns.dtype)  # section 4.1: G~ = G - mu_g
    if action_mask is not None:
        am = ActionMask.of(action_mask, check=False)
        targets = targets * am.weights(targets.dtype)
    keep = ~group_all_equal(rewards, index)[index.inverse]
    return targets, keep


def _first_rows(trajectory_index: Tensor) -> Tensor:
    """``[K]`` the first row of each trajectory of a dense ``[N]`` trajectory index."""
    n = trajectory_index.shape[0]
    rows = torch.arange(n, device=trajectory_index.device)
    first = torch.full((int(trajectory_index.max()) + 1,), n, device=rows.device)
    return first.scatter_reduce(0, trajectory_index, rows, reduce="amin")


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    targets: Tensor,
    mask: Tensor | ActionMask,
    eps_v: float = 0.2,
    *,
    check: bool = True,
) -> Tensor:
    """Clipped value loss (Eq. 10; Eq. 5 after the switch with absolute returns).

    ``V_bar = V_old + clip(V - V_old, -eps_v, eps_v)``,
    ``L = sum c * max((V - G)^2, (V_bar - G)^2) / sum c``. ``old_values`` is the critic frozen
    once per batch before the critic passes; gradient flows only through ``values``. An empty
    mask gives a zero loss that still carries the graph (so ``backward`` works on every rank).
    """
    if check:
        for name, tensor in (("values", values), ("old_values", old_values), ("targets", targets)):
            require_floating(name, tensor)
        require_ndim("values", values, 2, "[N, T]")
        require_same_shape(values=values, old_values=old_values, targets=targets)
        require_same_device(values=values, old_values=old_values, targets=targets)
        require_positive("eps_v", eps_v, allow_zero=True)
        if isinstance(mask, Tensor):
            require_same_shape(values=values, mask=mask)
            require_same_device(values=values, mask=mask)
            mask = action_mask_bool(mask, require_action_per_row=False)
    weights = _mask_weights(mask, values)
    old = old_values.detach()
    target = targets.detach()
    v_clip = old + (values - old).clamp(-eps_v, eps_v)  # Eq. 10: V_bar
    per_token = torch.maximum(
        F.mse_loss(values, target, reduction="none"), F.mse_loss(v_clip, target, reduction="none")
    )
    # one fused pass for the masked sum
    return torch.dot(per_token.reshape(-1), weights.reshape(-1)) / weights.sum().clamp(min=1.0)


def _mask_weights(mask: Tensor | ActionMask, like: Tensor) -> Tensor:
    """0/1 weights of a validated mask (or an ActionMask) in ``like``'s dtype."""
    if isinstance(mask, ActionMask):
        return mask.weights(like.dtype)
    return mask.bool().view(torch.uint8).to(like.dtype)


def bce_value_loss(
    value_logits: Tensor,
    targets: Tensor,
    mask: Tensor | ActionMask,
    bce_coef: float = 1.0,
    mse_coef: float = 0.0,
    *,
    check: bool = True,
) -> Tensor:
    """Sigmoid value head loss on logits ``z``: BCE with soft targets, plus an optional MSE.

    ``L = sum_t m_t [a (softplus(z_t) - y_t z_t) + b (sigmoid(z_t) - y_t)^2] / max(1, sum m_t)``
    with ``a = bce_coef``, ``b = mse_coef`` (PACT_SRPPO_SPEC "Critic": PACT sec. 4.2 / App. C.6
    uses ``a = 1, b = 0``; SR-PPO sec. 4.3 ``a = b = 1``). ``softplus(z) - y z`` equals
    ``-y log V - (1 - y) log(1 - V)`` for ``y in [0, 1]``, and its gradient
    ``sigmoid(z) - y`` makes ``E[y | s]`` the minimiser for any target, also ``y > 1`` (an
    importance-weighted PACT target), where the loss value may be negative. Targets are
    constants; gradient flows only into ``value_logits``. Entries off the mask add exactly 0
    to the loss and its gradient. An empty mask gives 0 with the graph attached.
    """
    if check:
        require_floating("value_logits", value_logits)
        require_floating("targets", targets)
        require_ndim("value_logits", value_logits, 2, "[N, T]")
        require_same_shape(value_logits=value_logits, targets=targets)
        require_same_device(value_logits=value_logits, targets=targets)
        require_positive("bce_coef", bce_coef, allow_zero=True)
        require_positive("mse_coef", mse_coef, allow_zero=True)
        if bce_coef == 0 and mse_coef == 0:
            raise ValueError("bce_coef and mse_coef are both 0: the loss would be identically 0")
        if isinstance(mask, Tensor):
            require_same_shape(value_logits=value_logits, mask=mask)
            require_same_device(value_logits=value_logits, mask=mask)
            mask = action_mask_bool(mask, require_action_per_row=False)
    z, y, weights = _flat_head_inputs(value_logits, targets, mask)
    total = _bce_sum(z, y, weights)
    if bce_coef != 1.0:
        total = total * bce_coef
    if mse_coef:
        total = total + mse_coef * _mse_sum(z, y, weights)  # SR-PPO sec. 4.3: a BCE + b MSE
    return total / weights.sum().clamp(min=1.0)


def value_loss_terms(
    value_logits: Tensor,
    targets: Tensor,
    mask: Tensor | ActionMask,
    probabilities: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The sums behind :func:`bce_value_loss` (inputs already validated).

    ``(sum m (softplus(z) - y z), sum m (sigmoid(z) - y)^2, max(1, sum m))``, the first two
    with the graph to ``value_logits``; SR-PPO's critic loss is
    ``(a * first + b * second) / third``, and it reports the two terms as the critic's BCE
    and MSE. ``probabilities``: ``sigmoid(value_logits)`` with its graph, when the caller
    has it already (an ``ObjectiveBatch``'s ``values``). ``targets``: ``[N, T]``, or ``[N]``
    for one target per row (SR-PPO's ``y = R``): the MSE gap broadcasts the row's target, and
    only the masked targets of the ``y z`` term are built.
    """
    if targets.ndim == 1:
        weights = _mask_weights(mask, value_logits)
        y = targets.detach()
        softplus = torch.logaddexp(value_logits, value_logits.new_zeros(()))
        weighted_y = (weights * y[:, None]).reshape(-1)  # a constant: one product backwards
        bce = torch.dot(softplus.reshape(-1), weights.reshape(-1)) - torch.dot(
            value_logits.reshape(-1), weighted_y
        )
        v = torch.sigmoid(value_logits) if probabilities is None else probabilities
        gap = (v - y[:, None]).mul_(weights)  # 0 off the mask
        mse = torch.dot(gap.reshape(-1), gap.reshape(-1))
        return bce, mse, weights.sum().clamp(min=1.0)
    z, y, weights = _flat_head_inputs(value_logits, targets, mask)
    v = None if probabilities is None else probabilities.reshape(-1)
    return _bce_sum(z, y, weights), _mse_sum(z, y, weights, v), weights.sum().clamp(min=1.0)


def _flat_head_inputs(
    value_logits: Tensor, targets: Tensor, mask: Tensor | ActionMask
) -> tuple[Tensor, Tensor, Tensor]:
    weights = _mask_weights(mask, value_logits).reshape(-1)
    return value_logits.reshape(-1), targets.detach().reshape(-1), weights


def _bce_sum(z: Tensor, y: Tensor, weights: Tensor) -> Tensor:
    """PACT App. C.6: ``sum_t m_t (softplus(z_t) - y_t z_t)`` as two masked dot products.

    The weighted targets are a constant, so the second product costs one product backwards.
    ``softplus(z) = logaddexp(z, 0)``: unlike ``F.softplus``'s linear branch above ``z = 20``
    it keeps the gradient ``sigmoid(z)`` exact. Off the mask the weights are 0 and every
    factor finite.
    """
    return torch.dot(torch.logaddexp(z, z.new_zeros(())), weights) - torch.dot(z, y * weights)


def _mse_sum(z: Tensor, y: Tensor, weights: Tensor, v: Tensor | None = None) -> Tensor:
    """SR-PPO sec. 4.3: ``sum_t m_t (sigmoid(z_t) - y_t)^2`` (``v``: ``sigmoid(z)`` if known)."""
    gap = (torch.sigmoid(z) if v is None else v) - y
    return torch.dot(gap * gap, weights)


def terminal_ranking_loss(
    terminal_values: Tensor,
    rewards: Tensor,
    group_ids: Tensor,
    margin: float = 0.1,
    *,
    check: bool = True,
) -> Tensor:
    """Terminal ranking loss ``mean_P relu(m - V(s_{i+,T}) + V(s_{i-,T}))`` (Eq. 11).

    ``P`` holds the ordered pairs of the same group with ``R_{i+} > R_{i-}``; 0 (with the graph
    attached) when there is no such pair.
    """
    if check:
        require_floating("terminal_values", terminal_values)
        require_ndim("terminal_values", terminal_values, 1, "[N]")
        require_rewards(rewards)
        require_same_shape(terminal_values=terminal_values, rewards=rewards)
        require_group_ids(group_ids, rewards.shape[0])
        require_same_device(terminal_values=terminal_values, rewards=rewards, group_ids=group_ids)
        require_positive("margin", margin, allow_zero=True)
    hi, lo = cross_outcome_pairs(rewards.detach(), group_index(group_ids))
    if hi.numel() == 0:
        return terminal_values.sum() * 0.0
    hinge = margin - terminal_values[hi] + terminal_values[lo]  # Eq. 11 (LI2SAO_SPEC)
    return torch.relu(hinge).mean()
