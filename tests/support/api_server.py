"""A real job API process (``python -m services.api``) on a free loopback port, for tests."""

from __future__ import annotations

import json
import os
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


def roots_env(log_dir: Path) -> dict[str, str]:
    """``api.paths`` of the test deployment: the pytest run's temporary tree (``log_dir``'s
    parent holds every test's ``tmp_path``), ``tests/data`` and ``$SWERL_CACHE_DIR`` are
    inputs, the temporary tree is the output root. JSON lists are YAML flow lists."""
    tmp = str(log_dir.resolve().parent)
    inputs = [tmp, str(REPO_ROOT / "tests" / "data")]
    if cache := os.environ.get("SWERL_CACHE_DIR"):  # the tiny models live there under make
        inputs.append(str(Path(cache).resolve()))
    return {
        "SWERL_API__PATHS__INPUTS": json.dumps(inputs),
        "SWERL_API__PATHS__OUTPUTS": json.dumps([tmp]),
    }


def start_api(
    redis_url: str, log_dir: Path, *, runner_threads: int = 0, env: Mapping[str, str] = ()
) -> ApiServer:
    """Start the API against ``redis_url`` (no job runner unless ``runner_threads``); job
    paths must lie under :func:`roots_env` unless ``env`` sets other roots."""
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
        env={
            "SWERL_API__TOKENS": tokens_env(),
            "PYTHONDONTWRITEBYTECODE": "1",
            **roots_env(log_dir),
            **dict(env),
        },
        cwd=REPO_ROOT,
        grace_s=10,
    )
    return ApiServer(url, process)
