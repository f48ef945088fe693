"""Skip-observation GAE (Eq. 6-7) on the action subsequence, fully vectorised.

Two steps, each a handful of whole-batch tensor operations:

1. **Compaction.** The action tokens of every row are gathered, in order, into a dense
   ``[N, M_max]`` tensor (slot ``j`` of row ``i`` holds ``u_j``); slots past ``M_i`` hold 0.
   The gather is a ``scatter_add`` keyed by the running action count (see :class:`Compaction`).
   On this layout "the next action token" is simply the next slot, so observation tokens are
   skipped by construction and the zero padding provides the zero bootstrap after ``u_M``.
2. **Blocked reverse scan.** ``A_j = delta_j + c_i A_{j+1}`` with ``c_i = gamma * lambda_i`` is a
   first-order linear recurrence. The compact axis is cut into blocks of ``B`` slots; inside a
   block the recurrence is one batched matrix product with the ``[B, B]`` matrix
   ``W[j, k] = c^(k - j)`` (``k >= j``); the values at block starts obey the same recurrence with
   factor ``c^B`` and are solved recursively. Work is ``O(N * M_max * B)``, memory
   ``O(N * M_max + N * B^2)``, no Python loop over rows or tokens, and only non-negative powers
   of ``c <= 1`` appear (no division by ``c``, so ``lambda = 0`` and long rows are exact and
   stable).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from trainer.algorithms.masks import ActionMask
from trainer.algorithms.validation import (
    any_true,
    require_floating,
    require_ndim,
    require_same_device,
    require_same_shape,
    require_unit_interval,
)

SCAN_BLOCK = 16
"""Slots per block of the reverse scan (work per token grows linearly with it)."""

SINGLE_BLOCK_LIMIT = 128
"""Sequences up to this length are scanned as a single block (no further recursion)."""


@dataclass(frozen=True)
class Compaction:
    """Maps between the padded ``[N, T]`` layout and a compact ``[N, width]`` layout.

    ``index[i, t]`` is the number of action tokens of row ``i`` at or before ``t``: the slot of
    the most recent action (action ``u_j`` sits in slot ``j``, 1-based); slot 0 collects the
    positions before the first action. Every position therefore maps to a valid slot, and
    non-action positions carry weight 0: gathering is one ``scatter_add`` of ``x * weights``
    (observations add exact zeros), scattering back one ``gather`` times ``weights``. No boolean
    indexing, no ``nonzero``. Slot 0 and the slots past a row's ``M_i`` hold 0 after gathering;
    whatever a scan leaves in slot 0 is never read back (weight 0). ``width`` is
    ``1 + M_max`` rounded up to a whole number of scan blocks.
    """

    index: Tensor  # [N, T] long
    weights: Tensor  # [N, T] in the data dtype, 1 on action tokens
    width: int

    @classmethod
    def of(cls, am: ActionMask, dtype: torch.dtype, block: int = SCAN_BLOCK) -> Compaction:
        """Build the maps of a validated action mask."""
        # running action count; an int32 cumsum over a uint8 view is the cheap way on the CPU
        counts = am.mask.view(torch.uint8).cumsum(dim=1, dtype=torch.int32)
        longest = int(counts[:, -1].max()) if counts.numel() else 0
        width = -(-(longest + 1) // block) * block
        return cls(index=counts.long(), weights=am.weights(dtype), width=width)

    def gather(self, x: Tensor, *, zero_outside: bool = False) -> Tensor:
        """``[N, T]`` -> ``[N, width]``: action entries in slots ``1..M_i``, zeros elsewhere.

        ``zero_outside=True`` promises that ``x`` is already 0 off the action tokens (skips the
        multiplication by the mask).
        """
        out = x.new_zeros(x.shape[0], self.width)
        return self.add_into(out, x, zero_outside=zero_outside)

    def add_into(self, out: Tensor, x: Tensor, *, zero_outside: bool = False) -> Tensor:
        """Add the action entries of ``[N, T]`` ``x`` into their slots of ``out`` (in place)."""
        return out.scatter_add_(1, self.index, x if zero_outside else x * self.weights)

    def scatter(self, y: Tensor) -> Tensor:
        """``[N, width]`` -> ``[N, T]``: slot values back at the action positions, 0 elsewhere."""
        return y.gather(1, self.index) * self.weights


def reverse_discounted_cumsum(x: Tensor, c: Tensor, block: int = SCAN_BLOCK) -> Tensor:
    """Solve ``y_j = x_j + c_i * y_{j+1}`` along dim 1 with ``y_L = 0``, for ``c_i in [0, 1]``.

    ``x`` is ``[N, L]`` and ``c`` is ``[N]``; equivalently
    ``y_j = sum_{k >= j} c^(k - j) x_k``. See the module docstring for the blocked algorithm.
    """
    n, length = x.shape
    if length == 0:
        return x.clone()
    # short sequences (the upper levels) are solved as one block: fewer, larger products
    block = length if length <= SINGLE_BLOCK_LIMIT else max(1, block)
    nblocks = -(-length // block)
    padded = nblocks * block
    xb = (F.pad(x, (0, padded - length)) if padded != length else x).reshape(n, nblocks, block)
    exponents = torch.arange(block + 1, device=x.device, dtype=x.dtype)
    powers = c[:, None].to(x.dtype) ** exponents  # [N, B + 1]: c^0 .. c^B; 0 ** 0 == 1
    # Toeplitz W[j, k] = c^(k - j) for k >= j, else 0: windows of [0 ... 0, c^0 ... c^(B-1)]
    ramp = F.pad(powers[:, :block], (block - 1, 0))  # [N, 2B - 1]
    weights = ramp.unfold(1, block, 1).flip(1)  # [N, B, B]
    # contiguous operands: a strided batch makes CPU bmm fall back to one matmul per row
    inner = torch.bmm(xb.contiguous(), weights.transpose(1, 2).contiguous())
    if nblocks > 1:
        # y at each block start follows the same recurrence, one level up, with factor c^B
        starts = reverse_discounted_cumsum(inner[:, :, 0], powers[:, block], block)
        carry = F.pad(starts[:, 1:], (0, 1))  # y at the next block's start (0 after the last)
        tail = powers[:, 1:].flip(1)  # c^(B - j) for local slot j
        inner.addcmul_(tail[:, None, :], carry[:, :, None])
    y = inner.view(n, padded)
    return y if padded == length else y[:, :length]


def _trace_factor(lam: float | Tensor, n: int, like: Tensor, check: bool) -> Tensor:
    """``lambda`` as an ``[N]`` tensor of ``like``'s dtype and device."""
    if isinstance(lam, Tensor):
        if check:
            require_floating("lam", lam)
            require_ndim("lam", lam, 1, "[N] (one trace per trajectory)")
            if lam.shape[0] != n:
                raise ValueError(f"shape mismatch: lam has {lam.shape[0]} entries, expected {n}")
            require_same_device(lam=lam, values=like)
            if bool(((lam < 0) | (lam > 1)).any()):
                raise ValueError("lam must lie in [0, 1]")
        return lam.detach().to(like.dtype)
    if check:
        require_unit_interval("lam", lam)
    return like.new_full((n,), float(lam))


def _checked_inputs(rewards: Tensor, values: Tensor | None, am: ActionMask, gamma: float) -> None:
    """Validate outcome (``[N]``) or per-token rewards, values and gamma against the mask."""
    require_floating("rewards", rewards)
    require_unit_interval("gamma", gamma)
    named = {"action_mask": am.mask, "rewards": rewards}
    if values is not None:
        require_floating("values", values)
        require_ndim("values", values, 2, "[N, T]")
        require_same_shape(values=values, action_mask=am.mask)
        named["values"] = values
    require_same_device(**named)
    if rewards.ndim == 1:
        if rewards.shape[0] != am.shape[0]:
            raise ValueError(
                f"shape mismatch: rewards has {rewards.shape[0]} entries, "
                f"action_mask has {am.shape[0]} rows"
            )
    else:
        require_ndim("rewards", rewards, 2, "[N, T] per-token rewards or [N] outcomes")
        require_same_shape(rewards=rewards, action_mask=am.mask)
        if any_true(rewards.ne(0) > am.mask):  # nonzero and not an action (bool a > b)
            raise ValueError("rewards must be 0 outside action tokens")


def skip_observation_gae(
    rewards: Tensor,
    values: Tensor,
    action_mask: Tensor | ActionMask,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
    *,
    check: bool = True,
) -> tuple[Tensor, Tensor]:
    """Skip-observation GAE on the action subsequence ``u_1 < ... < u_M`` of every row.

    Args:
        rewards: ``[N, T]`` per-token rewards ``r_t`` (0 outside action tokens), or ``[N]``
            outcome rewards, which mean ``r_{u_M} = R`` and 0 elsewhere (the paper's layout).
        values: ``[N, T]`` critic values ``V(s_t)``; only action positions are read.
        action_mask: ``[N, T]`` 1 on model-generated tokens (every row needs one), or an
            :class:`~trainer.algorithms.masks.ActionMask`.
        gamma: discount in ``[0, 1]``.
        lam: trace in ``[0, 1]``, a float or a per-row ``[N]`` tensor.

    Returns:
        ``(advantages, returns)``, both ``[N, T]``, 0 outside action tokens, with
        ``returns = advantages + values`` on action tokens. No gradient flows through them.
    """
    am = ActionMask.of(action_mask, check=check)
    if check:
        _checked_inputs(rewards, values, am, gamma)
    dtype = torch.promote_types(rewards.dtype, values.dtype)
    compact = Compaction.of(am, dtype)
    masked_values = values.detach().to(dtype) * compact.weights
    v = compact.gather(masked_values, zero_outside=True)
    delta = _td_residuals(compact, rewards.detach().to(dtype), v, gamma, check)
    lam_t = _trace_factor(lam, am.shape[0], v, check)
    adv = compact.scatter(reverse_discounted_cumsum(delta, gamma * lam_t))  # Eq. 7
    return adv, adv + masked_values  # G_t = A_t + V(s_t) on action tokens


def discounted_returns(
    rewards: Tensor,
    action_mask: Tensor | ActionMask,
    gamma: float = 1.0,
    *,
    check: bool = True,
) -> Tensor:
    """Critic targets with ``lambda = 1``: ``G_t = A_t(lambda=1) + V(s_t)`` (LI2SAO_SPEC).

    With ``lambda = 1`` the value terms of Eq. 6-7 telescope (appendix A.2, Eq. 36), so ``G_t``
    is the discounted reward-to-go along the action subsequence,
    ``G_{u_j} = sum_{k >= j} gamma^(k - j) r_{u_k}``, whatever the rewards are: this equals
    ``skip_observation_gae(rewards, values, mask, gamma, 1.0)[1]`` for any ``values`` (tested),
    without reading them and without the rounding of the cancelling value terms. For an outcome
    reward (``[N]``) it is ``R * gamma^(actions after t)``, i.e. ``R`` on every action token when
    ``gamma = 1``. Returns ``[N, T]``, 0 outside action tokens.
    """
    am = ActionMask.of(action_mask, check=check)
    if check:
        _checked_inputs(rewards, None, am, gamma)
    rewards = rewards.detach()
    weights = am.weights(rewards.dtype)
    if rewards.ndim == 1:
        if gamma == 1.0:
            return rewards[:, None] * weights
        counts = am.mask.view(torch.uint8).cumsum(dim=1, dtype=torch.int32)
        later = (counts[:, -1:] - counts).to(rewards.dtype)  # action tokens after t
        return rewards[:, None] * torch.pow(gamma, later) * weights
    if not check:
        rewards = rewards * weights
    if gamma == 1.0:
        # reverse cumulative sum along T; observation rewards are 0, so this is the
        # reward-to-go over the action subsequence
        return rewards.flip(1).cumsum(dim=1).flip(1) * weights
    compact = Compaction.of(am, rewards.dtype)
    factor = rewards.new_full((am.shape[0],), gamma)
    return compact.scatter(reverse_discounted_cumsum(compact.gather(rewards), factor))


def gae_advantages_and_returns(
    rewards: Tensor,
    values: Tensor,
    action_mask: Tensor | ActionMask,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
    *,
    check: bool = True,
) -> tuple[Tensor, Tensor]:
    """Actor advantages with trace ``lam`` and critic returns with ``lambda = 1``.

    ``(skip_observation_gae(..., lam=lam)[0], discounted_returns(...))``: the actor uses the
    (adaptive) trace, the critic the ``lambda = 1`` target (LI2SAO_SPEC).
    """
    am = ActionMask.of(action_mask, check=check)
    adv, _ = skip_observation_gae(rewards, values, am, gamma, lam, check=check)
    return adv, discounted_returns(rewards, am, gamma, check=False)


def _td_residuals(
    compact: Compaction, rewards: Tensor, v: Tensor, gamma: float, checked: bool
) -> Tensor:
    """Eq. 6 on the compact layout: ``r_j + gamma * V_{j+1} - V_j`` with ``V_{M+1} = 0``.

    Slots past a row's last action hold ``V = 0``, which is the zero bootstrap at ``u_M``.
    """
    # Eq. 6 (LI2SAO_SPEC "Skip-observation GAE"): delta_j = gamma * V_{j+1} - V_j (+ r_j below)
    delta = torch.empty_like(v)
    if gamma == 1.0:
        torch.sub(v[:, 1:], v[:, :-1], out=delta[:, :-1])
    else:
        torch.mul(v[:, 1:], gamma, out=delta[:, :-1]).sub_(v[:, :-1])
    torch.neg(v[:, -1], out=delta[:, -1])
    if rewards.ndim == 1:  # outcome reward: r = R at the last action, slot M_i
        return delta.scatter_add_(1, compact.index[:, -1:], rewards[:, None])
    # checked rewards are known to be 0 off the action tokens; unchecked ones get masked
    return compact.add_into(delta, rewards, zero_outside=checked)
