"""Micro-batch plans: within the token budget, groups whole, every row exactly once; packed
lanes bounded and balanced; packed model inputs that index the right hidden states."""

from __future__ import annotations

import random

import pytest
import torch

from tests.support.trajectory_records import record, turn
from trainer.data import build_batch, pack_inputs, plan_micro_batches


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


def varied_groups(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(4, 60) for _ in range(rng.randint(2, 6))] for _ in range(10)]


@pytest.mark.parametrize("factor", [1.0, 2.0, 3.5])
def test_packed_plan_keeps_groups_bounds_lanes_and_pads_less(factor: float) -> None:
    batch = batch_of(varied_groups())
    lengths, group_ids = batch.seq_lengths.tolist(), batch.group_ids.tolist()
    plan = plan_micro_batches(batch, token_budget=200, lane_factor=factor)
    assert sorted(r for mb in plan.micro_batches for r in mb) == list(range(batch.num_rows))
    padded = 0
    for rows, lanes in zip(plan.micro_batches, plan.lanes, strict=True):
        assert [r for lane in lanes for r in lane] == list(rows)
        fills = [sum(lengths[r] for r in lane) for lane in lanes]
        assert max(fills) <= factor * max(lengths[r] for r in rows)
        cost = len(lanes) * max(fills)
        assert cost <= 200 or len({group_ids[r] for r in rows}) == 1
        padded += cost
    where: dict[int, int] = {}
    for k, rows in enumerate(plan.micro_batches):
        for r in rows:
            assert where.setdefault(group_ids[r], k) == k  # a group never spans micro-batches
    assert plan.padded_tokens == padded and plan.real_tokens == sum(lengths)
    unpacked = plan_micro_batches(batch, token_budget=200)
    assert all(len(lane) == 1 for lanes in unpacked.lanes for lane in lanes)
    assert plan.padding_fraction < unpacked.padding_fraction
    if factor >= 2:
        assert any(len(lane) > 1 for lanes in plan.lanes for lane in lanes)


def test_lanes_are_balanced_longest_first() -> None:
    # one group of 40, 30, 20, 10 (+1 prompt token each): two lanes of 41 + 11 and 31 + 21
    batch = batch_of([[40, 30, 20, 10]])
    plan = plan_micro_batches(batch, token_budget=1000, lane_factor=2.0)
    lengths = batch.seq_lengths.tolist()
    (lanes,) = plan.lanes
    assert sorted(sorted(lengths[r] for r in lane) for lane in lanes) == [[10, 40], [20, 30]]
    assert plan.padding_fraction == 0.0


def test_lane_factor_between_zero_and_one_is_rejected() -> None:
    with pytest.raises(ValueError, match="lane_factor"):
        plan_micro_batches(batch_of([[5]]), 10, lane_factor=0.5)


def test_packed_inputs_restart_positions_and_index_the_predicting_state() -> None:
    records = [
        record(f"p{i}", [([7, 8, 9][: i + 1], [turn([], [20 + i, 30 + i, 40 + i], 0)])])
        for i in range(3)
    ]
    batch = build_batch(records, trainer_version=0)[0]
    seq = batch.seq_lengths.tolist()
    packed = pack_inputs(batch, [(2, 0), (1,)])
    width = seq[2] + seq[0]
    assert packed.input_ids.shape == (2, width)
    assert packed.position_ids[0].tolist() == [*range(seq[2]), *range(seq[0])]
    # lane 1 holds one row; its padding tail continues that row's positions
    assert packed.position_ids[1].tolist() == list(range(width))
    assert packed.input_ids[1, seq[1] :].eq(batch.pad_id).all()
    flat = packed.input_ids.flatten()
    mask = batch.action_mask
    # the state at index[n, t] predicts the next token of its lane: post-prompt token t
    assert torch.equal(flat[packed.index + 1][mask], batch.tokens[mask])
    with pytest.raises(ValueError, match="every row"):
        pack_inputs(batch, [(0, 1)])
