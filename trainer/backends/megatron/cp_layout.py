"""Context parallel in the megatron backend: which part of every packed lane a CP rank holds.

Megatron's load-balanced layout: a lane is padded to a multiple of ``2 * cp`` columns and cut
into ``2 * cp`` equal chunks; CP rank ``r`` holds chunks ``r`` and ``2 * cp - 1 - r`` (an early
and a late one, so every rank has the same share of causal attention work). Everything here
is a pure function of the lane layout (no collectives): the columns a rank holds
(:func:`local_columns`), slicing a sequence dimension (:func:`slice_sequence`) and putting the
ranks' slices back in order (:func:`gather_sequence`), and a micro-batch's model inputs cut
for one rank (:func:`shard_inputs`): its columns of token and position ids, the attention
mask rows of its queries against every key, and which post-prompt tokens it scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from trainer.data import PackedInputs


def padded_width(width: int, cp: int) -> int:
    """``width`` rounded up to a multiple of ``2 * cp`` (the chunks are equal)."""
    if width < 1 or cp < 1:
        raise ValueError(f"width and cp must be >= 1, got width={width}, cp={cp}")
    step = 2 * cp
    return -(-width // step) * step


def _check(width: int, cp: int, rank: int) -> int:
    """The chunk length of a ``width`` lane split for ``cp`` ranks (``rank`` one of them)."""
    if not 0 <= rank < cp:
        raise ValueError(f"CP rank {rank} is not in 0..{cp - 1}")
    if width % (2 * cp):
        raise ValueError(f"width {width} is not a multiple of 2 * cp = {2 * cp}")
    return width // (2 * cp)


def local_columns(width: int, cp: int, rank: int, device: torch.device | str = "cpu") -> Tensor:
    """The columns (ascending) of a ``width`` lane that CP rank ``rank`` holds: chunks ``rank``
    and ``2 * cp - 1 - rank``."""
    chunk = _check(width, cp, rank)
    late = 2 * cp - 1 - rank
    return torch.cat(
        [
            torch.arange(rank * chunk, (rank + 1) * chunk, device=device),
            torch.arange(late * chunk, (late + 1) * chunk, device=device),
        ]
    )


def column_owner(columns: Tensor, width: int, cp: int) -> tuple[Tensor, Tensor]:
    """For each column of a ``width`` lane: the CP rank that holds it and its place in that
    rank's slice (:func:`local_columns` order)."""
    chunk = _check(width, cp, 0)
    index = torch.div(columns, chunk, rounding_mode="floor")
    early = index < cp
    owner = torch.where(early, index, 2 * cp - 1 - index)
    offset = torch.where(early, columns % chunk, chunk + columns % chunk)
    return owner, offset


def slice_sequence(x: Tensor, cp: int, rank: int, dim: int = 0) -> Tensor:
    """CP rank ``rank``'s slice of ``x`` along its sequence dimension ``dim``."""
    return x.index_select(dim, local_columns(x.shape[dim], cp, rank, x.device))


def gather_sequence(parts: Sequence[Tensor], dim: int = 0) -> Tensor:
    """The whole sequence from every CP rank's slice (``parts`` in rank order): the inverse of
    :func:`slice_sequence` over the ranks."""
    cp = len(parts)
    halves = [part.chunk(2, dim=dim) for part in parts]
    if any(len(h) != 2 or h[0].shape != h[1].shape for h in halves):
        raise ValueError("every CP slice holds two equal chunks")
    early = [h[0] for h in halves]
    late = [halves[r][1] for r in reversed(range(cp))]
    return torch.cat(early + late, dim=dim)


def packed_attention_mask(position_ids: Tensor, queries: Tensor | None = None) -> Tensor:
    """``[lanes, 1, q, w]`` bool, True where attention is masked: a token sees the earlier
    tokens of its own row (rows start where the position ids ``[lanes, w]`` restart at 0).
    ``queries``: the columns whose rows are wanted (all by default, ``q = w``)."""
    row = torch.cumsum((position_ids == 0).long(), dim=-1)  # [lanes, w]
    keys = torch.arange(position_ids.shape[-1], device=position_ids.device)
    rows = keys if queries is None else queries.to(keys.device)
    same = row[:, rows, None] == row[:, None, :]
    causal = rows[:, None] >= keys[None, :]
    return ~(same & causal)[:, None]


@dataclass(frozen=True)
class ShardedInputs:
    """One CP rank's part of a micro-batch's :class:`~trainer.data.PackedInputs`.

    ``input_ids`` and ``position_ids`` ``[lanes, w / cp]``: the rank's columns of the padded
    lanes; ``attention_mask`` ``[lanes, 1, w / cp, w]``: its queries' rows of the block-diagonal
    causal mask, keys in lane order (what the K/V all-gather yields); ``owned`` ``[rows, T]``:
    the post-prompt tokens whose predicting hidden state this rank holds (each token on
    exactly one rank); ``index`` ``[m]``: for those (row-major), the flat index ``lane * (w /
    cp) + local column`` of that hidden state."""

    input_ids: Tensor
    position_ids: Tensor
    attention_mask: Tensor
    owned: Tensor
    index: Tensor


def pad_lanes(inputs: PackedInputs, cp: int) -> tuple[Tensor, Tensor]:
    """Token and position ids widened to :func:`padded_width`: the new tail continues the
    lane's last positions (as :func:`trainer.data.pack_inputs` pads, so causal attention keeps
    it out of every real token's view) and holds token 0 (its outputs are never read)."""
    ids, positions = inputs.input_ids, inputs.position_ids
    width = ids.shape[1]
    extra = padded_width(width, cp) - width
    if not extra:
        return ids, positions
    steps = torch.arange(1, extra + 1, device=positions.device)
    tail = positions[:, -1:] + steps[None]
    return (
        torch.cat([ids, ids.new_zeros(ids.shape[0], extra)], dim=1),
        torch.cat([positions, tail], dim=1),
    )


def shard_inputs(inputs: PackedInputs, cp: int, rank: int) -> ShardedInputs:
    """CP rank ``rank``'s :class:`ShardedInputs` of ``inputs`` (lanes padded, then cut)."""
    width = inputs.input_ids.shape[1]
    ids, positions = pad_lanes(inputs, cp)
    padded = ids.shape[1]
    columns = local_columns(padded, cp, rank, ids.device)
    lane = torch.div(inputs.index, width, rounding_mode="floor")
    owner, offset = column_owner(inputs.index % width, padded, cp)
    owned = owner == rank
    flat = lane * (padded // cp) + offset
    return ShardedInputs(
        input_ids=ids.index_select(1, columns),
        position_ids=positions.index_select(1, columns),
        attention_mask=packed_attention_mask(positions, columns),
        owned=owned,
        index=flat[owned],
    )


def scatter_owned(values: Tensor, owned: Tensor) -> Tensor:
    """``[rows, T]`` (x trailing dims of ``values``): the owned tokens' ``values`` ``[m, ...]``
    in place, zeros elsewhere (differentiable in ``values``)."""
    out = values.new_zeros(*owned.shape, *values.shape[1:])
    mask = owned.reshape(*owned.shape, *([1] * (values.dim() - 1))).expand_as(out)
    return out.masked_scatter(mask, values)
