"""The manager's dispatch loop against a real Redis, one pass at a time."""

from __future__ import annotations

from services.manager.dispatcher import Dispatcher
from tests.support.execution import MANAGER_CFG
from tests.support.queue_sides import QueueSides, beat, one_running_one_queued, submit


def test_manager_spreads_a_small_batch_over_nodes(q: QueueSides) -> None:
    for node in ("a", "b", "c"):
        beat(q, node=node, slots=4)
    submit(q, 3)
    assert Dispatcher(q.dispatcher, MANAGER_CFG).dispatch_once() == 3
    assert sorted(n.outstanding for n in q.submitter.nodes()) == [1, 1, 1]


def test_queued_entry_moves_to_a_node_with_a_free_slot(q: QueueSides) -> None:
    """Nothing pending, node a holds a prefetched task behind a running one, b idles."""
    t_run, t_queued = one_running_one_queued(q, "a")
    beat(q, node="b", slots=1)
    q.worker.ensure_group("b")
    dispatcher = Dispatcher(q.dispatcher, MANAGER_CFG)
    assert dispatcher.dispatch_once() == 1
    queued = q.submitter.task_state(t_queued)
    assert queued["node"] == "b" and queued["attempt"] == "1"
    assert q.submitter.task_state(t_run)["node"] == "a"
    assert {n.name: n.outstanding for n in q.submitter.nodes()} == {"a": 1, "b": 1}
    prog = q.submitter.progress("b1")
    assert (prog.rebalanced, prog.requeued) == (1, 0)
    assert dispatcher.dispatch_once() == 0  # stable: nothing more to move
