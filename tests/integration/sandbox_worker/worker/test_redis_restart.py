"""A Redis restart (AOF on) in the middle of a batch loses neither queued nor finished tasks."""

from __future__ import annotations

import collections
import time

from sandbox_worker.testing.probe import SimulatedProbe
from services.manager.client import RolloutManager
from services.protocol import RolloutRequest
from services.protocol.trajectory import OutcomeStatus
from services.queue.submitter import SubmitterQueue
from tests.support.execution import (
    HEARTBEAT_TTL_S,
    MANAGER_CFG,
    QUEUE_CFG,
    Procs,
    wait_for,
    wait_nodes,
)
from tests.support.redis import RedisServer


def test_redis_killed_for_longer_than_a_heartbeat_ttl_loses_nothing(
    fresh_redis: RedisServer, procs: Procs
) -> None:
    """SIGKILL Redis mid-batch, keep it down past the heartbeat TTL, start it again.

    The workers get a single per-command retry, so the outage reaches their own reconnect
    loops; heartbeats expire meanwhile, yet no live worker's task may be taken back and re-run.
    """
    url = fresh_redis.url
    for node in ("w1", "w2"):
        procs.worker(url, node, slots=2, SWERL_WORKER__QUEUE__CONNECT_RETRIES="1")
    queue = SubmitterQueue(url, QUEUE_CFG)
    mgr = RolloutManager(queue=queue, cfg=MANAGER_CFG)
    mgr.start()
    try:
        wait_nodes(queue, {"w1", "w2"}, procs)
        batch = mgr.submit(RolloutRequest(instance_ids=["t.sleep800"], n_samples=16))
        wait_for(lambda: mgr.progress(batch).done >= 4, 30, "4 finished tasks", procs.logs)
        before = {r.task_id for r in mgr.results(batch, wait=False)}
        fresh_redis.stop(kill=True)  # SIGKILL: only what the AOF holds survives
        time.sleep(HEARTBEAT_TTL_S + 1)
        fresh_redis.start()
        results = mgr.collect(batch, timeout_s=60)
        assert before <= {r.task_id for r in results}  # finished before: still there
        assert sorted(r.task_id for r in results) == sorted(f"{batch}:0:{s}" for s in range(16))
        assert all(r.outcome.status is OutcomeStatus.COMPLETED for r in results)
        assert all(r.attempt == 1 for r in results)
        prog = mgr.progress(batch)
        assert (prog.done, prog.completed, prog.running, prog.queued) == (16, 16, 0, 0)
        assert (prog.requeued, prog.retries) == (0, 0), "a live worker's task was taken back"
        ends = collections.Counter(
            r["task_id"] for r in SimulatedProbe(queue.redis, "swerl:").runs()
        )
        assert set(ends) == {r.task_id for r in results}
        assert all(n == 1 for n in ends.values()), ends
        wait_for(
            lambda: {n.name for n in queue.nodes() if n.alive} == {"w1", "w2"},
            10,
            "the workers' heartbeats to come back",
        )
        assert "Redis unreachable" in procs.logs()  # the outage reached the reconnect loops
    finally:
        mgr.stop()
        queue.close()
