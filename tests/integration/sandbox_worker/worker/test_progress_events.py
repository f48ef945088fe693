"""A live worker writes its runs' progress events where the job API reads them: under the
queue's prefix, per batch, each run ending with ``done`` and how it ended."""

from __future__ import annotations

import threading

from sandbox_worker.config import SimulatedRunnerConfig, WorkerConfig
from sandbox_worker.testing.simulated import SimulatedRunner
from sandbox_worker.worker import Worker
from services.protocol.progress import ProgressPhase
from services.store.progress import PROGRESS_TTL_S, ProgressStore, progress_stream_key
from tests.support.execution import wait_for
from tests.support.queue_sides import NODE, QueueSides, submit


def test_a_run_is_seen_starting_and_ending(q: QueueSides, redis_url: str) -> None:
    cfg = WorkerConfig(
        redis_url=redis_url, node=NODE, slots=1, backend="simulated", heartbeat_interval_s=0.2,
        block_ms=50, queue=q.cfg, simulated=SimulatedRunnerConfig(duration_s=1.5),
    )  # fmt: skip
    worker = Worker(cfg, SimulatedRunner(cfg.simulated), queue=q.worker)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    store = ProgressStore(q.redis, q.cfg.prefix)
    try:
        wait_for(lambda: q.worker.node_heartbeat(NODE), 10, "the worker's heartbeat")
        [tid] = submit(q)
        assert q.dispatcher.dispatch(NODE, 1, 1)[0] == 1
        wait_for(lambda: [e.phase for e in store.latest("b1")] == [ProgressPhase.DONE], 15,
                 "the run's done event")  # fmt: skip
    finally:
        worker.request_stop()
        thread.join(timeout=10)
    [done] = store.latest("b1")
    assert (done.task_id, done.node, done.status) == (tid, NODE, "completed")
    phases = [e.phase for e in store.events("b1")[1]]
    assert phases[0] == ProgressPhase.STARTING and phases[-1] == ProgressPhase.DONE
    assert 0 < q.redis.ttl(progress_stream_key("b1", q.cfg.prefix)) <= PROGRESS_TTL_S
