"""Micro-batches under a padded-token budget, groups kept whole, rows sorted by length.

A micro-batch of ``r`` rows whose longest row has ``l`` tokens costs ``r * l`` padded tokens.
Groups (same prompt) stay on one micro-batch: the objective pairs group members, and a future
data-parallel split must keep a group on one rank. Groups are taken longest first and rows are
sorted by length inside the plan, so similar lengths share a micro-batch and padding is small.
A single group costlier than the budget gets a micro-batch of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.data.batch import TrainBatch


@dataclass(frozen=True)
class MicroBatchPlan:
    """Row indices of each micro-batch, and the padding it costs."""

    micro_batches: tuple[tuple[int, ...], ...]
    real_tokens: int
    padded_tokens: int

    @property
    def padding_fraction(self) -> float:
        """Share of padded positions that are padding (0 = none)."""
        return 1.0 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0


def plan_micro_batches(batch: TrainBatch, token_budget: int) -> MicroBatchPlan:
    """Split ``batch``'s rows into micro-batches of at most ``token_budget`` padded tokens."""
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    lengths = batch.seq_lengths.tolist()
    groups: dict[int, list[int]] = {}
    for row, group in enumerate(batch.group_ids.tolist()):
        groups.setdefault(group, []).append(row)
    ordered = sorted(groups.values(), key=lambda rows: (-max(lengths[r] for r in rows), rows[0]))
    plans: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for rows in ordered:
        group_longest = max(lengths[r] for r in rows)
        width = max(longest, group_longest)
        if current and (len(current) + len(rows)) * width > token_budget:
            plans.append(current)
            current, longest = [], 0
            width = group_longest
        current = current + rows
        longest = width
    if current:
        plans.append(current)
    micro = tuple(tuple(sorted(p, key=lambda r: (-lengths[r], r))) for p in plans)
    padded = sum(len(p) * max(lengths[r] for r in p) for p in micro)
    return MicroBatchPlan(micro, real_tokens=sum(lengths), padded_tokens=padded)
