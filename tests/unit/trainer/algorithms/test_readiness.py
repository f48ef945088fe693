"""Readiness statistics (Eq. 12-13), their merge, and the gate on scripted sequences."""

from __future__ import annotations

import pytest
import torch

from tests.support import algorithm_reference as ref
from tests.support.algorithm_batches import on_devices_and_dtypes, random_batch
from trainer.algorithms import ReadinessGate, ReadinessStats, readiness_statistics, terminal_values

SEEDS = range(15)


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", SEEDS)
def test_statistics_match_reference(seed: int, dtype: torch.dtype, device: str) -> None:
    b = random_batch(seed, dtype, device)
    final = terminal_values(b.values, b.action_mask)
    stats = readiness_statistics(final, b.rewards, b.group_ids)
    ev, acc = ref.readiness(final.tolist(), b.rewards.tolist(), b.group_ids.tolist())
    if ev is None:
        assert stats.explained_variance is None
    else:
        assert stats.explained_variance == pytest.approx(ev, rel=1e-6, abs=1e-9)
    if acc is None:
        assert stats.ranking_accuracy is None
    else:
        assert stats.ranking_accuracy == pytest.approx(acc)


def test_statistics_hand_example() -> None:
    final = torch.tensor([0.4, -0.1, -0.3, 9.0, 9.0])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1])  # group 1 is not mixed
    stats = readiness_statistics(final, rewards, groups)
    assert stats.count == 3 and stats.pairs == 2 and stats.correct_pairs == 2
    z = [2 / 3, -1 / 3, -1 / 3]
    resid = [z[0] - 0.4, z[1] + 0.1, z[2] + 0.3]

    def pvar(x: list[float]) -> float:
        m = sum(x) / len(x)
        return sum((v - m) ** 2 for v in x) / len(x)

    assert stats.explained_variance == pytest.approx(1 - pvar(resid) / pvar(z), rel=1e-6)
    assert stats.ranking_accuracy == 1.0


def test_no_mixed_group_gives_none() -> None:
    stats = readiness_statistics(torch.zeros(3), torch.tensor([1.0, 1.0, 0.0]), torch.arange(3))
    assert stats.explained_variance is None and stats.ranking_accuracy is None
    assert stats == ReadinessStats()


@pytest.mark.parametrize("seed", SEEDS)
def test_merge_of_shards_equals_whole_batch(seed: int) -> None:
    b = random_batch(seed)
    final = terminal_values(b.values, b.action_mask)
    # shards must hold whole groups (group statistics are local): split by group id parity
    shards = [b.group_ids % 2 == 0, b.group_ids % 2 == 1]
    parts = [readiness_statistics(final[s], b.rewards[s], b.group_ids[s]) for s in shards]
    whole = readiness_statistics(final, b.rewards, b.group_ids)
    merged = parts[0].merge(parts[1])
    assert merged.count == whole.count and merged.pairs == whole.pairs
    assert merged.correct_pairs == whole.correct_pairs
    for field in ("sum_z", "sumsq_z", "sum_residual", "sumsq_residual"):
        assert getattr(merged, field) == pytest.approx(getattr(whole, field), abs=1e-9)
    if whole.explained_variance is not None:
        assert merged.explained_variance == pytest.approx(whole.explained_variance)
    assert merged.ranking_accuracy == whole.ranking_accuracy
    round_trip = ReadinessStats.from_tensor(merged.to_tensor())
    assert round_trip == merged


def _stats(e: float, a: float) -> ReadinessStats:
    """Statistics with explained variance ``e`` and ranking accuracy ``a`` (100 pairs)."""
    return ReadinessStats(
        count=1, sum_z=0.0, sumsq_z=1.0, sum_residual=0.0, sumsq_residual=1.0 - e,
        pairs=100, correct_pairs=round(a * 100),
    )  # fmt: skip


READY = _stats(0.9, 0.9)
NOT_READY = _stats(0.0, 0.5)
NO_MIXED = ReadinessStats()


def test_helper_statistics_are_what_they_claim() -> None:
    assert READY.explained_variance == pytest.approx(0.9) and READY.ranking_accuracy == 0.9
    assert NOT_READY.explained_variance == pytest.approx(0.0)


def test_gate_never_counts_before_t_min() -> None:
    gate = ReadinessGate(consecutive=3, t_min=5, t_max=100)
    results = [gate.update(k, READY) for k in range(1, 5)]
    assert results == [False] * 4 and gate.counter == 0
    assert [gate.update(k, READY) for k in range(5, 8)] == [False, False, True]
    assert gate.switch_step == 7


def test_gate_switches_after_exactly_consecutive_ready_steps() -> None:
    gate = ReadinessGate(beta=0.0, consecutive=4, t_min=1, t_max=1000)
    seen = []
    for k in range(1, 5):
        seen.append((gate.update(k, READY), gate.counter))
    assert seen == [(False, 1), (False, 2), (False, 3), (True, 4)]
    assert gate.switched and gate.switch_step == 4


def test_gate_resets_on_a_bad_step_and_on_a_step_without_mixed_groups() -> None:
    gate = ReadinessGate(beta=0.0, consecutive=3, t_min=1, t_max=1000)
    script = [READY, READY, NOT_READY, READY, READY, NO_MIXED, READY, READY, READY]
    out = [gate.update(k, s) for k, s in enumerate(script, start=1)]
    assert out == [False] * 8 + [True]
    assert gate.switch_step == 9


def test_step_without_mixed_groups_keeps_the_ema() -> None:
    gate = ReadinessGate(beta=0.5, t_min=1000, t_max=2000)
    gate.update(1, _stats(0.4, 0.8))
    assert gate.e_bar == pytest.approx(0.4) and gate.a_bar == pytest.approx(0.8)  # first value
    gate.update(2, NO_MIXED)
    assert gate.e_bar == pytest.approx(0.4) and gate.a_bar == pytest.approx(0.8)
    gate.update(3, _stats(0.0, 0.6))
    assert gate.e_bar == pytest.approx(0.2) and gate.a_bar == pytest.approx(0.7)


def test_ema_must_exceed_thresholds() -> None:
    gate = ReadinessGate(beta=0.9, eta_e=0.2, eta_a=0.65, consecutive=2, t_min=2, t_max=100)
    gate.update(1, _stats(0.0, 0.0))  # EMA starts low
    gate.update(2, READY)  # e_bar = 0.09, a_bar = 0.09: not ready although this step is
    assert gate.counter == 0 and gate.e_bar == pytest.approx(0.09)


def test_gate_t_max_fallback() -> None:
    gate = ReadinessGate(t_min=2, t_max=6)
    assert [gate.update(k, NOT_READY) for k in range(1, 7)] == [False] * 5 + [True]
    assert gate.switch_step == 6


def test_gate_is_irreversible() -> None:
    gate = ReadinessGate(beta=0.0, consecutive=1, t_min=1, t_max=100)
    assert gate.update(1, READY)
    e_bar = gate.e_bar
    assert all(gate.update(k, NOT_READY) for k in range(2, 10))
    assert gate.switched and gate.switch_step == 1 and gate.e_bar == e_bar


def test_save_load_round_trip_mid_count() -> None:
    script = [READY] * 2
    gate = ReadinessGate(beta=0.5, consecutive=4, t_min=1, t_max=100)
    for k, s in enumerate(script, start=1):
        gate.update(k, s)
    state = gate.state_dict()
    restored = ReadinessGate(beta=0.5, consecutive=4, t_min=1, t_max=100)
    restored.load_state_dict(state)
    assert restored.state_dict() == state and restored.counter == 2
    # both continue identically and switch at the same step
    for k in (3, 4):
        assert gate.update(k, READY) == restored.update(k, READY)
    assert restored.switched and restored.switch_step == 4 == gate.switch_step
    with pytest.raises(ValueError, match="increase"):
        restored.update(4, READY)


def test_gate_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="beta"):
        ReadinessGate(beta=1.0)
    with pytest.raises(ValueError, match="t_max"):
        ReadinessGate(t_min=10, t_max=5)
    with pytest.raises(ValueError, match="consecutive"):
        ReadinessGate(consecutive=0)
    gate = ReadinessGate()
    with pytest.raises(ValueError, match="step"):
        gate.update(-1, READY)
    with pytest.raises(ValueError, match="ReadinessStats"):
        gate.update(1, {"e": 1.0})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="missing"):
        gate.load_state_dict({"version": 1})
    bad = gate.state_dict() | {"switched": True, "switch_step": None}
    with pytest.raises(ValueError, match="switch_step"):
        gate.load_state_dict(bad)


def test_observe_from_values_is_update_from_statistics() -> None:
    """A driver reading e_k and a_k from step metrics gets the same gate as one with the stats."""
    script = [READY, NOT_READY, NO_MIXED, READY, READY, READY]
    by_stats = ReadinessGate(beta=0.0, consecutive=2, t_min=1, t_max=100)
    by_values = ReadinessGate(beta=0.0, consecutive=2, t_min=1, t_max=100)
    for k, stats in enumerate(script, start=1):
        got = by_values.observe(k, stats.explained_variance, stats.ranking_accuracy)
        assert got == by_stats.update(k, stats)
        assert by_values.state_dict() == by_stats.state_dict()
    assert by_values.switch_step == 5
    with pytest.raises(ValueError, match="e must be a finite number or None"):
        ReadinessGate().observe(1, float("nan"), 0.5)
    with pytest.raises(ValueError, match="steps must increase"):
        by_values.observe(3, 0.5, 0.9)
