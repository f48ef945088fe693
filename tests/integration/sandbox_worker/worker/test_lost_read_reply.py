"""A worker recovers entries whose read reply was lost (its own pending entries)."""

from __future__ import annotations

import threading

from sandbox_worker.config import WorkerConfig
from sandbox_worker.testing.probe import SimulatedProbe
from sandbox_worker.testing.simulated import SimulatedRunner
from sandbox_worker.worker import Worker
from services.queue.keys import WORKER_GROUP
from tests.support.execution import wait_for
from tests.support.queue_sides import NODE, QueueSides, beat, submit


def test_worker_picks_up_entries_whose_read_reply_was_lost(q: QueueSides, redis_url: str) -> None:
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
    worker = Worker(cfg, SimulatedRunner(cfg.simulated, probe), queue=q.worker)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: q.worker.node_heartbeat(NODE), 10, "the worker's heartbeat")
        [tid] = submit(q)
        beat(q, slots=1)
        q.redis.hset(q.keys.node(NODE), "draining", "0")
        assert q.dispatcher.dispatch(NODE, 1, 1)[0] == 1
        # The test "steals" the read as the worker's consumer, as a lost reply would.
        q.redis.xreadgroup(WORKER_GROUP, NODE, {q.keys.node_stream(NODE): ">"}, count=1)
        wait_for(lambda: q.submitter.progress("b1").done == 1, 10, "the orphaned entry to run")
        assert [r["task_id"] for r in probe.runs()] == [tid]
    finally:
        worker.request_stop()
        thread.join(timeout=10)
    assert not thread.is_alive()
