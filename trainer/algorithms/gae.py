"""Skip-observation GAE (Eq. 6-7) on the action subsequence, fully vectorised.

On the action subsequence ``u_1 < ... < u_M`` of a row (slot ``j`` holds ``u_j``), with
``c = gamma * lambda`` and ``S(j) = sum_{k >= j} c^(k - j) V_k``, the TD residuals of Eq. 6
telescope inside Eq. 7::

    A_j = sum_{k >= j} c^(k - j) (r_k + gamma V_{j+1} - V_k)
        = Z_j - V_j,    Z_j = sum_{k >= j} c^(k - j) x_k,    x_k = r_k + gamma (1 - lambda) V_{k+1}

(``gamma S(j+1) - S(j) = (gamma - c) S(j+1) - V_j``). ``Z`` is the critic return
``G_j = A_j + V_j`` itself, so the code computes ``G = Z`` with one reverse scan and
``A = G - V``; no TD-residual tensor is ever built. Two steps, each a handful of whole-batch
tensor operations:

1. **Compaction.** The action tokens of every row are gathered, in order, into a dense
   ``[rows, width]`` tensor (slot ``j`` of row ``i`` holds ``u_j``); slots past ``M_i`` hold 0.
   The gather is one plain ``scatter_`` keyed by ``slot = running action count`` on action
   tokens and ``slot = 0`` (a scratch slot, never read back) elsewhere, so neither side is
   multiplied by the mask (see :class:`Compaction`). On this layout "the next action token" is
   simply the next slot (``V_{j+1}`` is the compact values shifted by one), so observation
   tokens are skipped by construction and the zero padding provides ``V_{M+1} = 0``. Rows are
   processed in chunks of :data:`ROW_CHUNK` so that the int64 slot index and the compact
   tensors of a chunk stay cache-sized.
2. **Blocked reverse scan.** ``Z_j = x_j + c_i Z_{j+1}`` is a first-order linear recurrence.
   The compact axis is cut into blocks of ``B`` slots; inside a block the recurrence is one
   batched matrix product with the ``[B, B]`` matrix ``W[j, k] = c^(k - j)`` (``k >= j``); the
   values at block starts obey the same recurrence with factor ``c^B`` and are solved
   recursively. Work is ``O(N * M_max * B)``, memory ``O(N * M_max + N * B^2)``, no Python loop
   over tokens (only over row chunks), and only non-negative powers of ``c <= 1`` appear (no
   division by ``c`` or ``lambda``, so ``lambda = 0`` and long rows are exact and stable).

With ``lambda = 1`` (a float) neither step is needed: ``x_k = r_k`` and ``G`` is the
discounted reward-to-go of :func:`discounted_returns` (appendix A.2, Eq. 36; for an outcome
reward and ``gamma = 1``, ``G = R`` and ``A_t = R - V(s_t)``; for per-token rewards and
``gamma = 1``, a reverse cumulative sum).
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
    require_rewards_per_row,
    require_same_device,
    require_same_shape,
    require_unit_interval,
)

SCAN_BLOCK = 16
"""Slots per block of the reverse scan (work per token grows linearly with it)."""

ROW_CHUNK = 64
"""Rows per chunk of :func:`skip_observation_gae` (keeps the working set in cache)."""

SINGLE_BLOCK_LIMIT = 128
"""Sequences up to this length are scanned as a single block (no further recursion)."""


@dataclass(frozen=True)
class Compaction:
    """Maps between the padded ``[N, T]`` layout and a compact ``[N, width]`` layout.

    ``index[i, t]`` is the slot of position ``t``: ``j`` for the ``j``-th action token ``u_j``
    (1-based), and 0 for every observation and padding position. Slot 0 is a scratch slot: it
    receives the non-action entries and nothing ever reads it back. Gathering is therefore one
    plain ``scatter_`` of the raw ``[N, T]`` tensor (every action slot has exactly one source,
    so no accumulation and no multiplication by the mask is needed, and observation entries,
    whatever they hold, land in slot 0), and scattering back is one ``gather`` after slot 0 is
    zeroed (observations read that 0). No boolean indexing, no ``nonzero``. Slots past a row's
    ``M_i`` are never written and hold 0. ``last_slot`` ``[N, 1]`` is ``M_i`` (the slot of
    ``u_M``). ``width`` is ``1 + M_max`` rounded up to a whole number of scan blocks.
    """

    index: Tensor  # [N, T] long
    last_slot: Tensor  # [N, 1] long
    width: int

    @classmethod
    def of(cls, mask: Tensor, block: int = SCAN_BLOCK) -> Compaction:
        """Build the maps of a validated bool ``[N, T]`` action mask."""
        # running action count; an int32 cumsum over a uint8 view is the cheap way on the CPU
        # (an int64 cumsum, or arithmetic mixing int64 and uint8, is several times slower)
        counts = mask.view(torch.uint8).cumsum(dim=1, dtype=torch.int32)
        last_slot = counts[:, -1:].long()
        longest = int(last_slot.max()) if last_slot.numel() else 0
        width = -(-(longest + 1) // block) * block
        index = torch.where(mask, counts, 0).long()  # int32 where: cheaper than fill
        return cls(index=index, last_slot=last_slot, width=width)

    def gather(self, x: Tensor, extra: int = 0) -> Tensor:
        """``[N, T]`` -> ``[N, width + extra]``: action entries in slots ``1..M_i``, 0 after.

        Slot 0 holds an arbitrary non-action entry of ``x`` (scratch; never read back).
        """
        return x.new_zeros(x.shape[0], self.width + extra).scatter_(1, self.index, x)

    def scatter(self, y: Tensor, out: Tensor | None = None) -> Tensor:
        """``[N, width]`` -> ``[N, T]``: slot values at the action positions, 0 elsewhere.

        Zeroes ``y``'s scratch slot 0 in place (observations read it). ``out``: an optional
        contiguous ``[N, T]`` tensor to write into.
        """
        y[:, 0] = 0
        return torch.gather(y, 1, self.index, out=out)


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


def check_gae_inputs(rewards: Tensor, values: Tensor | None, am: ActionMask, gamma: float) -> None:
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
        require_rewards_per_row(rewards, am.shape[0])
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
        ``returns = advantages + values`` on action tokens (to one rounding: the returns are
        computed directly and ``advantages = returns - values``). No gradient flows through them.
    """
    am = ActionMask.of(action_mask, check=check)
    if check:
        check_gae_inputs(rewards, values, am, gamma)
    dtype = torch.promote_types(rewards.dtype, values.dtype)
    rewards = rewards.detach().to(dtype)
    values = values.detach().to(dtype)
    lam_t = _trace_factor(lam, am.shape[0], values, check)
    if not isinstance(lam, Tensor) and float(lam) == 1.0:
        # lambda = 1: the value terms telescope (appendix A.2, Eq. 36), A_t = G_t - V(s_t)
        masked_values = values * am.weights(dtype)
        returns = discounted_returns(rewards, am, gamma, check=False)
        adv = returns.sub_(masked_values)
        return adv, adv + masked_values
    returns = torch.empty_like(values)
    factor = gamma * lam_t  # c_i
    next_weight = factor.neg().add_(gamma)  # gamma (1 - lambda_i), the weight of V_{j+1} in x
    outcome = rewards.ndim == 1
    # row chunks keep each chunk's index and compact tensors cache-sized (and their width
    # fitted to the chunk's longest row); every chunk writes its rows of the output in place
    for start in range(0, am.shape[0], ROW_CHUNK):
        rows = slice(start, start + ROW_CHUNK)
        compact = Compaction.of(am.mask[rows])
        v_next = compact.gather(values[rows], extra=1)[:, 1:]  # slot j holds V_{j+1}
        weight = next_weight[rows, None]
        if outcome:  # r = R on u_M only: x = gamma (1 - lambda) V_{j+1}, plus R at slot M
            x = v_next * weight
            x.scatter_add_(1, compact.last_slot, rewards[rows, None])
        else:
            x = compact.gather(rewards[rows]).addcmul_(v_next, weight)
        compact.scatter(reverse_discounted_cumsum(x, factor[rows]), out=returns[rows])  # G = Z
    # Eq. 7 via the telescoped form: A_t = G_t - V(s_t) on action tokens, 0 elsewhere
    return torch.addcmul(returns, values, am.weights(dtype), value=-1.0), returns


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
        check_gae_inputs(rewards, None, am, gamma)
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
    compact = Compaction.of(am.mask)
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
