"""Progress events in a real Redis: the stream and the latest-event hash, trimming, expiry,
reading after a position, and the record counters the worker reads the turns and tokens from."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from services.protocol.progress import ProgressPhase, TrajectoryProgress
from services.store.progress import (
    PROGRESS_TTL_S,
    ProgressStore,
    progress_latest_key,
    progress_stream_key,
)
from services.store.trajectories import TrajectoryKeys

T0 = 1_700_000_000.0


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def event(sample: int, ts: float, **over: Any) -> TrajectoryProgress:
    base: dict[str, Any] = {
        "trajectory_id": f"rollout-1:0:{sample}.a1", "task_id": f"rollout-1:0:{sample}",
        "batch_id": "rollout-1", "job_id": "rollout-1", "instance_id": "swerl__spanlib-1",
        "sample_index": sample, "node": "n1", "phase": ProgressPhase.AGENT,
        "started_at": T0 + sample, "elapsed_s": ts - T0, "ts": ts,
    }  # fmt: skip
    return TrajectoryProgress(**{**base, **over})


def test_the_latest_event_per_trajectory_and_the_history(client: redis.Redis) -> None:
    store = ProgressStore(client, "t:")
    written = [event(0, T0 + 1, turn=1), event(1, T0 + 2), event(0, T0 + 3, turn=2,
               current_tool="terminal"), event(1, T0 + 4, phase=ProgressPhase.DONE,
               status="completed")]  # fmt: skip
    store.emit(*written[:2])  # several in one round trip
    store.emit(written[2])
    store.emit(written[3])
    assert store.latest("rollout-1") == [written[2], written[3]]  # by start
    after, history = store.events("rollout-1")
    assert history == written
    assert store.events("rollout-1", after) == (after, [])  # nothing since
    store.emit(newer := event(0, T0 + 5, turn=3))
    assert store.events("rollout-1", after)[1] == [newer]
    assert store.latest("other-batch") == [] and store.events("other-batch") == ("0", [])


def test_both_keys_expire_and_the_stream_is_trimmed(client: redis.Redis) -> None:
    store = ProgressStore(client, "t:", maxlen=100, ttl_s=PROGRESS_TTL_S)
    for i in range(1000):
        store.emit(event(i % 3, T0 + i))
    stream, latest = progress_stream_key("rollout-1", "t:"), progress_latest_key("rollout-1", "t:")
    assert 100 <= client.xlen(stream) < 1000  # approximate trimming: about maxlen
    assert client.hlen(latest) == 3
    for key in (stream, latest):
        assert 0 < client.ttl(key) <= PROGRESS_TTL_S
    newest = {s: max(T0 + i for i in range(1000) if i % 3 == s) for s in range(3)}
    assert [e.ts for e in store.latest("rollout-1")] == [newest[0], newest[1], newest[2]]


def test_an_invalid_entry_is_skipped(client: redis.Redis) -> None:
    store = ProgressStore(client, "t:")
    client.xadd(progress_stream_key("rollout-1", "t:"), {"event": "{not json"})
    client.hset(progress_latest_key("rollout-1", "t:"), "x", "{}")
    store.emit(good := event(0, T0 + 1))
    assert store.events("rollout-1")[1] == [good]
    assert store.latest("rollout-1") == [good]


def test_a_bad_position_is_refused(client: redis.Redis) -> None:
    with pytest.raises(ValueError, match="stream id"):
        ProgressStore(client, "t:").events("rollout-1", "$")


def test_record_counts_read_the_adapters_counters(client: redis.Redis) -> None:
    keys = TrajectoryKeys("t:", "rollout-1:0:0.a1")
    client.hset(keys.counters, mapping={"turns": 4, "prompt_tokens": 1000,
                                        "observation_tokens": 200, "generated_tokens": 30,
                                        "segments": 1})  # fmt: skip
    counts = ProgressStore(client, "t:").record_counts(["rollout-1:0:0.a1", "rollout-1:0:1.a1"])
    assert counts == {"rollout-1:0:0.a1": (4, 1230), "rollout-1:0:1.a1": (0, 0)}
