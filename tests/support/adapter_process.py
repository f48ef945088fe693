"""``python -m adapter`` as a real subprocess (:mod:`services.processes`), for tests and benches."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from services.processes import ManagedProcess, free_port, launch
from tests.support.paths import REPO_ROOT

STARTUP_TIMEOUT_S = 300.0  # imports are slow on a busy 2-core machine


@dataclass
class AdapterProcess:
    url: str
    port: int
    managed: ManagedProcess
    headers: dict[str, str] = field(default_factory=dict)  # the worker token, when it has one

    @property
    def pid(self) -> int:
        return self.managed.pid

    def t(self, trajectory_id: str) -> str:
        """Per-trajectory OpenAI base URL."""
        return f"{self.url}/t/{trajectory_id}/v1"

    def record(self, trajectory_id: str) -> dict[str, Any]:
        response = httpx.get(
            f"{self.url}/trajectories/{trajectory_id}", headers=self.headers, timeout=30
        )
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        return data

    def stop(self) -> None:
        self.managed.stop()


def launch_adapter(
    engines: Sequence[str],
    model_dir: Path,
    redis_url: str,
    log_dir: Path,
    *,
    worker_token: str | None = None,
    extra_args: Sequence[str] = (),
    timeout_s: float = STARTUP_TIMEOUT_S,
) -> AdapterProcess:
    """Start an adapter in front of ``engines`` and wait until ``GET /health`` answers 200;
    ``worker_token`` puts it in training mode (``adapter.worker_token``)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable, "-m", "adapter",
        "--engines", ",".join(engines),
        "--model", str(model_dir),
        "--redis", redis_url,
        "--port", str(port),
        "--log-level", "warning",
        *extra_args,
    ]  # fmt: skip
    env = {"PYTHONPATH": str(REPO_ROOT)}
    headers = {}
    if worker_token is not None:
        env["SWERL_ADAPTER__WORKER_TOKEN"] = worker_token
        headers["authorization"] = f"Bearer {worker_token}"
    managed = launch(
        f"adapter {url}",
        argv,
        log_dir / f"adapter-{port}.log",
        ready=f"{url}/health",
        timeout_s=timeout_s,
        env=env,
        cwd=REPO_ROOT,
        grace_s=20,
    )
    return AdapterProcess(url, port, managed, headers)
