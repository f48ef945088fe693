"""TrajectoryRuntime owns a trajectory's in-memory state and refuses changes that break it."""

from __future__ import annotations

import asyncio
import time

import pytest

from adapter.recorder import Committed, SegmentState, TurnPlan
from adapter.runtime import RuntimeInvariantError, TrajectoryRuntime
from services.protocol import SegmentReason, Turn
from services.protocol.packing import float_array, int_array


def _plan(index: int, reason: SegmentReason | None) -> TurnPlan:
    return TurnPlan(
        input_ids=[1, 2],
        observation_ids=[] if reason else [2],
        prompt_ids=[1, 2] if reason else None,
        reason=reason,
        segment_index=index,
        message_keys=[],
        template_msgs=[],
        tools=None,
    )


def _committed(index: int, entry: bytes, n_turns: int = 1) -> Committed:
    state = SegmentState(
        index=index,
        token_ids=int_array([1, 2, 3]),
        messages=[],
        returned=("assistant",),
        ends_with_eot=True,
        template_msgs=[],
        tools=None,
        n_turns=n_turns,
    )
    turn = Turn(
        observation_ids=int_array(),
        output_ids=int_array([3]),
        output_logprobs=float_array([-0.1]),
        weight_version=0,
        finish_reason="stop",
    )
    return Committed(state=state, turn=turn, entries=[entry], counters={"turns": 1})


def test_turns_open_and_continue_segments() -> None:
    async def run() -> TrajectoryRuntime:
        runtime = TrajectoryRuntime("t", n_segments=2)
        async with runtime.lock:
            runtime.apply(_plan(2, SegmentReason.HISTORY_MISMATCH), _committed(2, b"seg2"))
            runtime.apply(_plan(2, None), _committed(2, b"turn2", n_turns=2))
        return runtime

    runtime = asyncio.run(run())
    assert runtime.n_segments == 3
    assert runtime.state is not None and runtime.state.n_turns == 2
    pending = runtime.pending()
    assert pending.entries == (b"seg2", b"turn2") and pending.counters == {"turns": 2}


@pytest.mark.parametrize(
    ("plan", "committed", "message"),
    [
        (_plan(1, SegmentReason.INITIAL), _committed(1, b"x"), "expected segment 0"),
        (_plan(0, SegmentReason.INITIAL), _committed(1, b"x"), "state 1"),
        (_plan(0, None), _committed(0, b"x"), "none is in memory"),
    ],
)
def test_inconsistent_turns_are_refused_and_change_nothing(
    plan: TurnPlan, committed: Committed, message: str
) -> None:
    async def run() -> TrajectoryRuntime:
        runtime = TrajectoryRuntime("t")
        async with runtime.lock:
            with pytest.raises(RuntimeInvariantError, match=message):
                runtime.apply(plan, committed)
        return runtime

    runtime = asyncio.run(run())
    assert runtime.n_segments == 0 and runtime.state is None and not runtime.pending()


def test_a_turn_needs_the_trajectory_lock() -> None:
    runtime = TrajectoryRuntime("t")
    with pytest.raises(RuntimeInvariantError, match="without its lock"):
        runtime.apply(_plan(0, SegmentReason.INITIAL), _committed(0, b"x"))


def test_entries_applied_during_a_write_stay_pending() -> None:
    async def run() -> TrajectoryRuntime:
        runtime = TrajectoryRuntime("t")
        async with runtime.lock:
            runtime.apply(_plan(0, SegmentReason.INITIAL), _committed(0, b"a"))
            in_flight = runtime.pending()
            runtime.apply(_plan(0, None), _committed(0, b"b", n_turns=2))
            runtime.written(in_flight)
        return runtime

    runtime = asyncio.run(run())
    left = runtime.pending()
    assert left.entries == (b"b",) and left.counters == {"turns": 1}


def test_a_write_is_confirmed_once() -> None:
    async def run() -> None:
        runtime = TrajectoryRuntime("t")
        async with runtime.lock:
            runtime.apply(_plan(0, SegmentReason.INITIAL), _committed(0, b"a"))
        write = runtime.pending()
        runtime.written(write)
        assert not runtime.pending()
        with pytest.raises(RuntimeInvariantError, match="not the oldest pending"):
            runtime.written(write)

    asyncio.run(run())


def test_idle_means_unused_and_unlocked() -> None:
    async def run() -> None:
        runtime = TrajectoryRuntime("t")
        future = time.monotonic() + 1.0
        assert runtime.idle_since(future)
        async with runtime.lock:
            assert not runtime.idle_since(future)
        runtime.touch()
        assert not runtime.idle_since(time.monotonic() - 1.0)

    asyncio.run(run())


def test_negative_segment_count_is_refused() -> None:
    with pytest.raises(RuntimeInvariantError, match="n_segments"):
        TrajectoryRuntime("t", n_segments=-1)
