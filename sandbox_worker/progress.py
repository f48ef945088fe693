"""The worker's side of per-trajectory progress events (:mod:`services.protocol.progress`).

Who knows what, and so who reports it:

* the **worker** knows when a task starts and ends (phases ``starting`` and ``done``);
* the **runner** knows its phases (``sandbox_start``, ``agent``, ``grading``) and, through the
  OpenHands event callbacks (:func:`tool_of_event`), which tool runs now: it tells its
  :class:`RunProgress` (``ctx.progress``): a lock and two fields, never any I/O;
* the **adapter's record counters** in Redis hold the turns and tokens
  (:meth:`services.store.progress.ProgressStore.record_counts`): read only when an event is due.

Only the worker's progress thread talks to Redis (:meth:`ProgressReporter.tick`, every
:data:`TICK_S`): each tick emits, in one read and one write round trip, the runs that started,
changed phase or ended since the last tick, and the running ones whose throttle interval has
passed. So a slow or absent Redis never holds a runner up, and one thread writes every event in
order (a run's ``done`` is always its last). A Redis failure costs events, never a trajectory:
it is logged (once per outage) and they are dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from services.protocol.progress import (
    TOOL_NAME_MAX,
    ProgressPhase,
    ProgressThrottle,
    TrajectoryProgress,
)
from services.protocol.tasks import RolloutTask
from services.store.progress import ProgressStore

log = logging.getLogger("swerl.worker.progress")

#: How often the worker's progress thread emits what is due.
TICK_S = 1.0


class RunProgress:
    """One run's live phase and current tool, set by its runner (thread-safe, no I/O)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phase = ProgressPhase.STARTING
        self._tool: str | None = None
        self._changed = True  # a phase not yet emitted (starting, at first)

    def phase(self, phase: ProgressPhase) -> None:
        """Enter ``phase`` (the current tool is cleared); emitted at the next tick."""
        with self._lock:
            if phase != self._phase:
                self._phase, self._tool, self._changed = phase, None, True

    def tool(self, name: str | None) -> None:
        """The tool that runs now (None: none; the agent thinks or waits for the model)."""
        with self._lock:
            self._tool = name[:TOOL_NAME_MAX] if name else None

    def snapshot(self) -> tuple[ProgressPhase, str | None]:
        with self._lock:
            return self._phase, self._tool

    def take(self) -> tuple[ProgressPhase, str | None, bool]:
        """The phase, the tool, and whether the phase changed since the last take."""
        with self._lock:
            changed, self._changed = self._changed, False
            return self._phase, self._tool, changed


def tool_of_event(event: Any) -> tuple[bool, str | None]:
    """What an OpenHands SDK event says about the running tool: ``(True, name)`` for an action
    (its tool starts), ``(True, None)`` for a tool's observation or error (it ended), ``(False,
    None)`` for anything else. Duck-typed, so the worker needs no SDK import."""
    name = getattr(event, "tool_name", None)
    if not isinstance(name, str):
        return False, None
    if hasattr(event, "action") and hasattr(event, "tool_call_id"):
        return True, name
    return True, None


def tool_callback(progress: RunProgress) -> Callable[[Any], None]:
    """An OpenHands event callback that keeps ``progress``'s current tool up to date."""

    def on_event(event: Any) -> None:
        known, name = tool_of_event(event)
        if known:
            progress.tool(name)

    return on_event


def _counted(event: TrajectoryProgress, turns: int, tokens: int) -> TrajectoryProgress:
    return event.model_copy(update={"turn": turns, "tokens": tokens})


@dataclass(frozen=True)
class _Tracked:
    task: RolloutTask
    started: float  # seconds since the epoch
    progress: RunProgress


class ProgressReporter:
    """The progress events of one worker's runs (see the module doc). ``store`` None disables
    the writes (a worker on a stand-in queue, in tests); the runs are still tracked."""

    def __init__(
        self, store: ProgressStore | None, node: str, throttle: ProgressThrottle | None = None
    ) -> None:
        self.store, self.node = store, node
        self.throttle = throttle or ProgressThrottle()
        self._runs: dict[str, _Tracked] = {}
        self._ended: list[tuple[_Tracked, str]] = []  # runs whose done is not written yet
        self._lock = threading.Lock()
        self._failing = False

    def start(self, task: RolloutTask, started: float) -> RunProgress:
        """Track a run that started at ``started``; its ``starting`` goes out at the next tick."""
        progress = RunProgress()
        with self._lock:
            self._runs[task.trajectory_id] = _Tracked(task, started, progress)
        return progress

    def finish(self, task: RolloutTask, status: str) -> None:
        """The run ended with ``status``; its ``done`` goes out at the next tick."""
        with self._lock:
            tracked = self._runs.pop(task.trajectory_id, None)
            if tracked is not None:
                self._ended.append((tracked, status))

    def tick(self, now: float | None = None) -> int:
        """Emit what is due (see the module doc); returns how many events were written."""
        now = time.time() if now is None else now
        with self._lock:
            ended, self._ended = self._ended, []
            running = list(self._runs.values())
        forced = [self._event(t, ProgressPhase.DONE, None, now, status) for t, status in ended]
        maybe = []
        for tracked in running:
            phase, tool, changed = tracked.progress.take()
            if changed:
                forced.append(self._event(tracked, phase, tool, now))
            elif self.throttle.due(tracked.task.trajectory_id, now):
                maybe.append(self._event(tracked, phase, tool, now))
        sent = 0
        if self.store is not None and (forced or maybe):
            sent = self._write(self.store, forced, maybe, now)
        for tracked, _ in ended:
            self.throttle.forget(tracked.task.trajectory_id)
        return sent

    # ------------------------------------------------------------------ internals
    def _event(
        self,
        tracked: _Tracked,
        phase: ProgressPhase,
        tool: str | None,
        now: float,
        status: str | None = None,
    ) -> TrajectoryProgress:
        task = tracked.task
        return TrajectoryProgress(
            trajectory_id=task.trajectory_id,
            task_id=task.task_id,
            batch_id=task.batch_id,
            job_id=task.job_id,
            instance_id=task.instance_id,
            sample_index=task.sample_index,
            attempt=task.attempt,
            node=self.node,
            phase=phase,
            current_tool=tool,
            started_at=tracked.started,
            elapsed_s=round(max(0.0, now - tracked.started), 1),
            ts=now,
            status=status,
        )

    def _write(
        self,
        store: ProgressStore,
        forced: list[TrajectoryProgress],
        maybe: list[TrajectoryProgress],
        now: float,
    ) -> int:
        """Add the record counts, keep the events the throttle admits (``forced``: phase
        changes and ends, always), write them. Never raises: a Redis failure drops them."""
        try:
            found = store.record_counts([e.trajectory_id for e in forced + maybe])
        except redis.RedisError as exc:
            return self._dropped(exc)
        counted = [_counted(e, *found.get(e.trajectory_id, (0, 0))) for e in forced + maybe]
        sent = [e for i, e in enumerate(counted) if self.throttle.admit(e, now) or i < len(forced)]
        try:
            store.emit(*sent)
        except redis.RedisError as exc:
            return self._dropped(exc)
        self._failing = False
        return len(sent)

    def _dropped(self, exc: redis.RedisError) -> int:
        if not self._failing:
            log.warning("progress events dropped: Redis failed (%s)", exc)
        self._failing = True
        return 0
