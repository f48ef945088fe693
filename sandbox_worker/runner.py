"""What a sandbox worker runs for one task: the trajectory-runner protocol.

A runner turns one :class:`RolloutTask` into an :class:`Outcome`. The real runner (sandbox ->
OpenHands agent -> patch -> evaluation in a fresh sandbox) and the :class:`SimulatedRunner`
used by scheduling tests and benchmarks implement the same protocol, so the worker's slot,
heartbeat, cancel and shutdown logic is tested once for both.

Contract for implementations:

* ``run`` blocks until the trajectory ends and returns an ``Outcome``. Infrastructure failures
  (sandbox cannot be created, model endpoint unreachable...) are ``aborted`` with a reason, never
  a reward of 0; an exception escaping ``run`` is treated the same way by the worker.
* ``ctx.cancel`` is set when the task's batch is cancelled or the worker shuts down; the runner
  must then stop promptly (between agent steps is fine) and return ``aborted`` with
  ``ctx.cancel.reason`` as the reason. What it reports after a cancel is not used for training.
* ``run`` is called from several threads at once (one per slot); it must be thread-safe.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import redis

from sandbox_worker.config import SimulatedRunnerConfig, WorkerConfig
from services.protocol.tasks import RolloutTask
from services.protocol.trajectory import Outcome, OutcomeStatus
from services.queue.connection import retry_forever

_log = logging.getLogger("swerl.worker.simulated")

CANCELLED = "cancelled"  # the task's batch was cancelled
SHUTDOWN = "worker shutdown"  # the worker is stopping; the task will be handed back

#: Module and function the real (OpenHands + evaluation) runner will provide:
#: ``build_runner(cfg: WorkerConfig) -> tuple[TrajectoryRunner, NodeCleaner]``.
REAL_RUNNER_MODULE = "sandbox_worker.openhands_runner"
REAL_RUNNER_FACTORY = "build_runner"


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


@runtime_checkable
class TrajectoryRunner(Protocol):
    def run(self, task: RolloutTask, ctx: RunContext) -> Outcome: ...


@runtime_checkable
class NodeCleaner(Protocol):
    """The part of a sandbox backend the worker needs: remove a crashed run's leftovers."""

    def cleanup_node(self, node: str) -> int: ...


class RunnerUnavailableError(RuntimeError):
    """The runner for the configured backend cannot be built (the message says what to do)."""


# ---------------------------------------------------------------------------- simulated runner
@dataclass(frozen=True)
class SimulatedDirectives:
    """Behaviour requested through dot-separated tokens of the instance id (other tokens are
    ignored): ``sleep<ms>`` run that long; ``abort`` every attempt fails as infrastructure;
    ``abort<k>`` attempts 1..k fail, later ones succeed; ``reward0``/``reward1`` the reward;
    ``timeout``/``error`` that outcome status; ``raise`` the runner raises an exception.
    Example: ``task7.sleep250.abort1``."""

    sleep_s: float | None = None
    abort_attempts: int = 0  # -1: every attempt
    reward: float | None = None
    status: OutcomeStatus | None = None
    crash: bool = False


def parse_directives(instance_id: str) -> SimulatedDirectives:
    sleep_s: float | None = None
    abort = 0
    reward: float | None = None
    status: OutcomeStatus | None = None
    crash = False
    for tok in instance_id.split("."):
        if tok.startswith("sleep") and tok[5:].isdigit():
            sleep_s = int(tok[5:]) / 1000.0
        elif tok == "abort":
            abort = -1
        elif tok.startswith("abort") and tok[5:].isdigit():
            abort = int(tok[5:])
        elif tok in ("reward0", "reward1"):
            reward = float(tok[-1])
        elif tok == "timeout":
            status = OutcomeStatus.TIMEOUT
        elif tok == "error":
            status = OutcomeStatus.ERROR
        elif tok == "raise":
            crash = True
    return SimulatedDirectives(sleep_s, abort, reward, status, crash)


_PROBE_START = """
local r = redis.call('INCR', KEYS[1])
if r > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], r) end
redis.call('RPUSH', KEYS[3], ARGV[1])
return r
"""


class SimulatedProbe:
    """Records simulated runs in Redis, independently of the queue's own bookkeeping.

    Keys (under ``<prefix>sim:``): ``running:<node>`` runs in progress, ``max:<node>`` the
    highest value it reached, ``starts`` and ``runs`` JSON lines of every start and every end.
    A run killed with its worker has a start and no end.
    """

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.base = f"{prefix}sim:"
        self._start = client.register_script(_PROBE_START)

    def started(self, node: str, task: RolloutTask) -> float:
        t0 = time.time()
        rec = {"task_id": task.task_id, "attempt": task.attempt, "node": node, "t0": t0}
        keys = [f"{self.base}running:{node}", f"{self.base}max:{node}", f"{self.base}starts"]
        # Retried across Redis outages: a measurement must not turn into a failed run.
        retry_forever(
            lambda: self._start(keys=keys, args=[json.dumps(rec)]), what="probe", log=_log
        )
        return t0

    def ended(self, node: str, task: RolloutTask, t0: float, outcome: Outcome) -> None:
        rec = {
            "task_id": task.task_id,
            "attempt": task.attempt,
            "node": node,
            "t0": t0,
            "t1": time.time(),
            "status": str(outcome.status),
            "reason": outcome.abort_reason,
        }

        def write() -> None:
            pipe = self.client.pipeline(transaction=True)
            pipe.decr(f"{self.base}running:{node}")
            pipe.rpush(f"{self.base}runs", json.dumps(rec))
            pipe.execute()

        retry_forever(write, what="probe", log=_log)

    def max_concurrent(self, node: str) -> int:
        return int(self.client.get(f"{self.base}max:{node}") or 0)

    def starts(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.client.lrange(f"{self.base}starts", 0, -1)]

    def runs(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.client.lrange(f"{self.base}runs", 0, -1)]


class SimulatedRunner:
    """A runner that only sleeps (SIMULATED: no sandbox, no agent, no tests are involved)."""

    def __init__(self, cfg: SimulatedRunnerConfig, probe: SimulatedProbe | None = None) -> None:
        self.cfg = cfg
        self.probe = probe

    def duration_for(self, task: RolloutTask, directives: SimulatedDirectives) -> float:
        if directives.sleep_s is not None:
            return directives.sleep_s
        if self.cfg.lognormal_median_s is None:
            return self.cfg.duration_s
        digest = hashlib.sha256(f"{self.cfg.seed}:{task.task_id}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "little"))
        value = rng.lognormvariate(math.log(self.cfg.lognormal_median_s), self.cfg.lognormal_sigma)
        return min(value, self.cfg.max_duration_s)

    def run(self, task: RolloutTask, ctx: RunContext) -> Outcome:
        d = parse_directives(task.instance_id)
        duration = self.duration_for(task, d)
        t0 = self.probe.started(ctx.node, task) if self.probe else time.time()
        cancelled = ctx.cancel.wait(duration) if duration > 0 else ctx.cancel.is_set()
        elapsed = time.time() - t0
        if cancelled:
            outcome = Outcome(
                status=OutcomeStatus.ABORTED,
                abort_reason=ctx.cancel.reason or CANCELLED,
                durations={"run": elapsed},
            )
        elif d.abort_attempts == -1 or task.attempt <= d.abort_attempts:
            outcome = Outcome(
                status=OutcomeStatus.ABORTED,
                abort_reason=f"simulated infrastructure failure (attempt {task.attempt})",
                durations={"run": elapsed},
            )
        else:
            reward = self.cfg.reward if d.reward is None else d.reward
            outcome = Outcome(
                status=d.status or OutcomeStatus.COMPLETED,
                reward=reward,
                n_turns=1,
                durations={"run": elapsed},
            )
        if self.probe:
            self.probe.ended(ctx.node, task, t0, outcome)
        if d.crash and not cancelled:
            raise RuntimeError("simulated runner crash")
        return outcome


# ---------------------------------------------------------------------------- factory
def build_runner(
    cfg: WorkerConfig,
    client: redis.Redis | None = None,
    *,
    module: str = REAL_RUNNER_MODULE,
) -> tuple[TrajectoryRunner, NodeCleaner | None]:
    """The runner (and the backend whose ``cleanup_node`` runs at start) for ``cfg.backend``.

    ``simulated`` needs nothing else. ``docker`` and ``bwrap`` need the real runner module
    (:data:`REAL_RUNNER_MODULE`), which provides ``build_runner(cfg) -> (runner, backend)``;
    without it this raises :class:`RunnerUnavailableError` with what to do.
    """
    if cfg.backend == "simulated":
        probe = None
        if cfg.simulated.probe:
            if client is None:
                raise ValueError("the simulated runner's probe needs a Redis client")
            probe = SimulatedProbe(client, cfg.queue.prefix)
        return SimulatedRunner(cfg.simulated, probe), None
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
            raise RunnerUnavailableError(
                f"--backend {cfg.backend} needs the OpenHands trajectory runner ({module}), "
                "which is not yet available in this build; use --backend simulated to run the "
                "worker with the simulated runner"
            ) from None
        raise RunnerUnavailableError(
            f"the trajectory runner {module} cannot be imported: missing module {exc.name!r} "
            "(is the environment complete? run `make setup`)"
        ) from exc
    factory = getattr(mod, REAL_RUNNER_FACTORY, None)
    if not callable(factory):
        raise RunnerUnavailableError(f"{module} has no {REAL_RUNNER_FACTORY}(cfg) function")
    runner, backend = factory(cfg)
    if not isinstance(runner, TrajectoryRunner):
        raise RunnerUnavailableError(f"{module}.{REAL_RUNNER_FACTORY} returned no runner")
    return runner, backend
