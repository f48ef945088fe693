"""A private, real ``redis-server`` on a free loopback port, for tests."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import redis

from services.processes import ManagedProcess, free_port, launch


@dataclass
class RedisServer:
    """A ``redis-server`` process; ``restart()`` keeps its data dir (AOF) and port."""

    port: int
    data_dir: Path
    appendonly: bool = True
    managed: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.managed.popen if self.managed else None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: run `make setup`")
        argv = [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--save", "",
            "--protected-mode", "yes",
        ]  # fmt: skip
        log = self.data_dir / "redis-server.log"
        self.managed = launch(
            "redis-server", argv, log, ready=self._pong, timeout_s=10, grace_s=10, poll_s=0.02
        )

    def _pong(self) -> bool:
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False
        finally:
            client.close()

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (Redis exits cleanly), or SIGKILL at once with ``kill`` (a crash)."""
        if self.managed:
            self.managed.stop(grace_s=0 if kill else None)
        self.managed = None

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
