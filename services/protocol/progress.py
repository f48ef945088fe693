"""Per-trajectory progress events: what a running trajectory is doing, for the people watching.

A sandbox worker emits one :class:`TrajectoryProgress` per running trajectory when its phase
changes (within a second: :mod:`sandbox_worker.progress`) and, while it runs, at most once per
:data:`PROGRESS_INTERVAL_S` when its turn, tokens or current tool changed (and at least once per
:data:`PROGRESS_KEEPALIVE_S`, so a long tool call is never silence). :class:`ProgressThrottle`
is that rule. The events go to a Redis stream per batch (:mod:`services.store.progress`: key,
``MAXLEN``, TTL); the job API serves them (``GET /v1/jobs/{id}/progress``) and
``swerl status --watch`` / ``swerl logs`` print them.

Events are advisory: they are never used for training or grading, a lost one costs nothing,
and emitting one never fails a trajectory.
"""

from __future__ import annotations

import threading
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from services.protocol.ids import Ident, InstanceKey

#: While a trajectory runs, at most one event per this many seconds (phase changes excepted).
PROGRESS_INTERVAL_S = 5.0
#: An unchanged running trajectory is re-emitted this often (its elapsed time moves on).
PROGRESS_KEEPALIVE_S = 60.0
TOOL_NAME_MAX = 100
STATUS_MAX = 64


class ProgressPhase(StrEnum):
    STARTING = "starting"  # the worker took the task (the record is being opened)
    SANDBOX_START = "sandbox_start"  # the agent sandbox is being created and prepared
    AGENT = "agent"  # the agent runs: turns and tool calls
    GRADING = "grading"  # the patch is evaluated in a fresh sandbox
    DONE = "done"  # the trajectory ended (``status`` says how)


class TrajectoryProgress(BaseModel):
    """One trajectory's progress at ``ts`` (seconds since the epoch)."""

    model_config = ConfigDict(extra="forbid")

    trajectory_id: Ident
    task_id: Ident
    batch_id: Ident
    job_id: Ident = "default"
    instance_id: InstanceKey
    sample_index: int = Field(0, ge=0)
    attempt: int = Field(1, ge=1)
    node: Ident
    phase: ProgressPhase
    turn: int = Field(0, ge=0)  # assistant turns recorded so far
    tokens: int = Field(0, ge=0)  # tokens recorded so far (prompts, observations, generated)
    current_tool: str | None = Field(None, max_length=TOOL_NAME_MAX)  # the tool running now
    started_at: float = Field(ge=0.0)  # when the worker took the task
    elapsed_s: float = Field(ge=0.0)
    ts: float = Field(ge=0.0)
    status: str | None = Field(None, max_length=STATUS_MAX)  # phase done: the outcome status

    def state(self) -> tuple[object, ...]:
        """What a watcher cares about (not the clock): equal states need no new event."""
        return (self.phase, self.turn, self.tokens, self.current_tool, self.status)


class ProgressThrottle:
    """Whether an event is worth emitting: a phase change always; otherwise a changed state once
    ``interval_s`` has passed since the trajectory's last event, an unchanged one once
    ``keepalive_s`` has. Thread-safe; call :meth:`forget` when a trajectory ends."""

    def __init__(
        self, interval_s: float = PROGRESS_INTERVAL_S, keepalive_s: float = PROGRESS_KEEPALIVE_S
    ) -> None:
        if not 0 <= interval_s <= keepalive_s:
            raise ValueError("need 0 <= interval_s <= keepalive_s")
        self.interval_s, self.keepalive_s = interval_s, keepalive_s
        self._last: dict[str, tuple[float, tuple[object, ...]]] = {}
        self._lock = threading.Lock()

    def due(self, trajectory_id: str, now: float) -> bool:
        """Could anything but a phase change be emitted now (the interval has passed)?"""
        with self._lock:
            last = self._last.get(trajectory_id)
        return last is None or now - last[0] >= self.interval_s

    def admit(self, event: TrajectoryProgress, now: float) -> bool:
        """True (and remembered as emitted) when ``event`` should be emitted now."""
        state = event.state()
        with self._lock:
            last = self._last.get(event.trajectory_id)
            if last is not None and last[1][0] == event.phase:
                wait = self.interval_s if last[1] != state else self.keepalive_s
                if now - last[0] < wait:
                    return False
            self._last[event.trajectory_id] = (now, state)
        return True

    def forget(self, trajectory_id: str) -> None:
        with self._lock:
            self._last.pop(trajectory_id, None)
