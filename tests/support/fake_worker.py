"""A sandbox worker process for tests: the real Worker, the simulated runner, a FAKE backend.

``python -m tests.support.fake_worker --redis URL --node N --slots K --dir D``

The fake backend stands in for docker/bwrap in scheduling tests: every run leaves a marker file
``D/<node>/<trajectory id>`` while it lasts (a "sandbox"), and ``cleanup_node`` removes the
node's markers (what a crashed run left) and records the call in Redis
(``<prefix>test:cleanup`` gets ``<node>:<removed count>``), so a test can check that a worker
restarted after ``kill -9`` cleans up after its predecessor.

With ``--sandbox-backend docker|bwrap --image IMAGE --state-root DIR`` every run also holds a
REAL sandbox of that backend (a container or bwrap netns/cgroups, labelled with the node)
running ``sleep`` for as long as the run lasts, and ``cleanup_node`` also removes the node's real
sandboxes (counted with the markers): the test of reaping a killed worker's containers at
takeover.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

import redis

from sandbox_worker.backends import SandboxBackend, SandboxSpec, make_backend
from sandbox_worker.config import WorkerConfig
from sandbox_worker.runner import RunContext
from sandbox_worker.sandbox_names import agent_sandbox_id, sandbox_node_name
from sandbox_worker.testing.probe import SimulatedProbe
from sandbox_worker.testing.simulated import SimulatedRunner
from sandbox_worker.worker import Worker
from services.config import load_config
from services.protocol.tasks import RolloutTask
from services.protocol.trajectory import Outcome
from services.queue.connection import connect
from services.queue.worker import WorkerQueue


class MarkerBackend:
    """FAKE sandbox backend: sandboxes are marker files under ``root/<node>/``. Stands for the
    backends' :class:`sandbox_worker.runner.NodeCleaner` part the worker uses (checked by
    tests/unit/sandbox_worker/testing/test_conformance.py)."""

    def __init__(
        self, root: Path, client: redis.Redis, prefix: str, real: SandboxBackend | None = None
    ) -> None:
        self.root = root
        self.client = client
        self.prefix = prefix
        self.real = real

    def cleanup_node(self, node: str) -> int:
        removed = 0
        for marker in sorted((self.root / node).glob("*")):
            marker.unlink()
            removed += 1
        if self.real is not None:
            removed += self.real.cleanup_node(sandbox_node_name(node))
        self.client.rpush(f"{self.prefix}test:cleanup", f"{node}:{removed}")
        return removed


class MarkerRunner:
    """The simulated runner inside a FAKE "sandbox" (a marker file that exists while it runs),
    plus a real sandbox of ``real`` (with ``image``) when given. Stands for the real runner
    behind :class:`sandbox_worker.runner.TrajectoryRunner` (checked by the same conformance
    test)."""

    def __init__(
        self,
        inner: SimulatedRunner,
        root: Path,
        real: SandboxBackend | None = None,
        image: str = "",
    ) -> None:
        self.inner = inner
        self.root = root
        self.real = real
        self.image = image

    def run(self, task: RolloutTask, ctx: RunContext) -> Outcome:
        marker = self.root / ctx.node / task.trajectory_id
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        sandbox = None
        try:
            if self.real is not None:
                spec = SandboxSpec(
                    image=self.image,
                    node=sandbox_node_name(ctx.node),
                    sandbox_id=agent_sandbox_id(task.trajectory_id),
                    labels={"swerl.trajectory": task.trajectory_id},
                )
                sandbox = self.real.create(spec)
                sandbox.spawn("sleep 600")
            return self.inner.run(task, ctx)
        finally:
            if sandbox is not None:
                sandbox.destroy()
            marker.unlink(missing_ok=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--redis", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--slots", type=int, default=1)
    p.add_argument("--dir", required=True, type=Path)
    p.add_argument("--sandbox-backend", choices=["docker", "bwrap"])
    p.add_argument("--image", default="")
    p.add_argument("--state-root", type=Path)
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
    real = None
    if args.sandbox_backend:
        where = {"state_root": args.state_root} if args.state_root else {}
        real = make_backend(args.sandbox_backend, **where)
    runner = MarkerRunner(
        SimulatedRunner(cfg.simulated, SimulatedProbe(client, cfg.queue.prefix)),
        args.dir,
        real,
        args.image,
    )
    backend = MarkerBackend(args.dir, client, cfg.queue.prefix, real)
    worker = Worker(cfg, runner, backend=backend, queue=WorkerQueue(client, cfg.queue))
    signal.signal(signal.SIGTERM, lambda *_: worker.request_stop())
    signal.signal(signal.SIGINT, lambda *_: worker.request_stop())
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
