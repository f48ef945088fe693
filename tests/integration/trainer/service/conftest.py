"""Trainer service fixtures: the real job API process, and trainer services (``python -m
trainer serve``) whose training command is the driver stand-in
(``python -m tests.support.train_driver_standin``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.processes import ManagedProcess, launch
from tests.integration.adapter.conftest import model_dir  # noqa: F401 (fixture)
from tests.support.api_server import ApiServer, start_api
from tests.support.execution import manager, probe, procs, queue  # noqa: F401 (fixtures)
from tests.support.paths import REPO_ROOT

STANDIN = "tests.support.train_driver_standin"  # run as a module from the repo root


@pytest.fixture
def api(redis_url: str, tmp_path: Path) -> Iterator[ApiServer]:
    server = start_api(redis_url, tmp_path)
    yield server
    server.stop()


@pytest.fixture
def start_service(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., ManagedProcess]]:
    """``start_service(step_s=0.3, command=None, base=None, nodes=None, env=None)``: a trainer
    service of group ``default`` with a 3 s lease, the driver stand-in as its training command
    unless ``command``; ``base`` is laid over its base run file; ``nodes``: ``(nnodes,
    node_rank)`` of a multi-node group; ``env`` added to its environment; runs land in
    ``tmp_path/runs``."""
    started: list[ManagedProcess] = []

    def start(
        step_s: float = 0.3,
        command: list[str] | None = None,
        base: dict[str, Any] | None = None,
        nodes: tuple[int, int] | None = None,
        env: dict[str, str] | None = None,
    ) -> ManagedProcess:
        n = len(started)
        sections: dict[str, Any] = {"train": {"publish": False}}  # no adapter in these tests
        sections.update(base or {})
        sections["manager"] = {"redis_url": redis_url}
        base_path = tmp_path / f"base-run{n}.yaml"  # the deployment's run sections
        base_path.write_text(yaml.safe_dump(sections))
        cfg = {
            "trainer_service": {
                "command": command or [sys.executable, "-m", STANDIN],
                "base_config": str(base_path),
                "lease_ttl_s": 3.0,
                "poll_interval_s": 0.2,
                "stop_grace_s": 5.0,
            }
        }
        if nodes is not None:
            cfg["trainer_service"].update(nnodes=nodes[0], node_rank=nodes[1])
        path = tmp_path / f"service{n}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        argv = [sys.executable, "-m", "trainer", "serve", "--config", str(path)]
        argv += ["--redis", redis_url, "--runs-dir", str(tmp_path / "runs")]
        extra = {"SWERL_STANDIN_STEP_S": str(step_s), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
        proc = launch(f"trainer-service-{n}", argv, tmp_path / f"service{n}.log", env=extra,
                      cwd=REPO_ROOT, grace_s=10)  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
