"""Fixtures of the adapter integration tests: real reference engines, real Redis, real adapter.

* ``engines`` -- reference engine subprocesses (tiny model, weight_version "0"), shared by the
  session: the kinds that the selected tests declare (``pytest.mark.engines("a", "scripted")``)
  start in parallel at the first use, any other kind when a test first uses it; a run of one test
  file starts only its engines. Tests that change their weights restore them.
  ``engines.scripted`` runs in **scripted mode** (test machinery: it replays the outputs of
  :data:`SCRIPTS` with the tiny model's real logprobs), for tests that need well-formed tool calls.
* ``adapter`` -- a factory that runs the adapter app in-process (uvicorn in a thread) against
  given engines and the session's Redis.
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from adapter.app import create_app
from adapter.config import AdapterConfig
from adapter.lifecycle import open_store
from adapter.rendering import Renderer
from adapter.service import AdapterService
from services.processes import free_port, start_in_parallel
from tests.support.engines import ReferenceServer, launch_reference_server, tiny_model_path

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


class EnginePool:
    """The session's reference engines (tiny model, weight_version "0"), each started on first use
    and then shared by the session, so a test run starts only the engines its tests use.

    ``a`` and ``b`` sample freely, ``scripted`` replays :data:`SCRIPTS`, ``spare`` is killed by the
    engine-failure test (no other test may use it).
    """

    KINDS = ("a", "b", "scripted", "spare")

    def __init__(self, model_dir: Path, work: Path) -> None:
        self.model_dir = model_dir
        self.work = work
        self.script = work / "script.jsonl"
        self.script.write_text("\n".join(json.dumps(s) for s in SCRIPTS) + "\n")
        self._servers: dict[str, ReferenceServer] = {}
        self._lock = threading.Lock()

    def get(self, kind: str) -> ReferenceServer:
        if kind not in self.KINDS:
            raise KeyError(f"no session engine {kind!r}; known: {self.KINDS}")
        with self._lock:
            if kind not in self._servers:
                script = self.script if kind == "scripted" else None
                self._servers[kind] = launch_reference_server(
                    self.model_dir, script, "0", (), self.work, ENGINE_START_TIMEOUT_S
                )
            return self._servers[kind]

    @property
    def a(self) -> ReferenceServer:
        return self.get("a")

    @property
    def b(self) -> ReferenceServer:
        return self.get("b")

    @property
    def scripted(self) -> ReferenceServer:
        return self.get("scripted")

    @property
    def spare(self) -> ReferenceServer:
        return self.get("spare")

    def start(self, kinds: Iterable[str]) -> None:
        """Start these kinds (those not running yet) in parallel."""
        missing = [k for k in dict.fromkeys(kinds) if k not in self.started()]
        start_in_parallel([functools.partial(self.get, k) for k in missing], ReferenceServer.stop)

    def started(self) -> dict[str, ReferenceServer]:
        with self._lock:
            return dict(self._servers)

    def stop(self) -> None:
        for server in self.started().values():
            server.stop()


def declared_kinds(items: Iterable[pytest.Item]) -> list[str]:
    """The engine kinds that the selected tests using ``engines`` declare with the marker."""
    kinds: list[str] = []
    for item in items:
        if "engines" in getattr(item, "fixturenames", ()):
            for marker in item.iter_markers("engines"):
                kinds += marker.args
    return list(dict.fromkeys(kinds))


@pytest.fixture(scope="session")
def engine_pool(model_dir: Path, request: pytest.FixtureRequest) -> Iterator[EnginePool]:
    """The session's engines: those the selected tests declare start in parallel (each is a torch
    process, ~5-60 s to start), any other kind when a test first uses it."""
    # Not under pytest's numbered temp dirs: concurrent pytest runs rotate those away.
    work = Path(tempfile.mkdtemp(prefix="swerl-adapter-engines-"))
    pool = EnginePool(model_dir, work)
    try:
        pool.start(declared_kinds(request.session.items))
        yield pool
    finally:
        pool.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def engines(engine_pool: EnginePool) -> EnginePool:
    for kind, server in engine_pool.started().items():
        if kind != "spare" and server.process.poll() is not None:
            raise RuntimeError(f"session engine {kind} ({server.url}) died:\n{server.log()}")
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
