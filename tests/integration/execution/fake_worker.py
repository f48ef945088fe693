"""A sandbox worker process for tests: the real Worker, the simulated runner, a FAKE backend.

``python -m tests.integration.execution.fake_worker --redis URL --node N --slots K --dir D``

The fake backend stands in for docker/bwrap in scheduling tests: every run leaves a marker file
``D/<node>/<trajectory id>`` while it lasts (a "sandbox"), and ``cleanup_node`` removes the
node's markers (what a crashed run left) and records the call in Redis
(``<prefix>test:cleanup`` gets ``<node>:<removed count>``), so a test can check that a worker
restarted after ``kill -9`` cleans up after its predecessor.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

import redis

from sandbox_worker.config import WorkerConfig
from sandbox_worker.runner import RunContext, SimulatedProbe, SimulatedRunner
from sandbox_worker.worker import Worker
from services.config import load_config
from services.protocol.tasks import RolloutTask
from services.protocol.trajectory import Outcome
from services.queue.connection import connect
from services.queue.store import TaskQueue


class MarkerBackend:
    """FAKE sandbox backend: sandboxes are marker files under ``root/<node>/``."""

    def __init__(self, root: Path, client: redis.Redis, prefix: str) -> None:
        self.root = root
        self.client = client
        self.prefix = prefix

    def cleanup_node(self, node: str) -> int:
        removed = 0
        for marker in sorted((self.root / node).glob("*")):
            marker.unlink()
            removed += 1
        self.client.rpush(f"{self.prefix}test:cleanup", f"{node}:{removed}")
        return removed


class MarkerRunner:
    """The simulated runner inside a FAKE "sandbox" (a marker file that exists while it runs)."""

    def __init__(self, inner: SimulatedRunner, root: Path) -> None:
        self.inner = inner
        self.root = root

    def run(self, task: RolloutTask, ctx: RunContext) -> Outcome:
        marker = self.root / ctx.node / task.trajectory_id
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        try:
            return self.inner.run(task, ctx)
        finally:
            marker.unlink(missing_ok=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--redis", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--slots", type=int, default=1)
    p.add_argument("--dir", required=True, type=Path)
    args = p.parse_args()
    cfg = load_config(
        WorkerConfig,
        section="worker",
        overrides={
            "redis_url": args.redis,
            "node": args.node,
            "slots": args.slots,
            "backend": "simulated",
        },
    )
    logging.basicConfig(level=cfg.log_level, format=f"%(asctime)s [{cfg.node}] %(message)s")
    client = connect(cfg.redis_url, cfg.queue)
    runner = MarkerRunner(
        SimulatedRunner(cfg.simulated, SimulatedProbe(client, cfg.queue.prefix)), args.dir
    )
    backend = MarkerBackend(args.dir, client, cfg.queue.prefix)
    worker = Worker(cfg, runner, backend=backend, queue=TaskQueue(client, cfg.queue))
    signal.signal(signal.SIGTERM, lambda *_: worker.request_stop())
    signal.signal(signal.SIGINT, lambda *_: worker.request_stop())
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
