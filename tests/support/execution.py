"""Fixtures for the execution-plane tests: worker/manager processes that never outlive a test."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from sandbox_worker.testing.probe import SimulatedProbe
from services.manager.client import RolloutManager
from services.manager.config import ManagerConfig
from services.processes import ManagedProcess, launch
from services.protocol import RolloutRequest
from services.protocol.trajectory import TrajectoryMeta
from services.queue.config import QueueConfig
from services.queue.submitter import SubmitterQueue
from services.store.trajectories import TrajectoryStore
from tests.support.paths import REPO_ROOT

REPO = REPO_ROOT

# Short timings so that dead nodes are noticed within seconds, with margin for a loaded
# 2-core machine (a live worker must never look dead: that would re-run its tasks).
HEARTBEAT_TTL_S = 3.0
CLAIM_MIN_IDLE_S = 2.0
WORKER_ENV = {
    "SWERL_WORKER__HEARTBEAT_INTERVAL_S": "0.5",
    "SWERL_WORKER__QUEUE__HEARTBEAT_TTL_S": str(HEARTBEAT_TTL_S),
    "SWERL_WORKER__QUEUE__CLAIM_MIN_IDLE_S": str(CLAIM_MIN_IDLE_S),
    "SWERL_WORKER__BLOCK_MS": "200",
    "SWERL_WORKER__SIMULATED__PROBE": "true",
    "SWERL_WORKER__SHUTDOWN_GRACE_S": "5",
    "SWERL_WORKER__CANCEL_STOP_TIMEOUT_S": "5",
    "PYTHONDONTWRITEBYTECODE": "1",
}
QUEUE_CFG = QueueConfig(heartbeat_ttl_s=HEARTBEAT_TTL_S, claim_min_idle_s=CLAIM_MIN_IDLE_S)
MANAGER_CFG = ManagerConfig(poll_interval_s=0.1, reclaim_interval_s=0.3, queue=QUEUE_CFG)


def on_host(hostname: str) -> list[str]:
    """A command prefix that runs a process in a UTS namespace of its own named ``hostname``
    (a worker restarted by a supervisor in a new container, or on another machine)."""
    return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname]


class Procs:
    """Starts worker and manager processes; every one is killed at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[ManagedProcess] = []

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str], wrap: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{name}-{len(self.started)}.log"
        proc = launch(
            name, [*wrap, sys.executable, *argv], log, env={**WORKER_ENV, **env}, cwd=REPO
        )
        self.started.append(proc)
        return proc.popen

    def worker(
        self,
        url: str,
        node: str,
        slots: int = 2,
        *,
        fake: bool = False,
        fake_args: Sequence[str] = (),
        wrap: Sequence[str] = (),
        **env: str,
    ) -> subprocess.Popen[bytes]:
        """``python -m sandbox_worker`` (simulated), or the fake-backend worker with ``fake``
        (``fake_args`` go to it). ``wrap`` prefixes the command (e.g. :func:`on_host`)."""
        if fake:
            argv = ["-m", "tests.support.fake_worker", "--dir", str(self.tmp / "sb")]
            argv += fake_args
        else:
            argv = ["-m", "sandbox_worker", "--backend", "simulated"]
        argv += ["--redis", url, "--node", node, "--slots", str(slots)]
        return self._spawn(node, argv, env, wrap)

    def manager(self, url: str, *args: str) -> subprocess.Popen[bytes]:
        env = {
            "SWERL_MANAGER__POLL_INTERVAL_S": "0.1",
            "SWERL_MANAGER__RECLAIM_INTERVAL_S": "0.3",
            "SWERL_MANAGER__QUEUE__HEARTBEAT_TTL_S": str(HEARTBEAT_TTL_S),
            "SWERL_MANAGER__QUEUE__CLAIM_MIN_IDLE_S": str(CLAIM_MIN_IDLE_S),
        }
        return self._spawn("manager", ["-m", "services.manager", "--redis", url, *args], env)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.tmp.glob("*.log"))
        )

    def close(self) -> None:
        for proc in self.started:
            proc.stop(grace_s=0)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.close()


@pytest.fixture
def queue(redis_url: str) -> Iterator[SubmitterQueue]:
    q = SubmitterQueue(redis_url, QUEUE_CFG)
    yield q
    q.close()


@pytest.fixture
def manager(redis_url: str) -> Iterator[RolloutManager]:
    """A RolloutManager whose dispatch loop runs in a background thread of the test."""
    mgr = RolloutManager(redis_url, MANAGER_CFG)
    mgr.start()
    yield mgr
    mgr.close()


@pytest.fixture
def probe(queue: SubmitterQueue) -> SimulatedProbe:
    return SimulatedProbe(queue.redis, queue.cfg.prefix)


def wait_for(
    cond: Callable[[], object], timeout: float, what: str, logs: Callable[[], str] | None = None
) -> object:
    """Poll ``cond`` until it is truthy; fail with ``what`` (and process logs) on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}\n{logs() if logs else ''}")
        time.sleep(0.05)


def wait_nodes(queue: SubmitterQueue, names: set[str], procs: Procs, timeout: float = 30.0) -> None:
    wait_for(
        lambda: names <= {n.name for n in queue.nodes() if n.alive},
        timeout,
        f"nodes {sorted(names)} to heartbeat",
        procs.logs,
    )


def open_record(redis_url: str, trajectory_id: str) -> None:
    """Open a trajectory record in the store, as the adapter does when a worker starts a run."""

    async def _open() -> None:
        store = TrajectoryStore.from_url(redis_url)
        try:
            await store.open(TrajectoryMeta(trajectory_id=trajectory_id))
        finally:
            await store.close_connection()

    asyncio.run(_open())


def start_one_task(
    manager: RolloutManager,
    probe: SimulatedProbe,
    procs: Procs,
    instance_id: str,
    timeout: float = 20.0,
) -> str:
    """Submit one sample of ``instance_id``; return its batch id once the task has started."""
    batch = manager.submit(RolloutRequest(instance_ids=[instance_id], n_samples=1))
    wait_for(probe.starts, timeout, "the task to start", procs.logs)
    return batch


def kill9(proc: subprocess.Popen[bytes]) -> None:
    """``kill -9`` a worker process and reap it (no shutdown path of its own runs)."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def cleanup_key(queue: SubmitterQueue) -> str:
    """The list the FAKE node cleaner appends ``<node>:<removed count>`` to (fake_worker.py)."""
    return f"{queue.cfg.prefix}test:cleanup"


def node_cleanups(queue: SubmitterQueue) -> list[str]:
    """Every node cleanup recorded so far, oldest first."""
    return [c.decode() for c in queue.redis.lrange(cleanup_key(queue), 0, -1)]
