"""Input checks shared by every algorithm function.

Every public function of ``trainer.algorithms`` validates its inputs with these helpers and
raises ``ValueError`` with a message that names the argument and the problem, so that a bad
batch fails loudly at the boundary instead of producing a silently wrong gradient. Callers that
validated a whole batch once (the objective layer) pass ``check=False`` to skip the repeats.

Each check costs one pass over the tensor (and one host synchronisation for the ``any``/``all``
reductions); that is cheap next to a forward pass of the model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def require_tensor(name: str, value: object) -> Tensor:
    """Return ``value`` if it is a tensor, else raise."""
    if not isinstance(value, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def require_ndim(name: str, tensor: Tensor, ndim: int, layout: str) -> None:
    """Require ``tensor.ndim == ndim``; ``layout`` describes the expected shape, e.g. ``[N, T]``."""
    if tensor.ndim != ndim:
        raise ValueError(
            f"{name} must be a {ndim}-D tensor {layout}, got shape {tuple(tensor.shape)}"
        )


def require_floating(name: str, tensor: Tensor) -> None:
    """Require a floating dtype and only finite entries (no NaN, no inf)."""
    require_tensor(name, tensor)
    if not tensor.is_floating_point():
        raise ValueError(f"{name} must have a floating dtype, got {tensor.dtype}")
    if tensor.numel():
        # min and max propagate NaN and expose +-inf: one pass, no temporary [N, T] tensor
        lo, hi = torch.aminmax(tensor.detach())
        if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
            raise ValueError(f"{name} contains NaN or inf")


def require_integer(name: str, tensor: Tensor) -> None:
    """Require an integer (non-bool) dtype."""
    require_tensor(name, tensor)
    if tensor.dtype == torch.bool or tensor.is_floating_point() or tensor.is_complex():
        raise ValueError(f"{name} must have an integer dtype, got {tensor.dtype}")


def require_same_shape(**named: Tensor) -> None:
    """Require every named tensor to have the same shape; the message lists all shapes."""
    shapes = {name: tuple(t.shape) for name, t in named.items()}
    if len(set(shapes.values())) > 1:
        listing = ", ".join(f"{name}{shape}" for name, shape in shapes.items())
        raise ValueError(f"shape mismatch: {listing}")


def require_same_device(**named: Tensor) -> None:
    """Require every named tensor to live on the same device."""
    devices = {name: t.device for name, t in named.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise ValueError(f"device mismatch: {listing}")


def require_rewards(rewards: Tensor) -> None:
    """Outcome rewards: a finite floating 1-D tensor ``[N]`` (one scalar per trajectory)."""
    require_tensor("rewards", rewards)
    require_ndim("rewards", rewards, 1, "[N] (one outcome reward per trajectory)")
    require_floating("rewards", rewards)


def require_rewards_in(rewards: Tensor, low: float, high: float, hint: str) -> None:
    """Require every reward in ``[low, high]``; the message counts and shows the offenders.

    Rewards outside the range are an error, never clamped (PACT_SRPPO_SPEC "Notation").
    """
    outside = (rewards < low) | (rewards > high)
    if any_true(outside):
        rows = outside.nonzero().flatten()
        first = int(rows[0])
        raise ValueError(
            f"rewards must lie in [{low}, {high}]: {rows.numel()} outside, e.g. "
            f"{float(rewards[first])!r} at row {first}; {hint}"
        )


def require_rewards_per_row(rewards: Tensor, rows: int, of: str = "action_mask") -> None:
    """One outcome reward per row: ``rewards.shape[0]`` equals ``of``'s ``rows``."""
    if rewards.shape[0] != rows:
        raise ValueError(
            f"shape mismatch: rewards has {rewards.shape[0]} entries, {of} has {rows} rows"
        )


def require_group_ids(group_ids: Tensor, n: int) -> None:
    """Group ids: a non-negative integer tensor ``[N]`` (same prompt = same id)."""
    require_integer("group_ids", group_ids)
    require_ndim("group_ids", group_ids, 1, "[N]")
    if group_ids.shape[0] != n:
        raise ValueError(
            f"shape mismatch: group_ids has {group_ids.shape[0]} entries, expected N={n}"
        )
    if any_true(group_ids < 0):
        raise ValueError("group_ids must be non-negative, found a negative group id")


def any_true(flags: Tensor) -> bool:
    """``bool(flags.any())`` for a bool tensor, via a uint8 view.

    torch's bool ``any``/``sum`` reductions are an order of magnitude slower on the CPU than a
    ``max`` over the same bytes viewed as ``uint8``; this runs on every validated batch.
    """
    return bool(flags.numel()) and bool(flags.view(torch.uint8).max())


def action_mask_bool(action_mask: Tensor, *, require_action_per_row: bool = True) -> Tensor:
    """Validate an ``[N, T]`` action mask and return it as a bool tensor.

    The mask may be bool, integer or floating but must hold only 0 and 1. With
    ``require_action_per_row`` every row must contain at least one action token (a trajectory
    without a model-generated token has no loss, no last action and no value target).
    """
    require_tensor("action_mask", action_mask)
    require_ndim("action_mask", action_mask, 2, "[N, T]")
    if action_mask.dtype == torch.bool:
        mask = action_mask
    else:
        if action_mask.is_complex():
            raise ValueError(f"action_mask must be bool or 0/1, got {action_mask.dtype}")
        if action_mask.numel() and any_true((action_mask != 0) & (action_mask != 1)):
            raise ValueError("action_mask must hold only 0 and 1")
        mask = action_mask != 0
    if require_action_per_row and mask.numel():
        per_row = mask.view(torch.uint8).amax(dim=1)
        if not bool(per_row.min()):
            rows = (per_row == 0).nonzero().flatten()[:5].tolist()
            raise ValueError(f"action_mask has a row with no action token (rows {rows})")
    elif require_action_per_row and mask.shape[0] and not mask.shape[1]:
        raise ValueError("action_mask has a row with no action token (T = 0)")
    return mask


def require_tokens(tokens: Tensor, mask: Tensor) -> None:
    """Token ids ``[N, T]``: ids >= 0 inside a trajectory, ``-1`` exactly on the padded tail.

    ``-1`` must not appear before a real token (padding is a suffix) and no action token may
    sit on padding.
    """
    require_integer("tokens", tokens)
    require_ndim("tokens", tokens, 2, "[N, T]")
    require_same_shape(tokens=tokens, action_mask=mask)
    if not tokens.numel():
        return
    if any_true(tokens < -1):
        raise ValueError("tokens must be >= 0, or -1 past a trajectory's end")
    pad = tokens == -1
    # padding is a suffix iff no position is padding while the next one is not
    if any_true(pad[:, :-1] > pad[:, 1:]):
        raise ValueError("tokens hold -1 before a trajectory's end (padding must be a suffix)")
    if any_true(pad & mask):
        raise ValueError("action_mask marks a padding position (tokens == -1) as an action")


def require_unit_interval(name: str, value: float) -> None:
    """Require a finite float in ``[0, 1]``."""
    if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


def require_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    """Require a finite positive (or non-negative) number."""
    ok = isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    bound = ">= 0" if allow_zero else "> 0"
    if not ok:
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
