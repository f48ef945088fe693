"""Micro-batch plans: within the token budget, groups whole, every row exactly once."""

from __future__ import annotations

import random

import pytest

from tests.support.trajectory_records import record, turn
from trainer.data import build_batch, plan_micro_batches


def batch_of(lengths_by_group: list[list[int]]):
    records = []
    for g, lengths in enumerate(lengths_by_group):
        for i, n in enumerate(lengths):
            records.append(
                record(f"t{g}-{i}", [([1], [turn([], [2] * (n - 1), 0)])], group=f"g{g}")
            )
    return build_batch(records, trainer_version=0)[0]


def test_plan_respects_budget_keeps_groups_and_covers_every_row() -> None:
    rng = random.Random(0)
    groups = [[rng.randint(2, 40) for _ in range(rng.randint(1, 4))] for _ in range(12)]
    batch = batch_of(groups)
    plan = plan_micro_batches(batch, token_budget=120)
    rows = [r for mb in plan.micro_batches for r in mb]
    assert sorted(rows) == list(range(batch.num_rows))
    lengths, group_ids = batch.seq_lengths.tolist(), batch.group_ids.tolist()
    where = {}
    for k, mb in enumerate(plan.micro_batches):
        one_group = len({group_ids[r] for r in mb}) == 1
        assert one_group or len(mb) * max(lengths[r] for r in mb) <= 120
        for r in mb:
            assert where.setdefault(group_ids[r], k) == k  # a group never spans micro-batches
    assert plan.real_tokens == sum(lengths)
    padded = sum(len(mb) * max(lengths[r] for r in mb) for mb in plan.micro_batches)
    assert plan.padded_tokens == padded
    assert plan.padding_fraction == pytest.approx(1 - sum(lengths) / padded)


def test_sorting_by_length_keeps_padding_small() -> None:
    # 16 singleton groups of two lengths: sorted plans put equal lengths together, no padding
    batch = batch_of([[10] if i % 2 else [30] for i in range(16)])
    plan = plan_micro_batches(batch, token_budget=60)
    assert plan.padding_fraction == 0.0


def test_a_group_over_budget_gets_its_own_micro_batch() -> None:
    batch = batch_of([[50, 50, 50], [5]])
    plan = plan_micro_batches(batch, token_budget=60)
    assert [len(mb) for mb in plan.micro_batches] == [3, 1]
    with pytest.raises(ValueError, match="token_budget must be >= 1"):
        plan_micro_batches(batch, 0)
