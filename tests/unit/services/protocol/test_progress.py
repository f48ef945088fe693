"""Progress events: what validates, and the throttle's rule (phase changes at once; a changed
state once per interval; an unchanged one once per keepalive)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from services.protocol.progress import (
    TOOL_NAME_MAX,
    ProgressPhase,
    ProgressThrottle,
    TrajectoryProgress,
)

T0 = 1_700_000_000.0


def event(**over: Any) -> TrajectoryProgress:
    base: dict[str, Any] = {
        "trajectory_id": "b1:0:0.a1",
        "task_id": "b1:0:0",
        "batch_id": "b1",
        "instance_id": "swerl__spanlib-1",
        "node": "n1",
        "phase": ProgressPhase.AGENT,
        "started_at": T0,
        "elapsed_s": 0.0,
        "ts": T0,
    }
    return TrajectoryProgress(**{**base, **over})


def test_an_event_round_trips_as_json() -> None:
    e = event(turn=3, tokens=1234, current_tool="terminal", elapsed_s=12.5)
    assert TrajectoryProgress.model_validate_json(e.model_dump_json()) == e


@pytest.mark.parametrize(
    "bad",
    [
        {"phase": "thinking"},  # not a phase
        {"turn": -1},
        {"tokens": -5},
        {"elapsed_s": -1.0},
        {"current_tool": "x" * (TOOL_NAME_MAX + 1)},
        {"batch_id": "bad id"},  # ids follow the id rule
        {"surprise": 1},  # unknown fields are refused
    ],
)
def test_bad_events_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        event(**bad)


def test_the_clock_is_not_part_of_the_state() -> None:
    assert event(elapsed_s=1.0, ts=T0 + 1).state() == event(elapsed_s=9.0, ts=T0 + 9).state()
    assert event(turn=1).state() != event(turn=2).state()


def test_a_phase_change_is_always_emitted() -> None:
    throttle = ProgressThrottle(interval_s=5.0, keepalive_s=60.0)
    assert throttle.admit(event(phase=ProgressPhase.SANDBOX_START), T0)
    assert throttle.admit(event(phase=ProgressPhase.AGENT), T0 + 0.1)
    assert throttle.admit(event(phase=ProgressPhase.DONE, status="completed"), T0 + 0.2)


def test_a_changed_state_waits_for_the_interval() -> None:
    throttle = ProgressThrottle(interval_s=5.0, keepalive_s=60.0)
    assert throttle.admit(event(turn=1), T0)
    assert not throttle.due(event().trajectory_id, T0 + 4.9)
    assert not throttle.admit(event(turn=2), T0 + 4.9)
    assert throttle.due(event().trajectory_id, T0 + 5.0)
    assert throttle.admit(event(turn=2), T0 + 5.0)


def test_an_unchanged_state_is_repeated_only_as_a_keepalive() -> None:
    throttle = ProgressThrottle(interval_s=5.0, keepalive_s=60.0)
    assert throttle.admit(event(turn=1, current_tool="terminal"), T0)
    assert not throttle.admit(event(turn=1, current_tool="terminal"), T0 + 30.0)
    assert throttle.admit(event(turn=1, current_tool="terminal"), T0 + 60.0)


def test_trajectories_are_throttled_apart_and_forgotten() -> None:
    throttle = ProgressThrottle(interval_s=5.0, keepalive_s=60.0)
    assert throttle.admit(event(turn=1), T0)
    assert throttle.admit(event(trajectory_id="b1:0:1.a1", turn=1), T0 + 1.0)
    throttle.forget("b1:0:0.a1")
    assert throttle.admit(event(turn=2), T0 + 1.0)  # forgotten: a first event again


def test_the_keepalive_is_not_shorter_than_the_interval() -> None:
    with pytest.raises(ValueError, match="interval_s <= keepalive_s"):
        ProgressThrottle(interval_s=10.0, keepalive_s=5.0)
