"""Fixtures for the trajectory runner's unit tests.

The runner runs for real against test doubles: ``LocalDirBackend`` (sandboxes are copies of a
mini repository in host directories, see sandbox_worker/testing/local_sandbox.py), a fake
adapter client recording open/close calls, and fake agent functions that act on the sandbox
the way an agent would (apply a patch, break the repository...). The reward evaluation is the
real ``evaluate_patch`` on the LocalDir double unless a test replaces it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandbox_worker.adapter_client import AdapterError, CloseResult
from sandbox_worker.evaluation import EvalConfig
from sandbox_worker.openhands.server import AgentServerBundle
from sandbox_worker.relay.host_relay import RelayHub
from sandbox_worker.runner import CancelToken, RunContext
from sandbox_worker.sandbox_runner import RunnerSettings, SandboxTrajectoryRunner
from sandbox_worker.tasks.repos import materialize_repo
from sandbox_worker.testing.local_sandbox import LocalDirBackend
from services.datasets import load_instances
from services.protocol.instance import SWEInstance
from services.protocol.tasks import RolloutTask
from services.protocol.trajectory import Outcome, TrajectoryMeta
from tests.support.paths import TEST_DATA

INSTANCES = TEST_DATA / "instances.jsonl"
INSTANCE_ID = "swerl__spanlib-1"
IMAGE = "spanlib"  # LocalDirBackend: the image name is a template directory's key
LOCAL_TEST_CMD = (
    f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {sys.executable} -m pytest -rA -p no:cacheprovider"
)
COUNTERS = {"turns": 2, "segments": 1, "prompt_tokens": 100, "observation_tokens": 30,
            "generated_tokens": 20}  # fmt: skip


@dataclass
class FakeAdapter:
    """Stands for :class:`AdapterClient` (the :class:`TrajectoryRecords` protocol; checked by
    tests/unit/sandbox_worker/testing/test_conformance.py). Records calls; ``open_error`` /
    ``close_errors`` (consumed in order) simulate failures; ``kept_abort`` makes every close
    answer with an abort the adapter recorded itself."""

    opened: list[TrajectoryMeta] = field(default_factory=list)
    closes: list[tuple[str, Outcome | None]] = field(default_factory=list)
    open_error: AdapterError | None = None
    close_errors: list[AdapterError | None] = field(default_factory=list)
    kept_abort: Outcome | None = None
    counters: dict[str, int] = field(default_factory=lambda: dict(COUNTERS))
    token: str | None = "swt_fake-trajectory-token"
    health: bool = True  # what healthy() answers

    def healthy(self) -> bool:
        return self.health

    def open(self, meta: TrajectoryMeta) -> str | None:
        if self.open_error is not None:
            raise self.open_error
        self.opened.append(meta)
        return self.token

    def close(self, trajectory_id: str, outcome: Outcome | None = None) -> CloseResult:
        self.closes.append((trajectory_id, outcome))
        if self.close_errors:
            error = self.close_errors.pop(0)
            if error is not None:
                raise error
        kept = self.kept_abort or outcome
        return CloseResult(kept, dict(self.counters))

    def close_connection(self) -> None:
        pass


@dataclass
class Harness:
    backend: LocalDirBackend
    adapter: FakeAdapter
    instance: SWEInstance
    settings: RunnerSettings
    templates: dict[str, Path]
    hub: RelayHub

    def runner(self, agent_fn: Any, eval_fn: Any = None, **kw: Any) -> SandboxTrajectoryRunner:
        extra = {} if eval_fn is None else {"eval_fn": eval_fn}
        return SandboxTrajectoryRunner(
            self.backend,
            self.hub,
            AgentServerBundle("/opt/fake-python", "/opt/fake-venv"),
            self.adapter,
            kw.pop("instances", {self.instance.instance_id: self.instance}),
            self.settings,
            image_for=kw.pop("image_for", lambda _id: IMAGE),
            agent_fn=agent_fn,
            **extra,
        )


def make_task(instance_id: str = INSTANCE_ID, **kw: Any) -> RolloutTask:
    return RolloutTask(
        task_id="b1:0:0", batch_id="b1", group_id="b1:0", instance_id=instance_id, **kw
    )


def make_ctx(node: str = "node-1", cancel: CancelToken | None = None) -> RunContext:
    return RunContext(node=node, cancel=cancel or CancelToken(), log=logging.getLogger("t"))


@pytest.fixture(scope="session")
def spanlib_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("templates") / "spanlib"
    materialize_repo("swerl/spanlib", dest)
    return dest


@pytest.fixture(scope="session")
def hub() -> Iterator[RelayHub]:
    hub = RelayHub()
    yield hub
    hub.close()


@pytest.fixture
def harness(spanlib_template: Path, tmp_path: Path, hub: RelayHub) -> Iterator[Harness]:
    [instance] = load_instances(INSTANCES, only=[INSTANCE_ID])
    templates = {IMAGE: spanlib_template}
    backend = LocalDirBackend(templates, tmp_path / "scratch")
    workdir = str(tmp_path / "testbed")
    settings = RunnerSettings(
        adapter_host="127.0.0.1",
        adapter_port=8100,
        workdir=workdir,
        evaluation=EvalConfig(
            workdir=workdir,
            scratch_dir=str(tmp_path / "scratch"),
            test_cmd=LOCAL_TEST_CMD,
            test_timeout_s=120,
        ),
    )
    yield Harness(backend, FakeAdapter(), instance, settings, templates, hub)
    assert not backend.live, f"sandboxes left behind: {list(backend.live)}"
