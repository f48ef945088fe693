"""Helpers shared by the docker and bwrap backends (pure functions, no I/O on sandboxes)."""

from __future__ import annotations

import io
import os
import shlex
import shutil
import tarfile
import time
from pathlib import Path

from sandbox_worker.backends.base import (
    CONTROL_DIR,
    DEFAULT_PATH,
    SANDBOX_HOME,
    SandboxInfraError,
    SandboxSpec,
    validate_sandbox_path,
)

# Exec output kept per call: commands (test runs, an agent's `cat` of a huge file) can print
# without bound; the head and the tail are what callers look at.
DEFAULT_MAX_OUTPUT_BYTES = 8 * 1024 * 1024
RELAY_SCRIPT = Path(__file__).resolve().parent.parent / "relay" / "inner_relay.py"
LLM_SOCKET = "llm.sock"
# How long after a timeout the process group gets to die before it is killed (SIGTERM first).
KILL_GRACE_S = 3


class OutputBuffer:
    """Accumulates output bytes, keeping the first and last ``limit/2`` bytes past the limit."""

    def __init__(self, limit: int = DEFAULT_MAX_OUTPUT_BYTES) -> None:
        if limit < 1024:
            raise ValueError("output limit must be >= 1024 bytes")
        self.limit = limit
        self._head = bytearray()
        self._tail = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        half = self.limit // 2
        room = half - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data:
            return
        self._tail += data
        if len(self._tail) > half:
            cut = len(self._tail) - half
            self.dropped += cut
            del self._tail[:cut]

    def text(self) -> str:
        mid = f"\n[... {self.dropped} bytes of output dropped ...]\n" if self.dropped else ""
        return self._head.decode("utf-8", "replace") + mid + self._tail.decode("utf-8", "replace")


def exec_env(
    spec: SandboxSpec, image_env: dict[str, str], extra: dict[str, str] | None
) -> dict[str, str]:
    """The environment of one exec: image ENV < defaults < spec.env < per-call env."""
    env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}
    env.update(image_env)
    env["HOME"] = SANDBOX_HOME
    env.update(spec.env)
    if extra:
        env.update(extra)
    for key in env:
        if not key or "=" in key or "\x00" in key or "\x00" in env[key]:
            raise ValueError(f"invalid environment variable {key!r}")
    return env


def parse_image_env(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, _, value = item.partition("=")
        if key:
            out[key] = value
    return out


def background_argv(argv: list[str], log_path: str) -> list[str]:
    """Wrap ``argv`` to run in its own session and log to ``log_path``; it first prints its pid.

    The pid (one line on stdout, read by the worker before the command starts) leads a new
    process group, so killing ``-pid`` reaches its children. It travels on the exec's own
    stream rather than through a file: no place the sandbox's processes can write holds it.
    """
    validate_sandbox_path(log_path)
    script = 'echo "$$"; log="$1"; shift; exec "$@" >"$log" 2>&1 </dev/null'
    return ["setsid", "-w", "/bin/bash", "-c", script, "swerl-bg", log_path, *argv]


def relay_command(python: str, sandbox_port: int, ready_file: str) -> list[str]:
    """Argv of the LLM relay in the sandbox's network namespace (loopback TCP -> the control
    dir's unix socket); it runs where the sandbox's processes cannot reach it (base.py)."""
    return [
        python,
        f"{CONTROL_DIR}/inner_relay.py",
        "tcp2unix",
        "--listen",
        f"127.0.0.1:{sandbox_port}",
        "--connect",
        f"{CONTROL_DIR}/{LLM_SOCKET}",
        "--ready-file",
        ready_file,
    ]


def expose_command(python: str, sandbox_port: int, ready_file: str) -> tuple[list[str], str]:
    """Argv of a relay from a control-dir unix socket to a loopback port of the sandbox's network
    namespace (run, like the LLM relay, out of the sandbox processes' reach)."""
    sock = f"port-{sandbox_port}.sock"
    argv = [
        python,
        f"{CONTROL_DIR}/inner_relay.py",
        "unix2tcp",
        "--listen",
        f"{CONTROL_DIR}/{sock}",
        "--connect",
        f"127.0.0.1:{sandbox_port}",
        "--ready-file",
        ready_file,
    ]
    return argv, sock


def prepare_control_dir(ctl: Path) -> None:
    ctl.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(RELAY_SCRIPT, ctl / "inner_relay.py")


def wait_for_file(path: Path, timeout_s: float, what: str, alive: object = None) -> None:
    """Poll for ``path``; ``alive`` (a callable) lets the wait stop early when a process died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return
        if callable(alive) and not alive():
            raise SandboxInfraError(f"{what} exited before becoming ready")
        time.sleep(0.02)
    raise SandboxInfraError(f"{what} not ready after {timeout_s:.0f}s")


def tar_single_file(name: str, data: bytes, mode: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = mode
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tar_host_path(host_path: Path, arcname: str) -> bytes:
    """A tar of ``host_path`` (file or directory) whose top entry is ``arcname``."""
    if not host_path.exists():
        raise FileNotFoundError(f"host path does not exist: {host_path}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(host_path), arcname=arcname, recursive=True)
    return buf.getvalue()


def extract_single_tree(tar: tarfile.TarFile, host_path: Path) -> None:
    """Extract a tar whose top entry is one file or dir so that it lands at ``host_path``.

    Works on streamed archives (``mode="r|"``). The ``tar`` extraction filter refuses absolute
    paths and paths escaping the destination: a sandbox's output is untrusted.
    """
    host_path.parent.mkdir(parents=True, exist_ok=True)
    staging = host_path.parent / f".swerl-copy-{os.getpid()}-{time.monotonic_ns()}"
    staging.mkdir()
    try:
        tar.extractall(staging, filter="tar")
        entries = list(staging.iterdir())
        if len(entries) != 1:
            raise FileNotFoundError(f"expected one top-level entry in archive, got {len(entries)}")
        if host_path.is_dir() and not host_path.is_symlink():
            shutil.rmtree(host_path)
        elif host_path.exists() or host_path.is_symlink():
            host_path.unlink()
        os.replace(entries[0], host_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def quote(argv: list[str]) -> str:
    return shlex.join(argv)
