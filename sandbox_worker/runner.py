"""What a sandbox worker runs for one task: the trajectory-runner protocol.

A *runner* turns one :class:`RolloutTask` into an :class:`Outcome`. The real runner
(:class:`sandbox_worker.sandbox_runner.SandboxTrajectoryRunner`: sandbox -> OpenHands agent ->
patch -> evaluation in a fresh sandbox) and the simulated one used by scheduling tests and
benchmarks (:class:`sandbox_worker.testing.simulated.SimulatedRunner`) implement the same
protocol, so the worker's slot, heartbeat, cancel and shutdown logic is tested once for both.
:func:`sandbox_worker.factory.build_runner` builds the one ``WorkerConfig.backend`` asks for.

Contract for implementations:

* ``run`` blocks until the trajectory ends and returns an ``Outcome``. Infrastructure failures
  (sandbox cannot be created, model endpoint unreachable...) are ``aborted`` with a reason, never
  a reward of 0; an exception escaping ``run`` is treated the same way by the worker.
* ``ctx.cancel`` is set when the task's batch is cancelled or the worker shuts down; the runner
  must then stop promptly (between agent steps is fine) and return ``aborted`` with
  ``ctx.cancel.reason`` as the reason. What it reports after a cancel is not used for training.
* ``run`` is called from several threads at once (one per slot); it must be thread-safe.
* ``ctx.progress`` takes the run's phase and current tool for the progress events users see
  (:mod:`sandbox_worker.progress`); telling it is optional and never fails the run.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sandbox_worker.progress import RunProgress
from services.protocol.tasks import RolloutTask
from services.protocol.trajectory import Outcome

CANCELLED = "cancelled"  # the task's batch was cancelled
SHUTDOWN = "worker shutdown"  # the worker is stopping; the task will be handed back


class CancelToken:
    """A cancellation flag with a reason; the first reason given wins."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._reason: str | None = None

    def cancel(self, reason: str) -> bool:
        """Set the flag; returns False if it was already set (the first reason stays)."""
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
        self._event.set()
        return True

    @property
    def reason(self) -> str | None:
        return self._reason

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until cancelled or ``timeout``; True if cancelled."""
        return self._event.wait(timeout)


@dataclass
class RunContext:
    node: str
    cancel: CancelToken
    log: logging.Logger | logging.LoggerAdapter[logging.Logger]
    entry_id: str = ""  # the stream entry standing for this run (diagnostics)
    extra: dict[str, Any] = field(default_factory=dict)
    progress: RunProgress = field(default_factory=RunProgress)  # phase and tool, for users


@runtime_checkable
class TrajectoryRunner(Protocol):
    def run(self, task: RolloutTask, ctx: RunContext) -> Outcome: ...


@runtime_checkable
class NodeCleaner(Protocol):
    """The part of a sandbox backend the worker needs: remove a crashed run's leftovers."""

    def cleanup_node(self, node: str) -> int: ...


class RunnerUnavailableError(RuntimeError):
    """The runner for the configured backend cannot be built (the message says what to do)."""
