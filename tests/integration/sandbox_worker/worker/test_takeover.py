"""A worker restarted right after ``kill -9`` takes its node over and reaps what it left.

Real worker processes against a real Redis. The restarted worker runs in a UTS namespace with
another host name (a supervisor restarting it in a new container, or on another machine), so it
cannot tell from a pid that its predecessor is dead: it must wait for the heartbeat to expire,
then take the node over -- never exit "node already served", which leaves the node unserved.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_worker.backends import SandboxBackend, make_backend
from sandbox_worker.testing.probe import SimulatedProbe
from services.manager.client import RolloutManager
from services.protocol.trajectory import OutcomeStatus
from services.queue.submitter import SubmitterQueue
from services.store.trajectories import load_trajectory
from tests.support.docker import build_test_images, ensure_dockerd
from tests.support.execution import (
    Procs,
    kill9,
    node_cleanups,
    on_host,
    open_record,
    start_one_task,
    wait_for,
    wait_nodes,
)


def _log(procs: Procs, node: str, n: int) -> str:
    return (procs.tmp / f"{node}-{n}.log").read_text(errors="replace")


def test_restart_on_another_host_waits_for_the_heartbeat_and_takes_over(
    redis_url: str,
    queue: SubmitterQueue,
    probe: SimulatedProbe,
    procs: Procs,
    manager: RolloutManager,
) -> None:
    # A TTL long enough that the restarted worker surely starts (python, imports) before the
    # dead worker's heartbeat expires, even on a loaded machine: it must see it and wait.
    ttl = {"SWERL_WORKER__QUEUE__HEARTBEAT_TTL_S": "10"}
    first = procs.worker(redis_url, "mover", 1, fake=True, wrap=on_host("box-a"), **ttl)
    wait_nodes(queue, {"mover"}, procs)
    batch = start_one_task(manager, probe, procs, "t.sleep20000")
    open_record(redis_url, f"{batch}:0:0.a1")
    kill9(first)

    second = procs.worker(redis_url, "mover", 1, fake=True, wrap=on_host("box-b"), **ttl)
    wait_for(lambda: "taking over" in _log(procs, "mover", 1), 40, "the takeover", procs.logs)
    assert second.poll() is None, procs.logs()
    log = _log(procs, "mover", 1)
    assert "waiting up to" in log and "expired" in log, log
    assert "already served" not in log
    # the killed run's "sandbox" was reaped at takeover, before serving
    assert node_cleanups(queue) == ["mover:0", "mover:1"]
    # the task runs again, and the dead attempt's record is closed as aborted (worker lost)
    wait_for(lambda: len(probe.starts()) == 2, 30, "the second attempt", procs.logs)
    assert [(s["node"], s["attempt"]) for s in probe.starts()] == [("mover", 1), ("mover", 2)]
    record = load_trajectory(queue.redis, f"{batch}:0:0.a1", queue.cfg.prefix)
    assert record.outcome is not None and record.outcome.status is OutcomeStatus.ABORTED
    assert (record.outcome.abort_reason or "").startswith("worker lost")
    assert queue.redis.hget(f"{queue.cfg.prefix}traj:{batch}:0:0.a1:info", "status") == b"closed"
    manager.cancel(batch)


def test_restart_with_the_same_pid_in_a_new_pid_namespace_takes_over_at_once(
    redis_url: str,
    queue: SubmitterQueue,
    probe: SimulatedProbe,
    procs: Procs,
    manager: RolloutManager,
) -> None:
    """A container's supervisor restarts the worker as pid 1 again: that pid is alive (it is the
    new worker itself), yet the previous worker is provably gone."""
    in_pid_ns = ["unshare", "--pid", "--fork", "--kill-child"]
    first = procs.worker(redis_url, "pid1", slots=1, fake=True, wrap=in_pid_ns)
    wait_nodes(queue, {"pid1"}, procs)
    assert [(n.name, n.pid) for n in queue.nodes()] == [("pid1", 1)]
    batch = start_one_task(manager, probe, procs, "t.sleep1500")
    kill9(first)
    procs.worker(redis_url, "pid1", slots=1, fake=True, wrap=in_pid_ns)
    [result] = manager.collect(batch, timeout_s=30)
    assert (result.node, result.attempt) == ("pid1", 2)
    assert "waiting up to" not in _log(procs, "pid1", 1)


# -- real sandboxes -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sandbox_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    ensure_dockerd()
    return build_test_images(tmp_path_factory.mktemp("images"))


@pytest.fixture(params=["docker", "bwrap"])
def real_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SandboxBackend]:
    state_root = Path(f"/tmp/swerl-tk-{uuid.uuid4().hex[:6]}")  # short: unix socket paths
    backend = make_backend(request.param, state_root=state_root)
    yield backend
    backend.cleanup_node("reaped")
    state_root.rmdir()


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_killed_workers_sandboxes_are_reaped_at_takeover(
    redis_url: str,
    queue: SubmitterQueue,
    probe: SimulatedProbe,
    procs: Procs,
    manager: RolloutManager,
    real_backend: SandboxBackend,
    sandbox_image: str,
) -> None:
    args = [
        "--sandbox-backend",
        real_backend.name,
        "--image",
        sandbox_image,
        "--state-root",
        str(real_backend.config.state_root),  # type: ignore[attr-defined]
    ]
    node = "reaped"
    ttl = {"SWERL_WORKER__QUEUE__HEARTBEAT_TTL_S": "10"}  # the restart sees the heartbeat
    first = procs.worker(
        redis_url, node, 1, fake=True, fake_args=args, wrap=on_host("box-a"), **ttl
    )
    wait_nodes(queue, {node}, procs, timeout=60)
    batch = start_one_task(manager, probe, procs, "t.sleep60000", timeout=60)
    [old] = wait_for(lambda: real_backend.list_sandboxes(node), 60, "its sandbox", procs.logs)
    kill9(first)
    assert real_backend.list_sandboxes(node) == [old]  # outlived the worker

    procs.worker(redis_url, node, 1, fake=True, fake_args=args, wrap=on_host("box-b"), **ttl)
    # reaped when the restarted worker takes the node over, before it serves: the marker and
    # the real sandbox
    wait_for(lambda: len(node_cleanups(queue)) == 2, 60, "the takeover", procs.logs)
    assert node_cleanups(queue)[-1] == f"{node}:2"
    assert old not in real_backend.list_sandboxes(node)
    wait_for(lambda: len(probe.starts()) == 2, 60, "the second attempt", procs.logs)
    manager.cancel(batch)
    wait_for(lambda: not real_backend.list_sandboxes(node), 60, "the cancelled run's sandbox")
