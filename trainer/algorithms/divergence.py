"""Divergence mask of the bootstrap critic (section 4.1), computed group-wise.

``d(i, j)`` is the first position (index into the post-prompt sequence) where trajectories ``i``
and ``j`` differ; padding is ``-1``, so a proper prefix differs at its own end.
``d_i = max_{j in g, R_j != R_i} d(i, j)`` and the critic mask is ``c_{i,t} = m_{i,t} [t >= d_i]``:
states before the divergence from every opposite-outcome sibling are not supervised, because a
residual target there depends on tokens the state has not generated yet. A row with no
opposite-outcome member in the batch keeps only its last action token.

Memory stays linear in ``N * T``: only the cross-outcome pairs of a group are compared (never
``[N, T, T]`` or ``[N, N, T]``), and at most ``PAIR_CHUNK_ELEMENTS`` token comparisons are
materialised at a time (a loop over chunks of pairs, not over rows or tokens).
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer.algorithms.groups import cross_outcome_pairs, group_index
from trainer.algorithms.masks import ActionMask, last_action_index
from trainer.algorithms.validation import (
    require_group_ids,
    require_rewards,
    require_rewards_per_row,
    require_same_device,
    require_tokens,
)

PAIR_CHUNK_ELEMENTS = 1 << 22
"""Upper bound on the ``[pairs, window]`` comparison block held in memory at once."""

FIRST_WINDOW = 256
"""Columns compared in the first round; each later round doubles the window."""


def first_difference(
    tokens: Tensor,
    a: Tensor,
    b: Tensor,
    chunk_elements: int = PAIR_CHUNK_ELEMENTS,
    first_window: int = FIRST_WINDOW,
) -> Tensor:
    """``[P]`` long: the first position where rows ``a[p]`` and ``b[p]`` of ``tokens`` differ.

    Identical rows (including their padding) give ``T``: they never diverge. Columns are
    compared in windows that double in width, and only the pairs still undecided enter the next
    window, so the work follows the actual shared-prefix lengths (typically short) instead of
    ``T``; the loops run over windows and chunks of pairs, never over rows or tokens.
    """
    width = tokens.shape[1]
    out = torch.full((a.shape[0],), width, dtype=torch.long, device=tokens.device)
    pending = torch.arange(a.shape[0], device=tokens.device)
    start, window = 0, max(1, first_window)
    while pending.numel() and start < width:
        stop = min(width, start + window)
        step = max(1, chunk_elements // (stop - start))
        for chunk in pending.split(step):  # chunks of pairs bound the memory
            differ = tokens[a[chunk], start:stop] != tokens[b[chunk], start:stop]
            # max over a uint8 view: (any difference, index of the first one) in one pass
            hit, first = differ.view(torch.uint8).max(dim=1)
            out[chunk] = torch.where(hit.bool(), first + start, width)
        pending = pending[out[pending] == width]
        start, window = stop, window * 2
    return out


def divergence_mask(
    tokens: Tensor,
    action_mask: Tensor | ActionMask,
    rewards: Tensor,
    group_ids: Tensor,
    *,
    check: bool = True,
) -> Tensor:
    """``[N, T]`` bool critic mask ``c`` of the bootstrap phase (section 4.1).

    Args:
        tokens: ``[N, T]`` integer post-prompt token ids, ``-1`` past each trajectory's end.
        action_mask: ``[N, T]`` 1 on model-generated tokens (every row needs one).
        rewards: ``[N]`` outcome rewards (any scalars; "opposite outcome" means ``R_j != R_i``).
        group_ids: ``[N]`` group ids.

    Choice (not in the paper): two trajectories with identical token sequences but different
    rewards never diverge, ``d(i, j) = T``, so such a row keeps no token (no state of it can
    tell the outcomes apart).
    """
    am = ActionMask.of(action_mask, check=check)
    if check:
        require_tokens(tokens, am.mask)
        require_rewards(rewards)
        require_rewards_per_row(rewards, tokens.shape[0], of="tokens")
        require_group_ids(group_ids, tokens.shape[0])
        require_same_device(
            tokens=tokens, action_mask=am.mask, rewards=rewards, group_ids=group_ids
        )
    mask = am.mask
    n, width = tokens.shape
    hi, lo = cross_outcome_pairs(rewards.detach(), group_index(group_ids))
    first = first_difference(tokens, hi, lo)  # d(i, j), symmetric
    d = torch.full((n,), -1, dtype=torch.long, device=tokens.device)
    d = d.scatter_reduce(0, hi, first, reduce="amax").scatter_reduce(0, lo, first, reduce="amax")
    # d_i = max over opposite-outcome j of d(i, j); c_{i,t} = 1 on action tokens with t >= d_i:
    # the mask with each row's prefix t < d_i cleared. Prefixes are short (members of a group
    # part early), so only the columns before the largest d_i are touched.
    positions = torch.arange(width, device=tokens.device)
    critic = mask.clone()
    prefix = int(d.max()) if n else 0
    if prefix > 0:
        critic[:, :prefix] &= positions[None, :prefix] >= d[:, None]
    alone = (d < 0).nonzero().squeeze(1)  # no opposite-outcome member in the batch
    if alone.numel():  # keep only the last action token of those rows
        last = last_action_index(mask[alone], check=False)
        critic[alone] = positions[None, :] == last[:, None]
    return critic
