"""Micro-batches under a padded-token budget, groups kept whole, rows packed into lanes.

A micro-batch is a ``[lanes, width]`` forward. Without packing (``lane_factor=0``) every row is
its own lane, right-padded to the micro-batch's longest row. With packing (``lane_factor >= 1``)
several rows share a lane, one after another, their position ids restarting at 0 for each row;
the pinned transformers turns position ids that restart into a block-diagonal causal mask when
no attention mask is given (``masking_utils.find_packed_sequence_indices``; flash-attention's
varlen kernels on a GPU), so a packed row sees exactly what it sees alone (tested: logprobs equal
the padded layout's within 1e-5). A micro-batch costs ``lanes x width`` padded tokens.

Packing: the rows of a micro-batch are spread over ``k`` lanes, longest row first into the
least-filled lane (LPT); ``k`` is the one with the fewest padded tokens among those whose fullest
lane holds at most ``lane_factor x`` the longest row (``k = rows`` -- no packing -- always
qualifies). The factor bounds what packing costs attention: a lane is at most that many times
longer than the longest row (dense-mask attention on the CPU is quadratic in the lane).

Groups (same prompt) stay on one micro-batch: the issue asks for it (a backend that evaluates
its loss per micro-batch must see whole groups for the ranking pairs; the torch backend
evaluates the objective on the whole batch first, so it does not depend on it), and a
data-parallel split keeps a group on one rank. Groups are taken longest first and added to the
open micro-batch while its cost stays within the budget; a single group costlier than the
budget gets a micro-batch of its own.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from trainer.data.batch import TrainBatch

Lanes = tuple[tuple[int, ...], ...]

# Lane counts tried above the smallest that fits (the rows-per-lane search stays linear).
_LANE_COUNTS_TRIED = 16


@dataclass(frozen=True)
class MicroBatchPlan:
    """Rows of each micro-batch (lane by lane), its lanes, and the padding it costs."""

    micro_batches: tuple[tuple[int, ...], ...]
    real_tokens: int
    padded_tokens: int
    lanes: tuple[Lanes, ...] = ()

    @property
    def padding_fraction(self) -> float:
        """Share of padded positions that are padding (0 = none)."""
        return 1.0 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0


def _balance(rows: Sequence[int], lengths: Sequence[int], k: int) -> list[list[int]]:
    """``rows`` over ``k`` lanes: longest first into the least-filled lane (ties: lower lane)."""
    lanes: list[list[int]] = [[] for _ in range(k)]
    heap = [(0, j) for j in range(k)]
    for row in sorted(rows, key=lambda r: (-lengths[r], r)):
        fill, j = heapq.heappop(heap)
        lanes[j].append(row)
        heapq.heappush(heap, (fill + lengths[row], j))
    return lanes


def lane_layout(rows: Sequence[int], lengths: Sequence[int], lane_factor: float) -> Lanes:
    """The lanes of one micro-batch of ``rows`` (see the module docstring), fullest first."""
    ordered = sorted(rows, key=lambda r: (-lengths[r], r))
    if lane_factor == 0 or len(ordered) < 2:
        return tuple((r,) for r in ordered)
    longest = lengths[ordered[0]]
    cap = lane_factor * longest
    smallest = max(1, math.ceil(sum(lengths[r] for r in rows) / cap))
    counts = [*range(smallest, min(len(rows), smallest + _LANE_COUNTS_TRIED) + 1), len(rows)]
    best: tuple[int, int, list[list[int]]] | None = None
    for k in counts:
        lanes = _balance(rows, lengths, k)
        width = max(sum(lengths[r] for r in lane) for lane in lanes)
        if width > cap:
            continue
        if best is None or (k * width, -k) < (best[0], -best[1]):
            best = (k * width, k, lanes)
    assert best is not None  # k = len(rows) always fits
    fill = {id(lane): sum(lengths[r] for r in lane) for lane in best[2]}
    return tuple(tuple(lane) for lane in sorted(best[2], key=lambda lane: -fill[id(lane)]))


def _cost(lanes: Lanes, lengths: Sequence[int]) -> int:
    return len(lanes) * max(sum(lengths[r] for r in lane) for lane in lanes)


def plan_micro_batches(
    batch: TrainBatch, token_budget: int, lane_factor: float = 0.0
) -> MicroBatchPlan:
    """Split ``batch``'s rows into micro-batches of at most ``token_budget`` padded tokens;
    ``lane_factor``: 0 for one row per lane, >= 1 to pack rows into lanes of at most that many
    times the micro-batch's longest row."""
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    if lane_factor != 0 and not lane_factor >= 1:
        raise ValueError(f"lane_factor must be 0 (no packing) or >= 1, got {lane_factor}")
    lengths = batch.seq_lengths.tolist()
    groups: dict[int, list[int]] = {}
    for row, group in enumerate(batch.group_ids.tolist()):
        groups.setdefault(group, []).append(row)
    ordered = sorted(groups.values(), key=lambda rows: (-max(lengths[r] for r in rows), rows[0]))
    plans: list[Lanes] = []
    current: list[int] = []
    layout: Lanes = ()
    filled = 0  # real tokens of ``current``: a lower bound of any layout's cost
    for rows in ordered:
        added = sum(lengths[r] for r in rows)
        over = bool(current) and filled + added > token_budget
        grown = layout if over else lane_layout(current + rows, lengths, lane_factor)
        if current and (over or _cost(grown, lengths) > token_budget):
            plans.append(layout)
            current, filled, grown = [], 0, lane_layout(rows, lengths, lane_factor)
        current, layout, filled = current + rows, grown, filled + added
    if current:
        plans.append(layout)
    micro = tuple(tuple(r for lane in lanes for r in lane) for lanes in plans)
    padded = sum(_cost(lanes, lengths) for lanes in plans)
    return MicroBatchPlan(micro, real_tokens=sum(lengths), padded_tokens=padded, lanes=tuple(plans))


@dataclass(frozen=True)
class PackedInputs:
    """The model inputs of one micro-batch in its lane layout.

    ``input_ids`` and ``position_ids`` ``[lanes, width]`` (positions restart at 0 for every
    row; a lane's padding tail continues its last row's positions, so causal attention keeps it
    out of every real token's view); ``index`` ``[rows, T]``: for post-prompt token ``t`` of row
    ``n``, the flat index (``lane * width + column``) of the hidden state that predicts it
    (clamped into the row past its end, where the action mask is False).
    """

    input_ids: Tensor
    position_ids: Tensor
    index: Tensor


def pack_inputs(batch: TrainBatch, lanes: Sequence[Sequence[int]]) -> PackedInputs:
    """Lay ``batch``'s rows out in ``lanes`` (row indices of ``batch``, each exactly once)."""
    seq, prompt = batch.seq_lengths.tolist(), batch.prompt_lengths.tolist()
    placed = sorted(r for lane in lanes for r in lane)
    if placed != list(range(batch.num_rows)):
        raise ValueError(f"lanes must hold every row of the batch once, got {list(lanes)}")
    device = batch.input_ids.device
    width = max(sum(seq[r] for r in lane) for lane in lanes)
    input_ids = torch.full((len(lanes), width), batch.pad_id, dtype=torch.long, device=device)
    position_ids = torch.zeros((len(lanes), width), dtype=torch.long, device=device)
    index = torch.zeros(tuple(batch.tokens.shape), dtype=torch.long, device=device)
    steps = torch.arange(batch.tokens.shape[1], device=device)
    for j, lane in enumerate(lanes):
        at = 0
        for r in lane:
            n = seq[r]
            input_ids[j, at : at + n] = batch.input_ids[r, :n]
            position_ids[j, at : at + n] = torch.arange(n, device=device)
            index[r] = j * width + at + (prompt[r] - 1 + steps).clamp(max=n - 1)
            at += n
        last = seq[lane[-1]]
        position_ids[j, at:] = torch.arange(last, last + width - at, device=device)
    return PackedInputs(input_ids, position_ids, index)
