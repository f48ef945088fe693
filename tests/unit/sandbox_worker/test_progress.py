"""The worker's progress reporter on a recording store, tick by tick: starts and phase changes
go out at the next tick, running trajectories on the throttle's clock with the record's counts,
a run's end as ``done`` (its last event), and a Redis failure costs the events, never the run.
Also the OpenHands event callback's reading."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import redis

from sandbox_worker.progress import ProgressReporter, RunProgress, tool_callback, tool_of_event
from services.protocol.progress import ProgressPhase, ProgressThrottle, TrajectoryProgress
from services.protocol.tasks import RolloutTask

T0 = 1_700_000_000.0


@dataclass
class RecordingStore:
    """What the reporter needs of :class:`services.store.progress.ProgressStore`."""

    counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    emitted: list[TrajectoryProgress] = field(default_factory=list)
    broken: bool = False

    def emit(self, *events: TrajectoryProgress) -> None:
        if self.broken:
            raise redis.ConnectionError("Redis is down")
        self.emitted.extend(events)

    def record_counts(self, trajectory_ids: list[str]) -> dict[str, tuple[int, int]]:
        if self.broken:
            raise redis.ConnectionError("Redis is down")
        return {t: self.counts.get(t, (0, 0)) for t in trajectory_ids}


def task(n: int = 0) -> RolloutTask:
    return RolloutTask(task_id=f"b1:0:{n}", batch_id="b1", job_id="rollout-1", group_id="b1:0",
                       instance_id="swerl__spanlib-1", sample_index=n)  # fmt: skip


def reporter(store: RecordingStore) -> ProgressReporter:
    throttle = ProgressThrottle(interval_s=5.0, keepalive_s=60.0)
    return ProgressReporter(store, "n1", throttle)  # type: ignore[arg-type]


def test_a_run_goes_out_phase_by_phase_with_its_record_counts() -> None:
    store = RecordingStore()
    rep = reporter(store)
    t = task()
    progress = rep.start(t, T0)
    assert rep.tick(T0 + 1) == 1  # starting
    progress.phase(ProgressPhase.SANDBOX_START)
    assert rep.tick(T0 + 1.5) == 1  # a phase change goes out whatever the interval
    store.counts[t.trajectory_id] = (4, 2500)
    progress.phase(ProgressPhase.AGENT)
    progress.phase(ProgressPhase.AGENT)  # no change: nothing new
    assert rep.tick(T0 + 2) == 1
    rep.finish(t, "completed")
    assert rep.tick(T0 + 2.5) == 1
    assert rep.tick(T0 + 10**6) == 0  # a finished run is no longer tracked
    phases = [e.phase for e in store.emitted]
    assert phases == ["starting", "sandbox_start", "agent", "done"]
    last = store.emitted[-1]
    assert (last.turn, last.tokens, last.status, last.elapsed_s) == (4, 2500, "completed", 2.5)
    assert (last.batch_id, last.job_id, last.instance_id, last.node) == (
        t.batch_id, t.job_id, t.instance_id, "n1")  # fmt: skip
    assert last.trajectory_id == t.trajectory_id and last.started_at == T0


def test_a_running_trajectory_goes_out_on_the_throttles_clock() -> None:
    store = RecordingStore()
    rep = reporter(store)
    t = task()
    progress = rep.start(t, T0)
    progress.phase(ProgressPhase.AGENT)
    assert rep.tick(T0) == 1
    progress.tool("terminal")
    store.counts[t.trajectory_id] = (2, 900)
    assert rep.tick(T0 + 4.9) == 0  # changed, but inside the interval
    assert rep.tick(T0 + 5.0) == 1
    e = store.emitted[-1]
    assert (e.phase, e.turn, e.tokens, e.current_tool, e.elapsed_s) == (
        "agent", 2, 900, "terminal", 5.0)  # fmt: skip
    assert rep.tick(T0 + 11.0) == 0  # unchanged: only a keepalive repeats it
    assert rep.tick(T0 + 65.0) == 1


def test_a_run_that_ends_between_ticks_ends_with_done() -> None:
    """A run that changed phase and ended since the last tick goes out as ``done`` alone: no
    event of a finished run shows it running."""
    store = RecordingStore()
    rep = reporter(store)
    t = task()
    rep.start(t, T0).phase(ProgressPhase.GRADING)
    rep.finish(t, "completed")
    rep.tick(T0 + 1)
    assert [e.phase for e in store.emitted] == ["done"]


def test_a_redis_failure_drops_events_and_never_raises() -> None:
    store = RecordingStore(broken=True)
    rep = reporter(store)
    t = task()
    rep.start(t, T0).phase(ProgressPhase.AGENT)
    assert rep.tick(T0 + 1) == 0
    rep.finish(t, "aborted")
    assert rep.tick(T0 + 2) == 0
    store.broken = False
    t2 = task(1)
    rep.start(t2, T0)
    assert rep.tick(T0 + 3) == 1
    assert [e.trajectory_id for e in store.emitted] == [t2.trajectory_id]


def test_without_a_store_runs_are_tracked_and_nothing_is_written() -> None:
    rep = ProgressReporter(None, "n1")
    progress = rep.start(task(), T0)
    progress.phase(ProgressPhase.GRADING)
    assert progress.snapshot() == (ProgressPhase.GRADING, None)
    assert rep.tick(T0 + 10**9) == 0


def test_entering_a_phase_clears_the_tool() -> None:
    progress = RunProgress()
    progress.tool("terminal")
    assert progress.snapshot() == (ProgressPhase.STARTING, "terminal")
    progress.phase(ProgressPhase.GRADING)
    assert progress.snapshot() == (ProgressPhase.GRADING, None)


@dataclass
class Action:  # the fields of the SDK's ActionEvent the callback reads
    tool_name: str
    tool_call_id: str = "call-1"
    action: object = None


@dataclass
class Observation:  # ObservationEvent / AgentErrorEvent: a tool's end
    tool_name: str
    tool_call_id: str = "call-1"


@dataclass
class Message:
    llm_message: str = "hi"


def test_the_event_callback_follows_the_running_tool() -> None:
    assert tool_of_event(Action("terminal")) == (True, "terminal")
    assert tool_of_event(Observation("terminal")) == (True, None)
    assert tool_of_event(Message()) == (False, None)
    progress = RunProgress()
    on_event = tool_callback(progress)
    on_event(Action("file_editor"))
    assert progress.snapshot()[1] == "file_editor"
    on_event(Message())  # says nothing about tools
    assert progress.snapshot()[1] == "file_editor"
    on_event(Observation("file_editor"))
    assert progress.snapshot()[1] is None


def test_the_callback_reads_the_sdks_own_events() -> None:
    events = pytest.importorskip("openhands.sdk.event")
    fields = set(events.ActionEvent.model_fields)
    assert {"tool_name", "tool_call_id", "action"} <= fields
    observation = set(events.ObservationEvent.model_fields)
    assert "tool_name" in observation and "action" not in observation
