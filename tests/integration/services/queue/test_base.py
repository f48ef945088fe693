"""What the sides share, against a real Redis: a handed-back attempt's record is closed."""

from __future__ import annotations

import time

from services.manager.dispatcher import Dispatcher
from services.protocol.trajectory import Outcome, OutcomeStatus
from services.store.trajectories import TrajectoryKeys, abort_lost_trajectory, load_trajectory
from tests.support.execution import MANAGER_CFG, open_record
from tests.support.queue_sides import QueueSides, beat, stored_record, submit, take


def test_requeued_attempt_closes_its_open_record_as_aborted_worker_lost(
    q: QueueSides, redis_url: str
) -> None:
    [t_lost, t_done] = submit(q, 2)
    beat(q, node="dead", slots=2)
    q.worker.ensure_group("dead")
    q.dispatcher.dispatch("dead", 2, 2)
    entries = {tid: eid for eid, tid, _ in take(q, node="dead")}
    for tid, eid in entries.items():
        q.worker.start(tid, eid, "dead")
        open_record(redis_url, f"{tid}.a1")
    # t_done's worker recorded its outcome before it died (its result never reached the queue)
    done_outcome = Outcome(status=OutcomeStatus.COMPLETED, reward=1.0)
    q.redis.hset(
        TrajectoryKeys(q.cfg.prefix, f"{t_done}.a1").info,
        mapping={"status": "closed", "outcome": done_outcome.model_dump_json()},
    )
    q.worker.drop_heartbeat("dead")  # as if its TTL expired
    time.sleep(0.3)  # > claim_min_idle_s: XAUTOCLAIM takes the running entries
    assert Dispatcher(q.dispatcher, MANAGER_CFG).reclaim_once() == 2

    status, outcome = stored_record(q, f"{t_lost}.a1")
    assert status == "closed" and outcome is not None
    assert outcome.status is OutcomeStatus.ABORTED and outcome.reward is None
    assert outcome.abort_reason is not None and outcome.abort_reason.startswith("worker lost")
    record = load_trajectory(q.redis, f"{t_lost}.a1", q.cfg.prefix)
    assert record.outcome == outcome and record.counters["worker_lost"] == 1
    # the worker-written outcome is kept
    assert stored_record(q, f"{t_done}.a1") == ("closed", done_outcome)
    # idempotent: a second close (another requeue path racing) changes nothing
    assert abort_lost_trajectory(q.redis, f"{t_lost}.a1", "again", q.cfg.prefix) == "kept"
    assert stored_record(q, f"{t_lost}.a1") == ("closed", outcome)
    # an attempt that never opened a record gets none
    assert abort_lost_trajectory(q.redis, f"{t_lost}.a2", "x", q.cfg.prefix) == "missing"
    assert not q.redis.exists(TrajectoryKeys(q.cfg.prefix, f"{t_lost}.a2").info)
