"""The rollout stack for the end-to-end tests, all real processes (session-scoped).

* a private ``redis-server`` (``tests/conftest.py``) holding trajectory records and the queue;
* the private dockerd and the mini task set's images (built if missing, cached);
* the tiny model; two reference engines (``python -m services.reference_engine.server``): one in
  **SCRIPTED mode** replaying the gold solutions of :mod:`sandbox_worker.tasks.scripted` (test
  machinery: the agent succeeds because the engine replays the gold patch, not because a model
  solved anything), one sampling freely from the random tiny model;
* one adapter (``python -m adapter``) in front of each engine, in training mode (a worker token:
  trajectory records need it, every ``/t/<id>/`` call needs the trajectory's own token);
* sandbox backends (docker and bwrap) sharing one relay hub, with state under a private
  temporary directory.

At the end of the session no container, bwrap state dir, netns, cgroup or process of the run
may be left: the fixtures remove what they started and fail the session on leftovers.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox_worker.backends import SandboxBackend, make_backend
from sandbox_worker.backends.bwrap import NETNS_DIR
from sandbox_worker.backends.cgroups import Cgroups
from sandbox_worker.images import DEFAULT_INSTANCES
from sandbox_worker.relay.host_relay import RelayHub
from sandbox_worker.runner import CancelToken, RunContext
from sandbox_worker.tasks.scripted import write_script
from services.datasets import load_instances
from services.processes import start_in_parallel
from services.protocol.instance import SWEInstance
from tests.support.adapter_process import AdapterProcess, launch_adapter
from tests.support.docker import build_task_images, ensure_dockerd
from tests.support.engines import ReferenceServer, launch_reference_server, tiny_model_for_session
from tests.support.redis import RedisServer

STARTUP_TIMEOUT_S = 300.0  # imports are slow on a busy 2-core machine
ENGINE_WEIGHT_VERSION = "3"  # numeric: the adapter adopts it and records it on every turn
RUN_TAG = f"e2e{os.getpid() % 100000}"
WORKER_TOKEN = "e2e-worker-token-0123456789abcdef"  # adapter.worker_token / rollout.adapter_token


@dataclass
class RolloutStack:
    root: Path
    model_dir: Path
    script_path: Path
    instances: dict[str, SWEInstance]
    redis_url: str
    scripted: AdapterProcess
    random: AdapterProcess
    hub: RelayHub
    backends: dict[str, SandboxBackend]
    nodes: list[str]

    def node(self) -> str:
        """A fresh sandbox node name of this run (checked for leftovers at the end)."""
        name = f"{RUN_TAG}-{uuid.uuid4().hex[:6]}"
        self.nodes.append(name)
        return name


def run_context(node: str, cancel: CancelToken | None = None) -> RunContext:
    return RunContext(node=node, cancel=cancel or CancelToken(), log=logging.getLogger("e2e"))


def _container_leftovers(backend: SandboxBackend) -> list[str]:
    containers = backend.client.containers.list(  # type: ignore[attr-defined]
        all=True, filters={"label": "swerl.owner=swerl"}
    )
    return [c.name for c in containers if c.name.startswith(f"swerl.{RUN_TAG}-")]


def _processes_mentioning(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.fixture(scope="session")
def rollout_stack(redis_server: RedisServer) -> Iterator[RolloutStack]:
    ensure_dockerd()
    build_task_images()  # cached: a no-op when the images are current
    root = Path(tempfile.mkdtemp(prefix="swerl-e2e-"))  # short: unix socket paths < 108 bytes
    logs = root / "logs"
    logs.mkdir()
    instances = {i.instance_id: i for i in load_instances(DEFAULT_INSTANCES)}
    script = write_script(list(instances.values()), root / "scripted-gold.jsonl")
    hub = RelayHub()
    backends: dict[str, SandboxBackend] = {}
    engines: list[ReferenceServer] = []
    adapters: list[AdapterProcess] = []
    nodes: list[str] = []
    try:
        with tiny_model_for_session() as model_dir:
            version = ["--weight-version", ENGINE_WEIGHT_VERSION]
            engines = start_in_parallel(
                [
                    lambda: launch_reference_server(
                        model_dir, script, extra_args=version, log_dir=logs,
                        timeout_s=STARTUP_TIMEOUT_S,
                    ),
                    lambda: launch_reference_server(
                        model_dir, extra_args=version, log_dir=logs, timeout_s=STARTUP_TIMEOUT_S
                    ),
                ],
                ReferenceServer.stop,
            )  # fmt: skip
            adapters = start_in_parallel(
                [
                    functools.partial(
                        launch_adapter,
                        [engine.url],
                        model_dir,
                        redis_server.url,
                        logs,
                        worker_token=WORKER_TOKEN,
                    )
                    for engine in engines
                ],
                AdapterProcess.stop,
            )
            backends["docker"] = make_backend("docker", state_root=root / "docker", hub=hub)
            backends["bwrap"] = make_backend("bwrap", state_root=root / "bwrap", hub=hub)
            yield RolloutStack(
                root, model_dir, script, instances, redis_server.url,
                adapters[0], adapters[1], hub, backends, nodes,
            )  # fmt: skip
    finally:
        leftovers: list[str] = []
        for kind, backend in backends.items():
            for node in nodes:
                leftovers += [f"{kind}:{node}:{s}" for s in backend.list_sandboxes(node)]
                backend.cleanup_node(node)
        if "docker" in backends:
            leftovers += _container_leftovers(backends["docker"])
        if NETNS_DIR.is_dir():
            leftovers += [p.name for p in NETNS_DIR.glob(f"swerl.{RUN_TAG}-*")]
        leftovers += sorted(Cgroups().names(f"{RUN_TAG}-"))
        for a in adapters:
            a.stop()
        for e in engines:
            e.stop()
        hub.close()
        leftovers += [f"process {p}" for p in _processes_mentioning(str(root))]
        for sub in ("docker", "bwrap"):
            d = root / sub
            if d.is_dir():
                leftovers += [str(p) for p in d.iterdir()]
        shutil.rmtree(root, ignore_errors=True)
        assert not leftovers, f"left behind by the e2e session: {leftovers}"
