"""Child processes with a lifecycle: launched with their output in a log file, awaited until ready,
stopped with SIGTERM then SIGKILL, and never left behind by their caller.

The one process harness of the demo (:mod:`services.local_stack`), the tests and the benchmarks::

    port = free_port()
    with launch("engine", [sys.executable, "-m", "x", "--port", str(port)], log_dir / "engine.log",
                ready=f"http://127.0.0.1:{port}/health") as engine:
        ...

* A child runs in its own session (process group): :meth:`ManagedProcess.stop` signals the whole
  group, so what the child started goes with it, and a terminal's Ctrl-C reaches only the caller.
* A child that exits before it is ready, or is not ready in time, is stopped and raises
  :class:`ProcessError` with the tail of its log.
* Every process still running when the caller's interpreter exits (normally or by an uncaught
  exception) is stopped by an ``atexit`` hook. A caller killed by SIGKILL cannot run it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

DEFAULT_GRACE_S = 15.0
LOG_TAIL_CHARS = 3000

# What "ready" means: a probe that returns True, a URL that must answer 200, or None (no wait).
Ready = Callable[[], bool] | str | None


class ProcessError(RuntimeError):
    """A child process did not become ready; the message carries the tail of its log."""


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (the OS may hand it out again later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_ok(url: str, timeout_s: float = 2.0) -> Callable[[], bool]:
    """A probe: ``GET url`` answers 200."""

    def probe() -> bool:
        try:
            return httpx.get(url, timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    return probe


def tcp_open(port: int, host: str = "127.0.0.1") -> Callable[[], bool]:
    """A probe: something accepts TCP connections on ``host:port``."""

    def probe() -> bool:
        with socket.socket() as s:
            s.settimeout(1.0)
            return s.connect_ex((host, port)) == 0

    return probe


_live: set[ManagedProcess] = set()
_live_lock = threading.Lock()


@dataclass(eq=False)
class ManagedProcess:
    """A running child process (see :func:`launch`); a context manager that stops it."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    grace_s: float = DEFAULT_GRACE_S

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def running(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        return self.log()[-chars:]

    def wait_ready(self, ready: Ready, timeout_s: float, poll_s: float = 0.2) -> None:
        """Poll ``ready`` until it holds; raise :class:`ProcessError` if the process exits first
        or ``timeout_s`` passes (the process is left running: the caller decides)."""
        if ready is None:
            return
        probe = http_ok(ready) if isinstance(ready, str) else ready
        deadline = time.monotonic() + timeout_s
        while not probe():
            if self.popen.poll() is not None:
                raise ProcessError(
                    f"{self.name} exited with {self.popen.returncode} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise ProcessError(
                    f"{self.name} was not ready after {timeout_s:.0f}s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(poll_s)

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the child's process group (while the child has not been reaped)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signum)

    def stop(self, grace_s: float | None = None) -> int:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; return the exit status.
        Idempotent; ``grace_s=0`` kills at once."""
        grace = self.grace_s if grace_s is None else grace_s
        if grace > 0:
            self.signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace)
        self.signal_group(signal.SIGKILL)
        returncode = self.popen.wait(timeout=30)
        with _live_lock:
            _live.discard(self)
        return returncode

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def launch(
    name: str,
    argv: Sequence[str],
    log_path: Path,
    *,
    ready: Ready = None,
    timeout_s: float = 300.0,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    poll_s: float = 0.2,
) -> ManagedProcess:
    """Start ``argv`` (stdout and stderr appended to ``log_path``, ``env`` over this process's
    environment) and wait until ``ready``; a process that does not get ready is stopped and
    :class:`ProcessError` raised."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    process = ManagedProcess(name, popen, log_path, grace_s)
    with _live_lock:
        _live.add(process)
    try:
        process.wait_ready(ready, timeout_s, poll_s)
    except BaseException:
        process.stop()
        raise
    return process


def start_in_parallel[T](
    launchers: Sequence[Callable[[], T]], stop: Callable[[T], object]
) -> list[T]:
    """Run the launchers concurrently (in threads); if any fails, stop the ones that started and
    re-raise the first error. Returns the results in the launchers' order."""
    with ThreadPoolExecutor(max(1, len(launchers))) as pool:
        futures = [pool.submit(launch) for launch in launchers]
        wait(futures)
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        for future in futures:
            if future.exception() is None:
                stop(future.result())
        raise errors[0]
    return [f.result() for f in futures]


@atexit.register
def _stop_leftovers() -> None:
    with _live_lock:
        leftovers = list(_live)
    for process in leftovers:
        process.stop(grace_s=min(process.grace_s, 5.0))
