"""Prompt-group bookkeeping: per-group statistics and within-group pairs, all vectorised.

Group ids are arbitrary non-negative integers; :func:`group_index` maps them to dense indices
``0..G-1`` once, and every statistic is then a ``scatter``/``index_add`` over ``[N]``. Pairs of
trajectories of the same group are enumerated without any ``[N, N]`` tensor: rows are sorted by
group, and each row is paired with the rows after it inside its group (``sum n_g (n_g - 1) / 2``
pairs in total).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class GroupIndex:
    """Dense group indexing of a batch.

    Attributes:
        inverse: ``[N]`` long, the dense group index of each row (``0..G-1``, ordered by id).
        counts: ``[G]`` long, the number of rows of each group.
    """

    inverse: Tensor
    counts: Tensor

    @property
    def num_groups(self) -> int:
        return int(self.counts.shape[0])


def group_index(group_ids: Tensor) -> GroupIndex:
    """Map group ids to dense indices and count the members of each group."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return GroupIndex(inverse=inverse, counts=counts)


def group_sum(values: Tensor, index: GroupIndex) -> Tensor:
    """Per-group sum ``[G]`` of a per-row tensor ``[N]``."""
    out = values.new_zeros(index.num_groups)
    return out.index_add_(0, index.inverse, values)


def group_mean(values: Tensor, index: GroupIndex) -> Tensor:
    """Per-group mean ``[G]`` of a per-row tensor ``[N]``."""
    return group_sum(values, index) / index.counts.to(values.dtype)


def group_unbiased_std(values: Tensor, index: GroupIndex, mean: Tensor) -> Tensor:
    """Per-group unbiased (``n - 1``) standard deviation ``[G]``; 0 for a group of one.

    Computed in two passes (deviations from the given group mean) for accuracy.
    """
    dev = values - mean[index.inverse]
    ssq = group_sum(dev * dev, index)
    denom = (index.counts - 1).clamp(min=1).to(values.dtype)
    return (ssq / denom).sqrt()


def group_all_equal(values: Tensor, index: GroupIndex) -> Tensor:
    """``[G]`` bool: True where every member of the group has exactly the same value."""
    g = index.num_groups
    hi = values.new_full((g,), -torch.inf).scatter_reduce(
        0, index.inverse, values, reduce="amax", include_self=True
    )
    lo = values.new_full((g,), torch.inf).scatter_reduce(
        0, index.inverse, values, reduce="amin", include_self=True
    )
    return hi == lo


def within_group_pairs(index: GroupIndex) -> tuple[Tensor, Tensor]:
    """All unordered pairs ``(a, b)``, ``a != b``, of rows in the same group.

    Returns two ``[P]`` long tensors of row indices, ``P = sum_g n_g (n_g - 1) / 2``. No
    Python loop: rows are sorted by group, row ``r`` at position ``p`` of a group of size ``n``
    is paired with the ``n - 1 - p`` rows after it, expanded with ``repeat_interleave``.
    """
    device = index.inverse.device
    n = index.inverse.shape[0]
    order = torch.argsort(index.inverse, stable=True)
    starts = torch.cumsum(index.counts, 0) - index.counts
    size_of_row = index.counts.repeat_interleave(index.counts)
    start_of_row = starts.repeat_interleave(index.counts)
    position = torch.arange(n, device=device) - start_of_row
    partners = size_of_row - 1 - position
    first = torch.arange(n, device=device).repeat_interleave(partners)
    offsets = torch.cumsum(partners, 0) - partners
    step = torch.arange(first.shape[0], device=device) - offsets.repeat_interleave(partners) + 1
    return order[first], order[first + step]


def cross_outcome_pairs(rewards: Tensor, index: GroupIndex) -> tuple[Tensor, Tensor]:
    """Ordered pairs ``(i+, i-)`` of the same group with ``R_{i+} > R_{i-}`` (set ``P`` of Eq. 11).

    Returns ``(hi, lo)``, two ``[P]`` long tensors of row indices.
    """
    a, b = within_group_pairs(index)
    ra, rb = rewards[a], rewards[b]
    differ = ra != rb
    a, b, a_wins = a[differ], b[differ], (ra > rb)[differ]
    return torch.where(a_wins, a, b), torch.where(a_wins, b, a)
