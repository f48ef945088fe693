"""Start swerl's services as local processes (Redis, engines, adapter, worker) and stop them.

Used by ``python -m services.demo`` (``make demo``) to run the whole system on one machine:
each process logs to ``<run_dir>/<name>.log``, readiness is awaited (a TCP/HTTP probe), and
everything started is stopped on exit, also when start-up fails halfway.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx


class StackError(RuntimeError):
    """A service did not start; the message carries the tail of its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_ok(url: str) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            return httpx.get(url, timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    return probe


def tcp_open(port: int) -> Callable[[], bool]:
    def probe() -> bool:
        with socket.socket() as s:
            s.settimeout(1.0)
            return s.connect_ex(("127.0.0.1", port)) == 0

    return probe


@dataclass
class LocalStack:
    run_dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def log_path(self, name: str) -> Path:
        return self.run_dir / f"{name}.log"

    def log_tail(self, name: str, n: int = 3000) -> str:
        try:
            return self.log_path(name).read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def start(
        self,
        name: str,
        cmd: list[str],
        ready: Callable[[], bool],
        *,
        timeout_s: float = 300.0,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen:
        log = self.log_path(name).open("ab")
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self.procs[name] = proc
        deadline = time.monotonic() + timeout_s
        while not ready():
            if proc.poll() is not None:
                raise StackError(f"{name} exited ({proc.returncode}):\n{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise StackError(f"{name} not ready after {timeout_s:.0f}s:\n{self.log_tail(name)}")
            time.sleep(0.2)
        return proc

    def start_redis(self) -> str:
        binary = shutil.which("redis-server")
        if binary is None:
            raise StackError("redis-server is not installed: run `make setup`")
        port = free_port()
        data = self.run_dir / "redis"
        data.mkdir(exist_ok=True)
        cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
               "--appendonly", "yes", "--save", ""]  # fmt: skip
        self.start("redis", cmd, tcp_open(port), timeout_s=20)
        return f"redis://127.0.0.1:{port}/0"

    def python(self, name: str, module: str, args: list[str], ready: Callable[[], bool],
               **kw: object) -> subprocess.Popen:  # fmt: skip
        return self.start(name, [sys.executable, "-m", module, *args], ready, **kw)  # type: ignore[arg-type]

    def stop_all(self, grace_s: float = 40.0) -> None:
        """Stop processes newest first, each fully before the next (the worker drains while
        Redis is still up): SIGTERM, then SIGKILL after ``grace_s``."""
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
        self.procs.clear()
