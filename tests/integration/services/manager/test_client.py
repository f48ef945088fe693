"""The rollout manager's client against a real Redis: reading results, validating requests."""

from __future__ import annotations

import pytest

from services.manager.client import RolloutManager
from services.protocol import RolloutRequest
from services.queue.submitter import UnknownBatchError
from tests.support.execution import MANAGER_CFG, wait_for
from tests.support.queue_sides import QueueSides, beat, dispatch_one, result, submit, take


def test_results_iterator_skips_and_dead_letters_an_invalid_entry(q: QueueSides) -> None:
    [tid] = submit(q, 2)[:1]
    mgr = RolloutManager(queue=q.submitter)
    q.redis.xadd(q.keys.batch_results("b1"), {"task_id": "x", "result": "{broken"})
    beat(q)
    eid = dispatch_one(q, tid)
    q.worker.complete(result(tid, 1), eid)
    assert [r.task_id for r in mgr.results("b1", wait=False)] == [tid]
    [dead] = q.submitter.dead_letters()
    assert dead.source == q.keys.batch_results("b1") and dead.reason.startswith("invalid result")
    with pytest.raises(TimeoutError, match=r"batch b1: 1/2 results after 0.3 s"):
        list(mgr.results("b1", timeout_s=0.3))
    with pytest.raises(UnknownBatchError):
        list(mgr.results("zzz", wait=False))


def test_submit_rejects_a_batch_id_too_long_for_trajectory_ids(q: QueueSides) -> None:
    mgr = RolloutManager(queue=q.submitter)
    with pytest.raises(ValueError, match="batch_id is too long"):
        mgr.submit(RolloutRequest(batch_id="b" * 188, instance_ids=["a"] * 11))
    with pytest.raises(ValueError, match="instance_ids"):
        mgr.submit({"instance_ids": []})
    assert q.submitter.batch_ids() == []


def test_start_runs_the_dispatch_loop_over_the_clients_connection(q: QueueSides) -> None:
    [tid] = submit(q)
    beat(q)
    mgr = RolloutManager(queue=q.submitter, cfg=MANAGER_CFG)
    mgr.start()
    try:
        wait_for(lambda: q.submitter.task_state(tid)["state"] == "dispatched", 10, "a dispatch")
    finally:
        mgr.stop()
    [(_, got, attempt)] = take(q)
    assert (got, attempt) == (tid, 1)
