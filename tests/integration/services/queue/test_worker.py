"""The worker's side against a real Redis: start, complete, requeue and heartbeat transitions."""

from __future__ import annotations

import time

from services.manager.client import RolloutManager
from services.protocol.trajectory import Outcome, OutcomeStatus
from services.queue.keys import WORKER_GROUP
from services.store.trajectories import TrajectoryKeys
from tests.support.execution import open_record
from tests.support.queue_sides import (
    NODE,
    QueueSides,
    beat,
    dispatch_one,
    result,
    stored_record,
    submit,
    take,
)


def test_a_task_that_ran_twice_is_reported_once(q: QueueSides) -> None:
    [tid] = submit(q)
    beat(q)
    eid = dispatch_one(q, tid)
    assert q.worker.start(tid, eid, NODE) == "running"  # replayed (lost reply): no change
    assert q.redis.xpending(q.keys.node_stream(NODE), WORKER_GROUP)["pending"] == 1
    assert q.submitter.progress("b1").running == 1
    assert q.worker.complete(result(tid, 1), eid) == "final"
    assert q.worker.complete(result(tid, 1), eid) == "duplicate"
    assert q.redis.xlen(q.keys.batch_results("b1")) == 1
    assert q.redis.xlen(q.keys.results) == 1
    prog = q.submitter.progress("b1")
    assert (prog.done, prog.completed, prog.running) == (1, 1, 0)
    assert prog.state == "done" and prog.finished_at is not None


def test_late_results_of_an_earlier_attempt(q: QueueSides) -> None:
    [t1, t2] = submit(q, 2)
    beat(q, slots=4)
    q.dispatcher.dispatch(NODE, 4, 2)
    (e1, _, _), (e2, _, _) = take(q)
    for tid, eid in ((t1, e1), (t2, e2)):
        assert q.worker.start(tid, eid, NODE) == "running"
        assert q.worker.requeue(tid, eid, NODE, "node lost", kind="lost") == "requeued"
    assert q.submitter.task_state(t1)["attempt"] == "2"
    q.dispatcher.dispatch(NODE, 4, 2)
    again = {tid: (eid, attempt) for eid, tid, attempt in take(q)}
    (f1, a1), (f2, a2) = again[t1], again[t2]
    assert (a1, a2) == (2, 2)
    assert q.worker.start(t1, f1, NODE) == "running" and q.worker.start(t2, f2, NODE) == "running"
    # t1: the "dead" first attempt reports aborted late -> ignored; the current run counts.
    assert q.worker.complete(result(t1, 1, "aborted"), e1) == "stale"
    assert q.worker.complete(result(t1, 2), f1) == "final"
    # t2: the first attempt finishes genuinely after all -> accepted; the second is a duplicate.
    assert q.worker.complete(result(t2, 1), e2) == "final"
    assert q.worker.complete(result(t2, 2), f2) == "duplicate"
    by_id = {r.task_id: r for r in RolloutManager(queue=q.submitter).results("b1", wait=False)}
    assert (by_id[t1].attempt, by_id[t2].attempt) == (2, 1)
    assert q.submitter.progress("b1").running == 0
    assert q.submitter.nodes()[0].outstanding == 0


def test_task_lost_too_often_is_dead_lettered(q: QueueSides) -> None:
    [tid] = submit(q)
    beat(q)
    for expected in ("requeued", "dead"):  # max_deliveries=2
        eid = dispatch_one(q, tid)
        assert q.worker.requeue(tid, eid, NODE, "worker killed", kind="lost") == expected
    [res] = RolloutManager(queue=q.submitter).results("b1", wait=False)
    assert res.outcome.status is OutcomeStatus.ABORTED and res.outcome.reward is None
    assert res.outcome.abort_reason == (
        "dead-lettered: handed to workers 2 times without a result (last: worker killed)"
    )
    [dead] = q.submitter.dead_letters()
    assert dead.task_id == tid and '"instance_id":"i0"' in dead.fields["payload"]
    assert q.submitter.progress("b1").dead_lettered == 1


def test_infrastructure_failure_is_retried_then_final(q: QueueSides) -> None:
    [tid] = submit(q, max_attempts=2)
    beat(q)
    outcomes = []
    for attempt in (1, 2):
        q.dispatcher.dispatch(NODE, 2, 1)
        [(eid, _, got)] = take(q)
        assert got == attempt
        q.worker.start(tid, eid, NODE)
        outcomes.append(q.worker.complete(result(tid, attempt, "aborted"), eid))
    assert outcomes == ["retry", "final"]
    prog = q.submitter.progress("b1")
    assert (prog.aborted, prog.retries, prog.done) == (1, 1, 1)


def test_a_deterministic_failure_is_final_at_once(q: QueueSides) -> None:
    # An unknown instance or a missing image: no other attempt can fix it, so no retry.
    [tid] = submit(q, max_attempts=3)
    beat(q)
    eid = dispatch_one(q, tid)
    q.worker.start(tid, eid, NODE)
    res = result(tid, 1, "aborted")
    res = res.model_copy(update={"outcome": res.outcome.model_copy(update={"retryable": False})})
    assert q.worker.complete(res, eid) == "final"
    prog = q.submitter.progress("b1")
    assert (prog.aborted, prog.retries, prog.done) == (1, 0, 1)
    [got] = RolloutManager(queue=q.submitter).results("b1", wait=False)
    assert got.outcome.retryable is False


def test_heartbeat_keeps_running_entries_fresh_and_reports_cancels(q: QueueSides) -> None:
    [tid] = submit(q)
    beat(q)
    eid = dispatch_one(q, tid)
    time.sleep(0.3)
    stream = q.keys.node_stream(NODE)
    idle = q.redis.xpending_range(stream, WORKER_GROUP, "-", "+", 10)[0]["time_since_delivered"]
    assert idle >= 300
    _, cancelled = q.worker.heartbeat(NODE, {"slots": 2}, [eid], ["b1", "other"])
    assert cancelled == set()
    pend = q.redis.xpending_range(stream, WORKER_GROUP, "-", "+", 10)[0]
    assert pend["time_since_delivered"] < 100 and pend["times_delivered"] == 1
    q.submitter.cancel("b1")
    assert q.worker.heartbeat(NODE, {"slots": 2}, [eid], ["b1"])[1] == {"b1"}


def test_first_heartbeat_of_a_node_wakes_the_dispatcher(q: QueueSides) -> None:
    assert q.worker.heartbeat("fresh", {"slots": 1})[0] is True
    assert q.dispatcher.wait_wake(0.01) is True
    assert q.worker.heartbeat("fresh", {"slots": 1})[0] is False
    assert q.dispatcher.wait_wake(0.01) is False


def test_an_adapter_abort_on_an_open_record_is_kept(q: QueueSides, redis_url: str) -> None:
    [tid] = submit(q)
    beat(q)
    eid = dispatch_one(q, tid)
    open_record(redis_url, f"{tid}.a1")
    adapter_abort = Outcome(status=OutcomeStatus.ABORTED, abort_reason="no engine")
    q.redis.hset(
        TrajectoryKeys(q.cfg.prefix, f"{tid}.a1").info, "outcome", adapter_abort.model_dump_json()
    )
    assert q.worker.requeue(tid, eid, NODE, "worker of node n1 restarted", kind="lost") == (
        "requeued"
    )
    assert stored_record(q, f"{tid}.a1") == ("closed", adapter_abort)
