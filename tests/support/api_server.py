"""A real job API process (``python -m services.api``) on a free loopback port, for tests."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from services.processes import ManagedProcess, free_port, http_ok, launch
from tests.support.paths import REPO_ROOT

# The tokens of the test deployment: name -> (secret, scopes).
TOKENS: dict[str, tuple[str, list[str]]] = {
    "root": ("root-secret-0001", ["admin"]),
    "alice": ("alice-secret-001", ["read", "submit"]),
    "bob": ("bob-secret-00001", ["read", "submit"]),
    "viewer": ("viewer-secret-01", ["read"]),
}


def tokens_env() -> str:
    """``SWERL_API__TOKENS``: the test tokens as a YAML flow list."""
    items = [
        f"{{name: {name}, token: {secret}, scopes: [{', '.join(scopes)}]}}"
        for name, (secret, scopes) in TOKENS.items()
    ]
    return "[" + ", ".join(items) + "]"


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name][0]}"}


@dataclass
class ApiServer:
    url: str
    process: ManagedProcess

    def client(self, name: str | None = "root") -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=bearer(name) if name else {}, timeout=30)

    def stop(self) -> None:
        self.process.stop()


def start_api(
    redis_url: str, log_dir: Path, *, runner_threads: int = 0, env: Mapping[str, str] = ()
) -> ApiServer:
    """Start the API against ``redis_url`` (no job runner unless ``runner_threads``)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "services.api", "--redis", redis_url, "--port", str(port)]
    argv += ["--runner-threads", str(runner_threads), "--log-level", "WARNING"]
    process = launch(
        "api",
        argv,
        log_dir / f"api-{port}.log",
        ready=http_ok(f"{url}/healthz"),
        timeout_s=60,
        env={"SWERL_API__TOKENS": tokens_env(), "PYTHONDONTWRITEBYTECODE": "1", **dict(env)},
        cwd=REPO_ROOT,
        grace_s=10,
    )
    return ApiServer(url, process)
