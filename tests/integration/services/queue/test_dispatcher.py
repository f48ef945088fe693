"""The dispatcher's side against a real Redis: dispatch within the budget, reclaim, take back."""

from __future__ import annotations

import json
import time

from services.manager.dispatcher import Dispatcher
from tests.support.execution import MANAGER_CFG
from tests.support.queue_sides import (
    NODE,
    QueueSides,
    beat,
    one_running_one_queued,
    result,
    submit,
    take,
)


def test_dispatch_respects_budget_liveness_and_draining(q: QueueSides) -> None:
    submit(q, 5)
    assert q.dispatcher.dispatch(NODE, 3, 10) == (0, -1)  # no heartbeat: a dead node gets nothing
    beat(q)
    assert q.dispatcher.dispatch(NODE, 3, 10) == (3, 2)
    assert q.dispatcher.dispatch(NODE, 3, 10) == (0, 2)  # outstanding == max_outstanding
    [(eid, tid, _), *_] = take(q)
    assert q.worker.start(tid, eid, NODE) == "running"
    assert q.worker.complete(result(tid, 1), eid) == "final"
    assert q.dispatcher.dispatch(NODE, 3, 10) == (1, 1)  # one slot of budget came back
    q.worker.set_draining(NODE)
    assert q.dispatcher.dispatch(NODE, 5, 10) == (0, -2)


def test_reclaim_takes_back_a_dead_nodes_queued_and_running_work(q: QueueSides) -> None:
    t_run, t_queued = one_running_one_queued(q, "dead")
    q.worker.drop_heartbeat("dead")  # as if its TTL expired
    dispatcher = Dispatcher(q.dispatcher, MANAGER_CFG)
    # the queued one; the running one is not idle yet
    assert q.dispatcher.reclaim_node("dead", "gone") == 1
    time.sleep(0.3)  # > claim_min_idle_s
    assert dispatcher.reclaim_once() == 1
    run, queued = q.submitter.task_state(t_run), q.submitter.task_state(t_queued)
    assert (run["state"], run["attempt"], run["lost"]) == ("pending", "2", "1")
    assert (queued["state"], queued["attempt"]) == ("pending", "1")
    assert q.redis.xlen(q.keys.node_stream("dead")) == 0
    assert q.submitter.nodes()[0].outstanding == 0 and q.submitter.progress("b1").running == 0
    beat(q, node="alive", slots=1)
    assert dispatcher.reclaim_once() == 0  # only dead nodes are reclaimed


def test_an_entry_without_a_task_id_is_dead_lettered_when_taken_back(q: QueueSides) -> None:
    q.redis.xadd(q.keys.node_stream(NODE), {"junk": "1"})
    assert q.dispatcher.reclaim_node(NODE, "gone") == 0
    [dead] = q.submitter.dead_letters()
    assert dead.reason == "entry has no task_id" and json.loads(dead.fields["fields"]) == {
        "junk": "1"
    }
    assert q.redis.xlen(q.keys.node_stream(NODE)) == 0


def test_a_node_that_never_got_work_has_nothing_to_take_back(q: QueueSides) -> None:
    assert q.dispatcher.reclaim_node("never", "gone") == 0
    assert q.dispatcher.take_back_undelivered("never", 5, "rebalance") == 0
