"""Test helpers for engines: the tiny model on disk and a reference-engine subprocess.

``tiny_model_path`` builds (once) the tiny model under ``$SWERL_CACHE_DIR`` if that is set, else
under a pytest temporary directory. ``start_reference_server`` runs
``python -m services.reference_engine.server`` on a free loopback port as a real subprocess
(:mod:`services.processes`) and waits for ``/health``; use it as a context manager (or call
``stop()``).
``reference_server_in_thread`` serves the same app from a thread of the test process: it starts in
well under a second once torch is imported (a subprocess pays ~5-25 s of imports on a busy
machine), so tests that need several differently configured engines use it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.processes import ManagedProcess, ProcessError, free_port, launch
from services.tiny_model.build import ensure_tiny_model
from tests.support.paths import REPO_ROOT

STARTUP_TIMEOUT_S = 90.0


def tiny_model_path(
    fallback_dir: Path, coder: bool = False, seed: int = 0, moe: bool = False
) -> Path:
    """The tiny model directory, built if missing (cached in $SWERL_CACHE_DIR when set);
    ``moe``: its Qwen3-MoE variant."""
    name = (
        "tiny-model"
        + ("-coder" if coder else "")
        + ("-moe" if moe else "")
        + (f"-seed{seed}" if seed else "")
    )
    cache = os.environ.get("SWERL_CACHE_DIR")
    root = Path(cache) if cache else fallback_dir
    return ensure_tiny_model(root / name, coder=coder, seed=seed, moe=moe)


@contextmanager
def tiny_model_for_session(coder: bool = False, seed: int = 0, moe: bool = False) -> Iterator[Path]:
    """The tiny model for a test session: cached in $SWERL_CACHE_DIR, else a private temp dir.

    A private ``mkdtemp`` (not pytest's numbered base temp) because concurrent pytest sessions on
    one machine prune each other's old base temp directories.
    """
    if os.environ.get("SWERL_CACHE_DIR"):
        yield tiny_model_path(Path(os.environ["SWERL_CACHE_DIR"]), coder=coder, seed=seed, moe=moe)
        return
    root = Path(tempfile.mkdtemp(prefix="swerl-tiny-model-"))
    try:
        yield tiny_model_path(root, coder=coder, seed=seed, moe=moe)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session", name="tiny_model_dir")
def tiny_model_dir_fixture() -> Iterator[Path]:
    """``tiny_model_dir``: the tiny model, once per test session (import it into a conftest)."""
    with tiny_model_for_session() as path:
        yield path


@pytest.fixture(scope="session", name="tiny_moe_dir")
def tiny_moe_dir_fixture() -> Iterator[Path]:
    """``tiny_moe_dir``: the tiny Qwen3-MoE model (4 experts, top-2), once per session."""
    with tiny_model_for_session(moe=True) as path:
        yield path


@pytest.fixture(scope="session", name="toy_model_dir")
def toy_model_dir_fixture() -> Iterator[Path]:
    """``toy_model_dir``: the tiny model after the toy task's format warm-start
    (services/tiny_model/warm_start.py; ~40 CPU-seconds to build when not cached)."""
    from services.tiny_model.warm_start import DEFAULT_DIR_NAME, ensure_warm_start

    with tiny_model_for_session() as base:
        yield ensure_warm_start(base.parent / DEFAULT_DIR_NAME, base)


@pytest.fixture(scope="session", name="tiny_coder_dir")
def tiny_coder_dir_fixture() -> Iterator[Path]:
    """``tiny_coder_dir``: the tiny model with the coder chat template, once per session."""
    with tiny_model_for_session(coder=True) as path:
        yield path


@dataclass
class ReferenceServer:
    """A running reference engine subprocess."""

    url: str
    port: int
    managed: ManagedProcess
    args: list[str] = field(default_factory=list)
    owns_log_dir: bool = False

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.managed.popen

    @property
    def log_path(self) -> Path:
        return self.managed.log_path

    def log(self) -> str:
        return self.managed.log()

    def stop(self) -> None:
        """Stop the process; a log directory this helper created is removed with it."""
        self.managed.stop()
        if self.owns_log_dir:
            shutil.rmtree(self.log_path.parent, ignore_errors=True)


def launch_reference_server(
    model_dir: Path,
    script: Path | None = None,
    weight_version: str | None = None,
    extra_args: Sequence[str] = (),
    log_dir: Path | None = None,
    timeout_s: float = STARTUP_TIMEOUT_S,
) -> ReferenceServer:
    """Start a reference engine and wait until ``GET /health`` answers 200."""
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "services.reference_engine.server",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    if script is not None:
        args += ["--script", str(script)]
    if weight_version is not None:
        args += ["--weight-version", weight_version]
    args += list(extra_args)
    owns_log_dir = log_dir is None
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="swerl-engine-"))
    url = f"http://127.0.0.1:{port}"
    try:
        managed = launch(
            f"reference engine {url}",
            args,
            log_dir / f"reference-server-{port}.log",
            ready=f"{url}/health",
            timeout_s=timeout_s,
            env={"PYTHONPATH": str(REPO_ROOT), "TOKENIZERS_PARALLELISM": "false"},
            cwd=REPO_ROOT,
        )
    except ProcessError:
        if owns_log_dir:
            shutil.rmtree(log_dir, ignore_errors=True)
        raise
    return ReferenceServer(url, port, managed, args, owns_log_dir)


@contextmanager
def start_reference_server(
    model_dir: Path,
    script: Path | None = None,
    weight_version: str | None = None,
    extra_args: Sequence[str] = (),
    log_dir: Path | None = None,
) -> Iterator[ReferenceServer]:
    server = launch_reference_server(model_dir, script, weight_version, extra_args, log_dir)
    try:
        yield server
    finally:
        server.stop()


@dataclass
class ThreadedReferenceServer:
    """A reference engine served by uvicorn from a thread of this process."""

    url: str
    port: int
    state: object  # services.reference_engine.server.ServerState


@contextmanager
def reference_server_in_thread(
    model_dir: Path,
    script: Path | None = None,
    weight_version: str | None = None,
    extra_args: Sequence[str] = (),
) -> Iterator[ThreadedReferenceServer]:
    """Serve a reference engine in-process (same CLI arguments as the subprocess)."""
    import uvicorn

    from services.reference_engine.server import build_state, create_app, parse_args

    port = free_port()
    argv = ["--model", str(model_dir), "--port", str(port), "--log-level", "warning"]
    if script is not None:
        argv += ["--script", str(script)]
    if weight_version is not None:
        argv += ["--weight-version", weight_version]
    argv += list(extra_args)
    args = parse_args(argv)
    state = build_state(args)
    config = uvicorn.Config(
        create_app(state), host="127.0.0.1", port=port, log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"reference-server-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"in-process reference server on port {port} did not start")
        time.sleep(0.02)
    try:
        yield ThreadedReferenceServer(f"http://127.0.0.1:{port}", port, state)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def engine_url(tiny_model_dir: Path) -> Iterator[str]:
    """A reference engine serving the tiny model (``tiny_model_dir``), for one test module."""
    with reference_server_in_thread(tiny_model_dir) as server:
        yield server.url
