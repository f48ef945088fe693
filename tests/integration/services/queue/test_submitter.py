"""The submitter's side against a real Redis: submission, result readers, cancel and forget."""

from __future__ import annotations

import pytest

from services.queue.submitter import BatchConflictError, QueueError, UnknownBatchError
from tests.support.queue_sides import NODE, QueueSides, beat, dispatch_one, result, submit


def test_submit_is_idempotent_and_rejects_a_conflicting_request(q: QueueSides) -> None:
    submit(q, 2)
    submit(q, 2)  # same request again: no-op
    assert q.submitter.progress("b1").total == 2 and q.submitter.pending_count() == 2
    with pytest.raises(BatchConflictError, match="already exists with a different request"):
        submit(q, 3)
    with pytest.raises(UnknownBatchError, match="unknown batch 'nope'"):
        q.submitter.progress("nope")
    with pytest.raises(UnknownBatchError):
        q.submitter.cancel("nope")
    with pytest.raises(QueueError, match="has no tasks"):
        q.submitter.submit_batch("b2", "default", "{}", [])


def test_results_group_consumer_acks(q: QueueSides) -> None:
    [tid] = submit(q)
    beat(q)
    eid = dispatch_one(q, tid)
    q.worker.complete(result(tid, 1), eid)
    [(rid, res)] = q.submitter.read_results_group("trainer", "c1")
    assert res.task_id == tid
    assert q.submitter.read_results_group("trainer", "c1") == []
    assert q.submitter.ack_results("trainer", [rid]) == 1
    assert q.redis.xpending(q.keys.results, "trainer")["pending"] == 0


def test_results_group_dead_letters_and_acks_an_invalid_entry(q: QueueSides) -> None:
    q.redis.xadd(q.keys.results, {"task_id": "x", "result": "{broken"})
    assert q.submitter.read_results_group("trainer", "c1") == []
    assert q.redis.xpending(q.keys.results, "trainer")["pending"] == 0
    [dead] = q.submitter.dead_letters()
    assert dead.source == q.keys.results and dead.reason.startswith("invalid result")
    assert q.redis.xlen(q.keys.results) == 0


def test_cancel_then_forget(q: QueueSides) -> None:
    tids = submit(q, 3)
    with pytest.raises(QueueError, match="still running"):
        q.submitter.forget("b1")
    assert q.submitter.cancel("b1") == 3
    assert q.submitter.cancel("b1") == 0  # nothing left to cancel
    assert q.submitter.forget("b1") >= 3
    assert q.submitter.task_state(tids[0]) == {} and "b1" not in q.submitter.batch_ids()


def test_nodes_lists_every_node_that_sent_a_heartbeat(q: QueueSides) -> None:
    beat(q, slots=3)
    beat(q, node="gone", slots=1)
    q.worker.drop_heartbeat("gone")
    nodes = {n.name: n for n in q.submitter.nodes()}
    assert (nodes[NODE].alive, nodes[NODE].slots) == (True, 3)
    assert (nodes["gone"].alive, nodes["gone"].slots) == (False, 0)
