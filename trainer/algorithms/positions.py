"""Tensors that live on each row's first or last action token.

The spec's ``u_M`` (the "last action token") of a trajectory is where the outcome reward sits
(``r_{u_M} = R``) and where the terminal value ``V(s_{i, T_i})`` of the ranking loss and the
readiness statistics is read. The first action token ``u_1`` is where SR-PPO reads the
prompt-state value ``q^ = V(s_{u_1})`` (PACT_SRPPO_SPEC "Estimator").
"""

from __future__ import annotations

from torch import Tensor

from trainer.algorithms.masks import ActionMask
from trainer.algorithms.validation import (
    require_floating,
    require_ndim,
    require_rewards,
    require_rewards_per_row,
    require_same_device,
    require_same_shape,
)


def _checked_mask(values: Tensor, action_mask: Tensor | ActionMask, check: bool) -> ActionMask:
    """The action mask, and with ``check`` the ``[N, T]`` values validated against it."""
    am = ActionMask.of(action_mask, check=check)
    if check:
        require_floating("values", values)
        require_ndim("values", values, 2, "[N, T]")
        require_same_shape(values=values, action_mask=am.mask)
        require_same_device(values=values, action_mask=am.mask)
    return am


def terminal_values(
    values: Tensor, action_mask: Tensor | ActionMask, *, check: bool = True
) -> Tensor:
    """``[N]``: ``V(s_{i, u_M})``, the value at each row's last action token (differentiable)."""
    am = _checked_mask(values, action_mask, check)
    return values.gather(1, am.last[:, None]).squeeze(1)


def first_action_values(
    values: Tensor, action_mask: Tensor | ActionMask, *, check: bool = True
) -> Tensor:
    """``[N]``: ``V(s_{i, u_1})``, the value before each row's first action token.

    Leading observation tokens count as prompt (their values are not read). Differentiable.
    """
    am = _checked_mask(values, action_mask, check)
    return values.gather(1, am.first[:, None]).squeeze(1)


def terminal_reward_tokens(
    rewards: Tensor, action_mask: Tensor | ActionMask, *, check: bool = True
) -> Tensor:
    """``[N, T]`` per-token rewards: ``R_i`` at the last action token, 0 elsewhere.

    This is the reward layout of the paper (``r_t = 0`` except ``r_{u_M} = R``); the GAE
    functions also accept the ``[N]`` outcome rewards directly.
    """
    am = ActionMask.of(action_mask, check=check)
    if check:
        require_rewards(rewards)
        require_rewards_per_row(rewards, am.shape[0])
        require_same_device(rewards=rewards, action_mask=am.mask)
    out = rewards.new_zeros(am.shape)
    return out.scatter_(1, am.last[:, None], rewards.detach()[:, None])
