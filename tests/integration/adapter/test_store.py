"""The Redis trajectory store: write-through appends, loading, outcomes, size per token."""

from __future__ import annotations

import asyncio

import pytest
import redis

from services.protocol import (
    Outcome,
    OutcomeStatus,
    Segment,
    SegmentReason,
    TrajectoryMeta,
    TrajectoryRecord,
    Turn,
)
from services.protocol.packing import float_array, int_array
from services.store import (
    TrajectoryExistsError,
    TrajectoryNotFoundError,
    TrajectoryStore,
    load_trajectory,
)
from services.store.trajectories import list_trajectories


def sample_record(tid: str) -> TrajectoryRecord:
    seg0 = Segment(prompt_ids=int_array(range(100)), reason=SegmentReason.INITIAL)
    seg0.turns = [
        Turn(
            observation_ids=int_array(range(i * 10)),
            output_ids=int_array(range(128)),
            output_logprobs=float_array([-0.25] * 128),
            weight_version=i,
            finish_reason="stop",
            engine="http://e1",
        )
        for i in range(3)
    ]
    seg1 = Segment(prompt_ids=int_array(range(50)), reason=SegmentReason.HISTORY_MISMATCH)
    seg1.turns = [
        Turn(
            output_ids=int_array([7, 8]),
            output_logprobs=float_array([-1.5, -2.5]),
            weight_version=3,
            finish_reason="length",
        )
    ]
    return TrajectoryRecord(
        meta=TrajectoryMeta(trajectory_id=tid, task_id="t", group_id="g"), segments=[seg0, seg1]
    )


def test_append_and_load_round_trip(redis_url: str) -> None:
    expected = sample_record("store-1")

    async def scenario() -> TrajectoryRecord:
        store = TrajectoryStore.from_url(redis_url, "test:")
        await store.open(expected.meta)
        with pytest.raises(TrajectoryExistsError):
            await store.open(expected.meta)
        assert await store.status("store-1") == "open"
        entries = expected.to_entries()
        for entry in entries:  # written through one entry at a time, as turns complete
            await store.append("store-1", [entry], {"turns": 1})
        loaded = await store.load("store-1")
        assert await store.raw_entries("store-1") == entries
        with pytest.raises(TrajectoryNotFoundError):
            await store.load("missing")
        await store.close_connection()
        return loaded

    loaded = asyncio.run(scenario())
    assert loaded.meta == expected.meta
    assert loaded.to_entries() == expected.to_entries()
    assert loaded.counters == {"turns": len(expected.to_entries())}
    sync = load_trajectory(redis.Redis.from_url(redis_url), "store-1", prefix="test:")
    assert sync.to_json() == loaded.to_json()
    assert list_trajectories(redis.Redis.from_url(redis_url), prefix="test:") == ["store-1"]
    with pytest.raises(TrajectoryNotFoundError):
        load_trajectory(redis.Redis.from_url(redis_url), "store-1")  # other prefix


def test_close_keeps_an_infrastructure_abort(redis_url: str) -> None:
    async def scenario() -> tuple[Outcome | None, Outcome | None, dict[str, int]]:
        store = TrajectoryStore.from_url(redis_url)
        await store.open(TrajectoryMeta(trajectory_id="ok"))
        await store.open(TrajectoryMeta(trajectory_id="infra"))
        scored = Outcome(status=OutcomeStatus.COMPLETED, reward=1.0)
        kept_ok = await store.close("ok", scored)
        await store.mark_infra_failure("infra", "engine down")
        kept_infra = await store.close("infra", Outcome(status=OutcomeStatus.COMPLETED, reward=0.0))
        counters = await store.counters("infra")
        assert await store.status("infra") == "closed"
        await store.close_connection()
        return kept_ok, kept_infra, counters

    kept_ok, kept_infra, counters = asyncio.run(scenario())
    assert kept_ok is not None and kept_ok.reward == 1.0
    assert kept_infra is not None and kept_infra.status is OutcomeStatus.ABORTED
    assert kept_infra.abort_reason == "engine down"
    assert counters == {"infra_failures": 1}


def test_bytes_per_token_in_redis(redis_url: str) -> None:
    """Packed token data keeps a recorded token well under 12 bytes in Redis."""
    record = sample_record("size")

    async def scenario() -> int:
        store = TrajectoryStore.from_url(redis_url)
        await store.open(record.meta)
        for entry in record.to_entries():
            await store.append("size", [entry], {"turns": 1, "generated_tokens": 128})
        used = await store.memory_usage("size")
        await store.close_connection()
        return used

    used = asyncio.run(scenario())
    assert used / record.n_tokens <= 12.0, (used, record.n_tokens)
