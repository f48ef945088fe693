"""Fixtures of the adapter integration tests: real reference engines, real Redis, real adapter.

* ``engines`` -- two reference engine subprocesses (tiny model, weight_version "0"), shared by
  the session; tests that change their weights restore them.
* ``scripted_engine`` -- a reference engine in **scripted mode** (test machinery: it replays the
  outputs of :data:`SCRIPTS` with the tiny model's real logprobs), for tests that need
  well-formed tool calls.
* ``adapter`` -- a factory that runs the adapter app in-process (uvicorn in a thread) against
  given engines and the session's Redis.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from adapter.app import create_app
from adapter.config import AdapterConfig
from adapter.rendering import Renderer
from adapter.service import AdapterService, open_store
from tests.support.engines import ReferenceServer, free_port, tiny_model_path
from tests.support.engines import launch_reference_server as launch

ADMIN_TOKEN = "test-admin-token"
# Engine start-up is mostly importing torch; on a loaded 2-core machine it can take minutes.
ENGINE_START_TIMEOUT_S = 300.0

JSON_CALL_LS = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
JSON_CALL_CAT = (
    'Reading it.\n<tool_call>\n{"name": "bash", "arguments": {"command": "cat a.py"}}\n</tool_call>'
)
CODER_CALL = (
    "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n"
    "<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>"
)
MALFORMED_CALL = '<tool_call>\n{"name": "bash", "arguments": {oops}\n</tool_call>'

# Scripted conversations, chosen by a marker in the user message
# (see services.reference_engine.script).
SCRIPTS: list[dict[str, Any]] = [
    {"match": "TASK-JSON", "turns": [JSON_CALL_LS, JSON_CALL_CAT, "All done."]},
    {"match": "TASK-CODER", "turns": [CODER_CALL, "Done."]},
    {"match": "TASK-MALFORMED", "turns": [MALFORMED_CALL, "ok"]},
    {"match": "TASK-STREAM", "turns": [JSON_CALL_CAT, "Final answer."]},
]

BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["command"],
        },
    },
}


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_path(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def coder_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same weights and tokenizer, Qwen3-Coder XML chat template (only the adapter reads it)."""
    return tiny_model_path(tmp_path_factory.mktemp("tiny-coder"), coder=True)


@pytest.fixture(scope="session")
def model_dir_seed1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Other random weights, same tokenizer: what a weight refresh loads."""
    return tiny_model_path(tmp_path_factory.mktemp("tiny-seed1"), seed=1)


@dataclass
class EnginePool:
    a: ReferenceServer
    b: ReferenceServer
    scripted: ReferenceServer
    spare: ReferenceServer  # killed by the engine-failure test; no other test may use it

    def all(self) -> list[ReferenceServer]:
        return [self.a, self.b, self.scripted]


@pytest.fixture(scope="session")
def engine_pool(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnginePool]:
    """Start the session engines in parallel (each is a torch process: ~5-20 s)."""
    # Not under pytest's numbered temp dirs: concurrent pytest runs rotate those away.
    work = Path(tempfile.mkdtemp(prefix="swerl-adapter-engines-"))
    script = work / "script.jsonl"
    script.write_text("\n".join(json.dumps(s) for s in SCRIPTS) + "\n")
    scripts: list[Path | None] = [None, None, script, None]
    with ThreadPoolExecutor(len(scripts)) as pool:
        futures = [
            pool.submit(launch, model_dir, sc, "0", (), work, ENGINE_START_TIMEOUT_S)
            for sc in scripts
        ]
        errors = [f.exception() for f in futures]
    if any(errors):
        for future, error in zip(futures, errors, strict=True):
            if error is None:
                future.result().stop()
        raise RuntimeError(f"session engines did not start: {errors}")
    servers = [f.result() for f in futures]
    engines = EnginePool(*servers)
    yield engines
    for server in [*engines.all(), engines.spare]:
        server.stop()
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def engines(engine_pool: EnginePool) -> EnginePool:
    for server in engine_pool.all():
        if server.process.poll() is not None:
            raise RuntimeError(f"session engine {server.url} died:\n{server.log()}")
    return engine_pool


@dataclass
class RunningAdapter:
    url: str
    service: AdapterService
    server: uvicorn.Server
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop
    http: httpx.Client

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the adapter's event loop (its state is not thread-safe)."""

        async def wrapper() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result(timeout=10)

    def t(self, trajectory_id: str) -> str:
        """Per-trajectory OpenAI base URL."""
        return f"{self.url}/t/{trajectory_id}/v1"

    def chat(self, trajectory_id: str | None, body: dict[str, Any]) -> httpx.Response:
        base = self.t(trajectory_id) if trajectory_id else f"{self.url}/v1"
        return self.http.post(f"{base}/chat/completions", json=body)

    def record(self, trajectory_id: str) -> dict[str, Any]:
        response = self.http.get(f"{self.url}/trajectories/{trajectory_id}")
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        return data

    def admin(self) -> dict[str, str]:
        return {"authorization": f"Bearer {ADMIN_TOKEN}"}


AdapterFactory = Callable[..., AbstractContextManager[RunningAdapter]]


@pytest.fixture
def adapter(redis_url: str, model_dir: Path) -> Iterator[AdapterFactory]:
    """``with adapter(engines=[url, ...], **config) as a:`` runs an adapter in-process."""
    renderers: dict[tuple[str, int | None, float | None], Renderer] = {}

    @contextmanager
    def run(engines: list[str], **overrides: Any) -> Iterator[RunningAdapter]:
        settings: dict[str, Any] = {
            "engines": engines,
            "model": str(model_dir),
            "redis_url": redis_url,
            "admin_token": ADMIN_TOKEN,
            "probe_interval_s": 0.2,
            **overrides,
        }
        config = AdapterConfig(**settings)
        key = (config.model, config.context_length, config.max_bytes_per_token)
        if key not in renderers:
            renderers[key] = Renderer(
                config.model,
                context_length=config.context_length,
                max_bytes_per_token=config.max_bytes_per_token,
            )
        service = AdapterService(config, renderers[key], open_store(config))
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning")
        )
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=lambda: loop.run_until_complete(server.serve()), daemon=True
        )
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("in-process adapter did not start")
            time.sleep(0.02)
        http = httpx.Client(timeout=120)
        try:
            yield RunningAdapter(f"http://127.0.0.1:{port}", service, server, thread, loop, http)
        finally:
            http.close()
            server.should_exit = True
            thread.join(timeout=15)
            loop.close()

    yield run
