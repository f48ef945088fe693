"""The queue layer's transitions against a real Redis, driven step by step (no processes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from sandbox_worker.config import WorkerConfig
from sandbox_worker.testing.probe import SimulatedProbe
from sandbox_worker.testing.simulated import SimulatedRunner
from sandbox_worker.worker import Worker
from services.manager.api import RolloutManager, tasks_for_request
from services.manager.service import ManagerService
from services.protocol import RolloutRequest, TaskResult
from services.protocol.trajectory import Outcome, OutcomeStatus
from services.queue.config import QueueConfig
from services.queue.entries import decode_task_entry
from services.queue.keys import WORKER_GROUP
from services.queue.store import BatchConflictError, QueueError, TaskQueue, UnknownBatchError
from services.store.trajectories import (
    TrajectoryKeys,
    abort_lost_trajectory,
    load_trajectory,
)
from tests.support.execution import MANAGER_CFG, open_record, wait_for

NODE = "n1"


def beat(q: TaskQueue, node: str = NODE, slots: int = 2, **extra: str) -> None:
    q.heartbeat(node, {"slots": slots, "busy": 0, "draining": "0", **extra})


def submit(q: TaskQueue, n: int = 1, batch: str = "b1", **kw: object) -> list[str]:
    req = RolloutRequest(batch_id=batch, instance_ids=[f"i{k}" for k in range(n)], **kw)
    tasks = tasks_for_request(req)
    q.submit_batch(batch, req.job_id, req.model_dump_json(), tasks)
    return [t.task_id for t in tasks]


def take(q: TaskQueue, node: str = NODE, count: int = 10) -> list[tuple[str, str, int]]:
    """Read entries as the node's worker: (entry id, task id, attempt)."""
    out = []
    for eid, fields in q.read_tasks(node, count, 1):
        entry = decode_task_entry(eid, fields)
        out.append((eid, entry.task.task_id, entry.task.attempt))
    return out


def result(tid: str, attempt: int, status: str = "completed", node: str = NODE) -> TaskResult:
    if status == "aborted":
        outcome = Outcome(status=OutcomeStatus.ABORTED, abort_reason="sandbox gone")
    else:
        outcome = Outcome(status=OutcomeStatus(status), reward=1.0)
    return TaskResult(
        task_id=tid,
        batch_id=tid.split(":")[0],
        trajectory_id=f"{tid}.a{attempt}",
        node=node,
        attempt=attempt,
        outcome=outcome,
    )


@pytest.fixture
def q(redis_url: str) -> Iterator[TaskQueue]:
    queue = TaskQueue(redis_url, QueueConfig(claim_min_idle_s=0.2, max_deliveries=2))
    queue.ensure_group(NODE)
    yield queue
    queue.close()


def test_submit_is_idempotent_and_rejects_a_conflicting_request(q: TaskQueue) -> None:
    submit(q, 2)
    submit(q, 2)  # same request again: no-op
    assert q.progress("b1").total == 2 and q.pending_count() == 2
    with pytest.raises(BatchConflictError, match="already exists with a different request"):
        submit(q, 3)
    with pytest.raises(UnknownBatchError, match="unknown batch 'nope'"):
        q.progress("nope")
    with pytest.raises(UnknownBatchError):
        q.cancel("nope")
    with pytest.raises(QueueError, match="has no tasks"):
        q.submit_batch("b2", "default", "{}", [])


def test_dispatch_respects_budget_liveness_and_draining(q: TaskQueue) -> None:
    submit(q, 5)
    assert q.dispatch(NODE, 3, 10) == (0, -1)  # no heartbeat: a dead node gets nothing
    beat(q)
    assert q.dispatch(NODE, 3, 10) == (3, 2)
    assert q.dispatch(NODE, 3, 10) == (0, 2)  # outstanding == max_outstanding
    [(eid, tid, _), *_] = take(q)
    assert q.start(tid, eid, NODE) == "running"
    assert q.complete(result(tid, 1), eid) == "final"
    assert q.dispatch(NODE, 3, 10) == (1, 1)  # one slot of budget came back
    q.set_draining(NODE)
    assert q.dispatch(NODE, 5, 10) == (0, -2)


def test_a_task_that_ran_twice_is_reported_once(q: TaskQueue) -> None:
    [tid] = submit(q)
    beat(q)
    q.dispatch(NODE, 2, 1)
    [(eid, _, _)] = take(q)
    assert q.start(tid, eid, NODE) == "running"
    assert q.start(tid, eid, NODE) == "running"  # replayed (lost reply): no change
    assert q.redis.xpending(q.keys.node_stream(NODE), WORKER_GROUP)["pending"] == 1
    assert q.progress("b1").running == 1
    assert q.complete(result(tid, 1), eid) == "final"
    assert q.complete(result(tid, 1), eid) == "duplicate"
    assert q.redis.xlen(q.keys.batch_results("b1")) == 1
    assert q.redis.xlen(q.keys.results) == 1
    prog = q.progress("b1")
    assert (prog.done, prog.completed, prog.running) == (1, 1, 0)
    assert prog.state == "done" and prog.finished_at is not None


def test_late_results_of_an_earlier_attempt(q: TaskQueue) -> None:
    [t1, t2] = submit(q, 2)
    beat(q, slots=4)
    q.dispatch(NODE, 4, 2)
    (e1, _, _), (e2, _, _) = take(q)
    for tid, eid in ((t1, e1), (t2, e2)):
        assert q.start(tid, eid, NODE) == "running"
        assert q.requeue(tid, eid, NODE, "node lost", kind="lost") == "requeued"
    assert q.task_state(t1)["attempt"] == "2"
    q.dispatch(NODE, 4, 2)
    again = {tid: (eid, attempt) for eid, tid, attempt in take(q)}
    (f1, a1), (f2, a2) = again[t1], again[t2]
    assert (a1, a2) == (2, 2)
    assert q.start(t1, f1, NODE) == "running" and q.start(t2, f2, NODE) == "running"
    # t1: the "dead" first attempt reports aborted late -> ignored; the current run counts.
    assert q.complete(result(t1, 1, "aborted"), e1) == "stale"
    assert q.complete(result(t1, 2), f1) == "final"
    # t2: the first attempt finishes genuinely after all -> accepted; the second is a duplicate.
    assert q.complete(result(t2, 1), e2) == "final"
    assert q.complete(result(t2, 2), f2) == "duplicate"
    by_id = {r.task_id: r for r in RolloutManager(queue=q).results("b1", wait=False)}
    assert (by_id[t1].attempt, by_id[t2].attempt) == (2, 1)
    assert q.progress("b1").running == 0
    assert q.nodes()[0].outstanding == 0


def test_task_lost_too_often_is_dead_lettered(q: TaskQueue) -> None:
    [tid] = submit(q)
    beat(q)
    for expected in ("requeued", "dead"):  # max_deliveries=2
        q.dispatch(NODE, 2, 1)
        [(eid, _, _)] = take(q)
        q.start(tid, eid, NODE)
        assert q.requeue(tid, eid, NODE, "worker killed", kind="lost") == expected
    [res] = RolloutManager(queue=q).results("b1", wait=False)
    assert res.outcome.status is OutcomeStatus.ABORTED and res.outcome.reward is None
    assert res.outcome.abort_reason == (
        "dead-lettered: handed to workers 2 times without a result (last: worker killed)"
    )
    [dead] = q.dead_letters()
    assert dead.task_id == tid and '"instance_id":"i0"' in dead.fields["payload"]
    assert q.progress("b1").dead_lettered == 1


def test_infrastructure_failure_is_retried_then_final(q: TaskQueue) -> None:
    [tid] = submit(q, max_attempts=2)
    beat(q)
    outcomes = []
    for attempt in (1, 2):
        q.dispatch(NODE, 2, 1)
        [(eid, _, got)] = take(q)
        assert got == attempt
        q.start(tid, eid, NODE)
        outcomes.append(q.complete(result(tid, attempt, "aborted"), eid))
    assert outcomes == ["retry", "final"]
    prog = q.progress("b1")
    assert (prog.aborted, prog.retries, prog.done) == (1, 1, 1)


def test_heartbeat_keeps_running_entries_fresh_and_reports_cancels(q: TaskQueue) -> None:
    [tid] = submit(q)
    beat(q)
    q.dispatch(NODE, 2, 1)
    [(eid, _, _)] = take(q)
    q.start(tid, eid, NODE)
    time.sleep(0.3)
    stream = q.keys.node_stream(NODE)
    idle = q.redis.xpending_range(stream, WORKER_GROUP, "-", "+", 10)[0]["time_since_delivered"]
    assert idle >= 300
    _, cancelled = q.heartbeat(NODE, {"slots": 2}, [eid], ["b1", "other"])
    assert cancelled == set()
    pend = q.redis.xpending_range(stream, WORKER_GROUP, "-", "+", 10)[0]
    assert pend["time_since_delivered"] < 100 and pend["times_delivered"] == 1
    q.cancel("b1")
    assert q.heartbeat(NODE, {"slots": 2}, [eid], ["b1"])[1] == {"b1"}


def test_reclaim_takes_back_a_dead_nodes_queued_and_running_work(q: TaskQueue) -> None:
    [t_run, t_queued] = submit(q, 2)
    beat(q, node="dead", slots=1)
    q.ensure_group("dead")
    assert q.dispatch("dead", 2, 2) == (2, 0)
    [(eid, _, _)] = take(q, node="dead", count=1)
    q.start(t_run, eid, "dead")
    q.drop_heartbeat("dead")  # as if its TTL expired
    service = ManagerService(q, MANAGER_CFG)
    assert q.reclaim_node("dead", "gone") == 1  # the queued one; the running one is not idle yet
    time.sleep(0.3)  # > claim_min_idle_s
    assert service.reclaim_once() == 1
    run, queued = q.task_state(t_run), q.task_state(t_queued)
    assert (run["state"], run["attempt"], run["lost"]) == ("pending", "2", "1")
    assert (queued["state"], queued["attempt"]) == ("pending", "1")
    assert q.redis.xlen(q.keys.node_stream("dead")) == 0
    assert q.nodes()[0].outstanding == 0 and q.progress("b1").running == 0
    beat(q, node="alive", slots=1)
    assert service.reclaim_once() == 0  # only dead nodes are reclaimed


def test_manager_spreads_a_small_batch_over_nodes(q: TaskQueue) -> None:
    for node in ("a", "b", "c"):
        beat(q, node=node, slots=4)
    submit(q, 3)
    assert ManagerService(q, MANAGER_CFG).dispatch_once() == 3
    assert sorted(n.outstanding for n in q.nodes()) == [1, 1, 1]


def test_results_iterator_skips_and_dead_letters_an_invalid_entry(q: TaskQueue) -> None:
    [tid] = submit(q, 2)[:1]
    mgr = RolloutManager(queue=q)
    q.redis.xadd(q.keys.batch_results("b1"), {"task_id": "x", "result": "{broken"})
    beat(q)
    q.dispatch(NODE, 2, 1)
    [(eid, _, _)] = take(q)
    q.start(tid, eid, NODE)
    q.complete(result(tid, 1), eid)
    assert [r.task_id for r in mgr.results("b1", wait=False)] == [tid]
    [dead] = q.dead_letters()
    assert dead.source == q.keys.batch_results("b1") and dead.reason.startswith("invalid result")
    with pytest.raises(TimeoutError, match=r"batch b1: 1/2 results after 0.3 s"):
        list(mgr.results("b1", timeout_s=0.3))
    with pytest.raises(UnknownBatchError):
        list(mgr.results("zzz", wait=False))


def test_results_group_consumer_acks(q: TaskQueue) -> None:
    [tid] = submit(q)
    beat(q)
    q.dispatch(NODE, 2, 1)
    [(eid, _, _)] = take(q)
    q.start(tid, eid, NODE)
    q.complete(result(tid, 1), eid)
    [(rid, res)] = q.read_results_group("trainer", "c1")
    assert res.task_id == tid
    assert q.read_results_group("trainer", "c1") == []
    assert q.ack_results("trainer", [rid]) == 1
    assert q.redis.xpending(q.keys.results, "trainer")["pending"] == 0


def test_cancel_then_forget(q: TaskQueue) -> None:
    tids = submit(q, 3)
    with pytest.raises(QueueError, match="still running"):
        q.forget("b1")
    assert q.cancel("b1") == 3
    assert q.cancel("b1") == 0  # nothing left to cancel
    assert q.forget("b1") >= 3
    assert q.task_state(tids[0]) == {} and "b1" not in q.batch_ids()


def test_worker_picks_up_entries_whose_read_reply_was_lost(q: TaskQueue, redis_url: str) -> None:
    """An XREADGROUP reply lost on a broken connection leaves entries delivered but unseen."""
    cfg = WorkerConfig(
        redis_url=redis_url,
        node=NODE,
        slots=1,
        backend="simulated",
        heartbeat_interval_s=0.2,
        block_ms=50,
        orphan_check_interval_s=0.3,
        queue=q.cfg,
    )
    probe = SimulatedProbe(q.redis, q.cfg.prefix)
    worker = Worker(cfg, SimulatedRunner(cfg.simulated, probe), queue=q)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: q.node_heartbeat(NODE), 10, "the worker's heartbeat")
        [tid] = submit(q)
        beat(q, slots=1)
        q.redis.hset(q.keys.node(NODE), "draining", "0")
        assert q.dispatch(NODE, 1, 1)[0] == 1
        # The test "steals" the read as the worker's consumer, as a lost reply would.
        q.redis.xreadgroup(WORKER_GROUP, NODE, {q.keys.node_stream(NODE): ">"}, count=1)
        wait_for(lambda: q.progress("b1").done == 1, 10, "the orphaned entry to run")
        assert [r["task_id"] for r in probe.runs()] == [tid]
    finally:
        worker.request_stop()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_queued_entry_moves_to_a_node_with_a_free_slot(q: TaskQueue) -> None:
    """Nothing pending, node a holds a prefetched task behind a running one, b idles."""
    [t_run, t_queued] = submit(q, 2)
    beat(q, node="a", slots=1)
    q.ensure_group("a")
    assert q.dispatch("a", 2, 2) == (2, 0)
    [(eid, _, _)] = take(q, node="a", count=1)
    q.start(t_run, eid, "a")
    beat(q, node="b", slots=1)
    q.ensure_group("b")
    service = ManagerService(q, MANAGER_CFG)
    assert service.dispatch_once() == 1
    assert q.task_state(t_queued)["node"] == "b" and q.task_state(t_queued)["attempt"] == "1"
    assert q.task_state(t_run)["node"] == "a"
    assert {n.name: n.outstanding for n in q.nodes()} == {"a": 1, "b": 1}
    prog = q.progress("b1")
    assert (prog.rebalanced, prog.requeued) == (1, 0)
    assert service.dispatch_once() == 0  # stable: nothing more to move


def test_submit_rejects_a_batch_id_too_long_for_trajectory_ids(q: TaskQueue) -> None:
    mgr = RolloutManager(queue=q)
    with pytest.raises(ValueError, match="batch_id is too long"):
        mgr.submit(RolloutRequest(batch_id="b" * 188, instance_ids=["a"] * 11))
    with pytest.raises(ValueError, match="instance_ids"):
        mgr.submit({"instance_ids": []})
    assert q.batch_ids() == []


def _record(q: TaskQueue, trajectory_id: str) -> tuple[str, Outcome | None]:
    info = q.redis.hgetall(TrajectoryKeys(q.cfg.prefix, trajectory_id).info)
    raw = info.get(b"outcome")
    status = info[b"status"].decode()
    return status, Outcome.model_validate_json(raw) if raw else None


def test_requeued_attempt_closes_its_open_record_as_aborted_worker_lost(
    q: TaskQueue, redis_url: str
) -> None:
    [t_lost, t_done] = submit(q, 2)
    beat(q, node="dead", slots=2)
    q.ensure_group("dead")
    q.dispatch("dead", 2, 2)
    entries = {tid: eid for eid, tid, _ in take(q, node="dead")}
    for tid, eid in entries.items():
        q.start(tid, eid, "dead")
        open_record(redis_url, f"{tid}.a1")
    # t_done's worker recorded its outcome before it died (its result never reached the queue)
    done_outcome = Outcome(status=OutcomeStatus.COMPLETED, reward=1.0)
    q.redis.hset(
        TrajectoryKeys(q.cfg.prefix, f"{t_done}.a1").info,
        mapping={"status": "closed", "outcome": done_outcome.model_dump_json()},
    )
    q.drop_heartbeat("dead")  # as if its TTL expired
    time.sleep(0.3)  # > claim_min_idle_s: XAUTOCLAIM takes the running entries
    assert ManagerService(q, MANAGER_CFG).reclaim_once() == 2

    status, outcome = _record(q, f"{t_lost}.a1")
    assert status == "closed" and outcome is not None
    assert outcome.status is OutcomeStatus.ABORTED and outcome.reward is None
    assert outcome.abort_reason is not None and outcome.abort_reason.startswith("worker lost")
    record = load_trajectory(q.redis, f"{t_lost}.a1", q.cfg.prefix)
    assert record.outcome == outcome and record.counters["worker_lost"] == 1
    # the worker-written outcome is kept
    assert _record(q, f"{t_done}.a1") == ("closed", done_outcome)
    # idempotent: a second close (another requeue path racing) changes nothing
    assert abort_lost_trajectory(q.redis, f"{t_lost}.a1", "again", q.cfg.prefix) == "kept"
    assert _record(q, f"{t_lost}.a1") == ("closed", outcome)
    # an attempt that never opened a record gets none
    assert abort_lost_trajectory(q.redis, f"{t_lost}.a2", "x", q.cfg.prefix) == "missing"
    assert not q.redis.exists(TrajectoryKeys(q.cfg.prefix, f"{t_lost}.a2").info)


def test_an_adapter_abort_on_an_open_record_is_kept(q: TaskQueue, redis_url: str) -> None:
    [tid] = submit(q)
    beat(q)
    q.dispatch(NODE, 2, 1)
    [(eid, _, _)] = take(q)
    q.start(tid, eid, NODE)
    open_record(redis_url, f"{tid}.a1")
    adapter_abort = Outcome(status=OutcomeStatus.ABORTED, abort_reason="no engine")
    q.redis.hset(
        TrajectoryKeys(q.cfg.prefix, f"{tid}.a1").info, "outcome", adapter_abort.model_dump_json()
    )
    assert q.requeue(tid, eid, NODE, "worker of node n1 restarted", kind="lost") == "requeued"
    assert _record(q, f"{tid}.a1") == ("closed", adapter_abort)
