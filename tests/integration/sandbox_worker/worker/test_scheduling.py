"""Worker processes against a real Redis: concurrency bounds, exactly-once, crashes, cancel.

All runs use the SIMULATED runner (it sleeps; instance-id tokens set its duration and failures)
and record their starts and ends through an independent probe in Redis.
"""

from __future__ import annotations

import collections
import json
import signal
import threading
import time
from pathlib import Path

from sandbox_worker.testing.probe import SimulatedProbe
from services.manager.client import RolloutManager
from services.protocol import RolloutRequest
from services.protocol.trajectory import OutcomeStatus
from services.queue.submitter import SubmitterQueue
from tests.support.execution import (
    Procs,
    kill9,
    node_cleanups,
    start_one_task,
    wait_for,
    wait_nodes,
)


def test_three_nodes_thirty_tasks_bounded_and_exactly_once(
    redis_url: str, queue: SubmitterQueue, probe: SimulatedProbe, procs: Procs
) -> None:
    """3 worker processes x 2 slots, 30 tasks, dispatch by the manager CLI process."""
    nodes = {"n1", "n2", "n3"}
    for node in sorted(nodes):
        procs.worker(redis_url, node, slots=2)
    procs.manager(redis_url, "--prefetch", "1")
    wait_nodes(queue, nodes, procs)

    # Outstanding per node (queued on its stream + running) sampled while the batch runs.
    peak_outstanding: collections.Counter[str] = collections.Counter()
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for n in queue.nodes():
                peak_outstanding[n.name] = max(peak_outstanding[n.name], n.outstanding)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    ids = [f"i{k}.sleep{150 + 50 * (k % 4)}.reward{k % 2}" for k in range(15)]
    mgr = RolloutManager(queue=queue)
    batch = mgr.submit(RolloutRequest(instance_ids=ids, n_samples=2))
    results = mgr.collect(batch, timeout_s=60)
    stop.set()
    sampler.join()

    assert sorted(r.task_id for r in results) == sorted(
        f"{batch}:{i}:{s}" for i in range(15) for s in range(2)
    )
    for r in results:
        idx = int(r.task_id.split(":")[1])
        assert r.outcome.status is OutcomeStatus.COMPLETED
        assert r.outcome.reward == float(idx % 2)  # from the instance id's reward token
        assert r.attempt == 1 and r.node in nodes
    runs = probe.runs()
    assert len(runs) == 30 and len({r["task_id"] for r in runs}) == 30, "a task ran twice"
    assert len(probe.starts()) == 30
    for node in nodes:
        assert probe.max_concurrent(node) == 2, f"{node} ran {probe.max_concurrent(node)} at once"
        assert peak_outstanding[node] <= 3, f"{node} held {peak_outstanding[node]} > slots+prefetch"
    assert {r["node"] for r in runs} == nodes  # the work was spread over every node
    prog = mgr.progress(batch)
    assert (prog.done, prog.completed, prog.running, prog.queued) == (30, 30, 0, 0)
    assert all(n.outstanding == 0 for n in queue.nodes())


def test_kill9_task_redelivered_to_other_node_and_restart_cleans(
    redis_url: str,
    queue: SubmitterQueue,
    probe: SimulatedProbe,
    procs: Procs,
    manager: RolloutManager,
) -> None:
    sandboxes = procs.tmp / "sb"
    victim_proc = {n: procs.worker(redis_url, n, slots=1, fake=True) for n in ("a", "b")}
    wait_nodes(queue, {"a", "b"}, procs)
    batch = start_one_task(manager, probe, procs, "long.sleep2500")
    victim = probe.starts()[0]["node"]
    other = "b" if victim == "a" else "a"
    assert len(list((sandboxes / victim).glob("*"))) == 1  # its "sandbox" exists
    kill9(victim_proc[victim])

    [result] = manager.collect(batch, timeout_s=30)
    assert result.node == other
    assert result.attempt == 2 and result.trajectory_id == f"{batch}:0:0.a2"
    assert result.outcome.status is OutcomeStatus.COMPLETED
    starts = probe.starts()
    assert [(s["node"], s["attempt"]) for s in starts] == [(victim, 1), (other, 2)]
    assert [(r["node"], r["attempt"]) for r in probe.runs()] == [(other, 2)]
    prog = manager.progress(batch)
    assert (prog.done, prog.requeued, prog.completed) == (1, 1, 1)
    # The killed run's sandbox is still there until a worker of that node starts again.
    assert len(list((sandboxes / victim).glob("*"))) == 1
    procs.worker(redis_url, victim, slots=1, fake=True)
    wait_nodes(queue, {victim}, procs)
    assert node_cleanups(queue)[-1] == f"{victim}:1"
    assert list((sandboxes / victim).glob("*")) == []


def test_kill9_restart_same_node_recovers_its_own_task(
    redis_url: str,
    queue: SubmitterQueue,
    probe: SimulatedProbe,
    procs: Procs,
    manager: RolloutManager,
) -> None:
    """A worker restarted at once (before its heartbeat expires) hands back what it had."""
    proc = procs.worker(redis_url, "solo", slots=1, fake=True)
    wait_nodes(queue, {"solo"}, procs)
    batch = start_one_task(manager, probe, procs, "t.sleep1500")
    kill9(proc)
    procs.worker(redis_url, "solo", slots=1, fake=True)
    [result] = manager.collect(batch, timeout_s=30)
    assert (result.node, result.attempt) == ("solo", 2)
    assert [s["attempt"] for s in probe.starts()] == [1, 2]
    assert len(probe.runs()) == 1
    state = queue.task_state(f"{batch}:0:0")
    assert state["lost"] == "1" and "restarted" in state["last_error"]
    assert node_cleanups(queue) == ["solo:0", "solo:1"]


def test_cancel_stops_running_and_drops_pending(
    redis_url: str,
    queue: SubmitterQueue,
    probe: SimulatedProbe,
    procs: Procs,
    manager: RolloutManager,
) -> None:
    for node in ("c1", "c2"):
        procs.worker(redis_url, node, slots=2)
    wait_nodes(queue, {"c1", "c2"}, procs)
    batch = manager.submit(RolloutRequest(instance_ids=["slow.sleep60000"], n_samples=12))
    wait_for(lambda: len(probe.starts()) == 4, 20, "4 running trajectories", procs.logs)
    t0 = time.monotonic()
    assert manager.cancel(batch) == 12
    prog = manager.progress(batch)
    assert (prog.state, prog.done, prog.cancelled, prog.running) == ("cancelled", 12, 12, 0)
    results = manager.collect(batch, timeout_s=5)
    assert len(results) == 12
    for r in results:
        assert r.outcome.status is OutcomeStatus.ABORTED and r.outcome.reward is None
        assert r.outcome.abort_reason == "cancelled"
    # The running trajectories really stop, within seconds (not after their 60 s).
    wait_for(lambda: len(probe.runs()) == 4, 5, "the 4 runs to stop", procs.logs)
    assert time.monotonic() - t0 < 5
    assert {r["reason"] for r in probe.runs()} == {"cancelled"}
    time.sleep(0.5)
    assert len(probe.starts()) == 4, "a task of the cancelled batch started after the cancel"
    # The slots are free again: a new batch runs at once.
    nxt = manager.submit(RolloutRequest(instance_ids=["quick.sleep10"], n_samples=4))
    assert len(manager.collect(nxt, timeout_s=20)) == 4
    wait_for(lambda: all(n.outstanding == 0 for n in queue.nodes()), 5, "outstanding 0")


def test_infra_failures_retried_up_to_limit_then_aborted(
    redis_url: str,
    queue: SubmitterQueue,
    probe: SimulatedProbe,
    procs: Procs,
    manager: RolloutManager,
) -> None:
    procs.worker(redis_url, "r1", slots=2)
    wait_nodes(queue, {"r1"}, procs)
    batch = manager.submit(
        RolloutRequest(instance_ids=["x.abort", "y.abort1", "z.raise"], max_attempts=3)
    )
    by_id = {r.task_id: r for r in manager.collect(batch, timeout_s=30)}
    always, once, crash = by_id[f"{batch}:0:0"], by_id[f"{batch}:1:0"], by_id[f"{batch}:2:0"]
    assert always.outcome.status is OutcomeStatus.ABORTED and always.outcome.reward is None
    assert always.attempt == 3 and "simulated infrastructure failure" in always.outcome.abort_reason
    assert once.outcome.status is OutcomeStatus.COMPLETED and once.attempt == 2
    assert crash.outcome.status is OutcomeStatus.ABORTED and crash.outcome.reward is None
    assert crash.attempt == 3 and "runner failed" in crash.outcome.abort_reason
    runs = collections.Counter(r["task_id"] for r in probe.runs())
    assert runs == {always.task_id: 3, once.task_id: 2, crash.task_id: 3}
    prog = manager.progress(batch)
    assert (prog.done, prog.aborted, prog.completed, prog.retries) == (3, 2, 1, 5)


def test_poison_payloads_are_dead_lettered_and_the_worker_survives(
    redis_url: str, queue: SubmitterQueue, procs: Procs
) -> None:
    proc = procs.worker(redis_url, "p1", slots=1)
    wait_nodes(queue, {"p1"}, procs)
    manager = RolloutManager(queue=queue)  # its dispatch loop starts after the corruption
    stream = queue.keys.node_stream("p1")
    queue.redis.xadd(stream, {"junk": "1"})
    queue.redis.xadd(stream, {"task_id": "t", "attempt": "1", "payload": "{not json"})
    queue.redis.xadd(stream, {"task_id": "t", "attempt": "one", "payload": "{}"})
    queue.redis.xadd(stream, {"task_id": "t", "attempt": "1", "payload": '{"task_id": "t"}'})
    queue.redis.xadd(stream, {"task_id": "t", "attempt": "1", "payload": b"\xff\xfe"})
    unknown_kind = {"task_id": "t", "batch_id": "b", "group_id": "g", "instance_id": "i",
                    "kind": "math"}  # fmt: skip
    queue.redis.xadd(stream, {"task_id": "t", "attempt": "1", "payload": json.dumps(unknown_kind)})
    queue.redis.lpush(queue.keys.pending, "no-such-task")
    # A real task whose stored payload got corrupted: dead-lettered AND reported aborted.
    batch = manager.submit(RolloutRequest(instance_ids=["ok.sleep10", "bad"], n_samples=1))
    queue.redis.hset(queue.keys.task(f"{batch}:1:0"), "payload", '{"task_id": 5}')
    manager.start()
    try:
        by_id = {r.task_id: r for r in manager.collect(batch, timeout_s=30)}
    finally:
        manager.stop()
    assert by_id[f"{batch}:0:0"].outcome.status is OutcomeStatus.COMPLETED
    bad = by_id[f"{batch}:1:0"].outcome
    assert bad.status is OutcomeStatus.ABORTED and bad.reward is None
    assert bad.abort_reason.startswith("dead-lettered: invalid task entry")
    reasons = [d.reason for d in queue.dead_letters()]
    assert any("missing field(s) task_id, attempt, payload" in r for r in reasons)
    assert any("payload is not JSON" in r for r in reasons)
    assert any("attempt is not an integer" in r for r in reasons)
    assert any("payload is not a valid task" in r for r in reasons)
    assert "unknown task id in the pending list" in reasons
    assert any("kind: Input should be 'swe' or 'toy'" in r for r in reasons), reasons
    assert len(reasons) == 8, reasons
    junk = next(d for d in queue.dead_letters() if "missing field" in d.reason)
    assert '"junk": "1"' in junk.fields["fields"]  # the original entry is kept, not lost
    assert proc.poll() is None, "the worker died on a poison payload"
    assert queue.redis.xlen(stream) == 0  # nothing left behind on the stream
    assert manager.progress(batch).dead_lettered == 1


def test_sigterm_finishes_short_tasks_and_hands_back_the_rest(
    redis_url: str,
    queue: SubmitterQueue,
    probe: SimulatedProbe,
    procs: Procs,
    manager: RolloutManager,
) -> None:
    proc = procs.worker(redis_url, "g1", slots=2, SWERL_WORKER__SHUTDOWN_GRACE_S="1.5")
    wait_nodes(queue, {"g1"}, procs)
    batch = manager.submit(
        RolloutRequest(instance_ids=["short.sleep600", "long.sleep60000", "queued.sleep10"])
    )
    wait_for(lambda: len(probe.starts()) == 2, 20, "two running tasks", procs.logs)
    wait_for(
        lambda: queue.task_state(f"{batch}:2:0").get("state") == "dispatched",
        5,
        "the third task to be prefetched",
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    short, long_, queued = (queue.task_state(f"{batch}:{i}:0") for i in range(3))
    assert short["state"] == "done"
    assert (long_["state"], long_["attempt"], long_["last_error"]) == (
        "pending",
        "2",
        "worker shutdown",
    )
    assert (queued["state"], queued["attempt"]) == ("pending", "1")
    assert {r["task_id"]: r["status"] for r in probe.runs()} == {
        f"{batch}:0:0": "completed",
        f"{batch}:1:0": "aborted",
    }
    [g1] = queue.nodes()
    assert g1.name == "g1" and not g1.alive  # its heartbeat is gone at once, not after its TTL
    assert manager.progress(batch).requeued == 2
    manager.cancel(batch)


def test_second_worker_with_a_live_node_name_refuses_to_start(
    redis_url: str, queue: SubmitterQueue, procs: Procs, tmp_path: Path
) -> None:
    procs.worker(redis_url, "dup", slots=1)
    wait_nodes(queue, {"dup"}, procs)
    second = procs.worker(redis_url, "dup", slots=1)
    assert second.wait(timeout=30) == 1
    log = "".join(p.read_text() for p in tmp_path.glob("dup-1.log"))
    assert "already served by a live worker" in log
