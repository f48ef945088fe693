"""Policy lag of in-flight trajectories (LI2SAO_SPEC "Staleness").

A token sampled by policy version ``v_t`` is ``v_l - v_t`` versions behind the trainer's version
``v_l``. A trajectory's lag is that of its oldest action token (choice in the spec); trajectories
lagging more than ``max_policy_lag`` are dropped before the update and counted. A one-step lag
still counts as on-policy for the off-policy token ratio.

``token_versions`` is per token: a turn that a token-mode weight refresh interrupted carries two
versions (its version runs, services/protocol/trajectory.py), and the tokens before the switch
count with the older one, so such a trajectory's lag is that of its pre-switch tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trainer.algorithms.masks import ActionMask
from trainer.algorithms.validation import (
    any_true,
    require_integer,
    require_ndim,
    require_same_device,
    require_same_shape,
)


def _checked_inputs(
    trainer_version: int, token_versions: Tensor, action_mask: Tensor | ActionMask, check: bool
) -> Tensor:
    if not check:
        return ActionMask.of(action_mask, check=False).mask
    if not isinstance(trainer_version, int) or isinstance(trainer_version, bool):
        raise ValueError(f"trainer_version must be an int, got {trainer_version!r}")
    if trainer_version < 0:
        raise ValueError(f"trainer_version must be >= 0, got {trainer_version}")
    require_integer("token_versions", token_versions)
    require_ndim("token_versions", token_versions, 2, "[N, T]")
    mask = ActionMask.of(action_mask).mask
    require_same_shape(token_versions=token_versions, action_mask=mask)
    require_same_device(token_versions=token_versions, action_mask=mask)
    on_actions = token_versions[mask]
    if any_true(on_actions < 0):
        raise ValueError("token_versions must be >= 0 on action tokens")
    if any_true(on_actions > trainer_version):
        raise ValueError(
            f"token_versions exceed trainer_version={trainer_version} on action tokens "
            "(a token from a future policy)"
        )
    return mask


def policy_lag(
    trainer_version: int,
    token_versions: Tensor,
    action_mask: Tensor | ActionMask,
    *,
    check: bool = True,
) -> Tensor:
    """``[N]`` long: ``v_l - min_t v_t`` over each row's action tokens."""
    mask = _checked_inputs(trainer_version, token_versions, action_mask, check)
    big = torch.iinfo(torch.long).max
    oldest = torch.where(mask, token_versions.long(), big).amin(dim=1)
    return trainer_version - oldest


def off_policy_token_ratio(
    trainer_version: int,
    token_versions: Tensor,
    action_mask: Tensor | ActionMask,
    *,
    check: bool = True,
) -> Tensor:
    """0-dim float64: fraction of action tokens with ``v_l - v_t > 1``."""
    mask = _checked_inputs(trainer_version, token_versions, action_mask, check)
    stale = mask & (trainer_version - token_versions.long() > 1)
    return torch.count_nonzero(stale).to(torch.float64) / torch.count_nonzero(mask).to(
        torch.float64
    )


@dataclass(frozen=True)
class LagFilter:
    """Outcome of :func:`filter_by_lag`.

    Attributes:
        kept: ``[K]`` long, indices of the rows to train on (ascending).
        dropped: number of rows dropped for exceeding ``max_policy_lag``.
        lags: ``[N]`` long, the lag of every row (kept or not).
    """

    kept: Tensor
    dropped: int
    lags: Tensor


def filter_by_lag(
    trainer_version: int,
    token_versions: Tensor,
    action_mask: Tensor | ActionMask,
    max_policy_lag: int,
    *,
    check: bool = True,
) -> LagFilter:
    """Keep the rows whose lag is ``<= max_policy_lag``."""
    if not isinstance(max_policy_lag, int) or isinstance(max_policy_lag, bool):
        raise ValueError(f"max_policy_lag must be an int, got {max_policy_lag!r}")
    if max_policy_lag < 0:
        raise ValueError(f"max_policy_lag must be >= 0, got {max_policy_lag}")
    lags = policy_lag(trainer_version, token_versions, action_mask, check=check)
    keep = lags <= max_policy_lag
    kept = keep.nonzero().squeeze(1)
    return LagFilter(kept=kept, dropped=int(lags.shape[0] - kept.shape[0]), lags=lags)
