"""A private, real ``redis-server`` on a free loopback port, for tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RedisServer:
    """A ``redis-server`` process; ``restart()`` keeps its data dir (AOF) and port."""

    port: int
    data_dir: Path
    appendonly: bool = True
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: run `make setup`")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.data_dir),
                "--appendonly", "yes" if self.appendonly else "no",
                "--appendfsync", "always",
                "--save", "",
                "--protected-mode", "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.02)
        client.close()

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def start_redis(appendonly: bool = True) -> RedisServer:
    server = RedisServer(
        port=free_port(),
        data_dir=Path(tempfile.mkdtemp(prefix="swerl-redis-")),
        appendonly=appendonly,
    )
    server.start()
    return server


def stop_redis(server: RedisServer) -> None:
    server.stop()
    shutil.rmtree(server.data_dir, ignore_errors=True)
