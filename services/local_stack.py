"""Start swerl's services as local processes (Redis, engines, adapter, worker) and stop them.

Used by ``python -m services.demo`` (``make demo``) to run the whole system on one machine:
each process logs to ``<run_dir>/<name>.log``, readiness is awaited (a TCP/HTTP probe), and
everything started is stopped on exit, also when start-up fails halfway. The process lifecycle
itself is :mod:`services.processes`.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from services.processes import (
    ManagedProcess,
    ProcessError,
    Ready,
    free_port,
    http_ok,
    launch,
    tcp_open,
)

STOP_GRACE_S = 40.0  # the worker drains its trajectories on SIGTERM


class StackError(RuntimeError):
    """A service did not start (the message carries the tail of its log), or the run failed."""


@dataclass
class LocalStack:
    run_dir: Path
    procs: dict[str, ManagedProcess] = field(default_factory=dict)

    def start(
        self,
        name: str,
        cmd: list[str],
        ready: Ready,
        *,
        timeout_s: float = 300.0,
        env: dict[str, str] | None = None,
    ) -> ManagedProcess:
        log = self.run_dir / f"{name}.log"
        try:
            proc = launch(
                name, cmd, log, ready=ready, timeout_s=timeout_s, env=env, grace_s=STOP_GRACE_S
            )
        except ProcessError as exc:
            raise StackError(str(exc)) from exc
        self.procs[name] = proc
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

    def python(self, name: str, module: str, args: list[str], ready: Ready,
               **kw: object) -> ManagedProcess:  # fmt: skip
        return self.start(name, [sys.executable, "-m", module, *args], ready, **kw)  # type: ignore[arg-type]

    def start_reference_engine(self, name: str, model: Path, script: Path | None = None) -> str:
        """The reference engine (SGLang's protocol on CPU) on ``model``; scripted mode with
        ``script``. Its URL."""
        port = free_port()
        extra = ["--script", str(script)] if script is not None else []
        self.python(name, "services.reference_engine.server",
                    ["--model", str(model), "--port", str(port), *extra],
                    http_ok(f"http://127.0.0.1:{port}/health"))  # fmt: skip
        return f"http://127.0.0.1:{port}"

    def start_adapter(
        self, engines: list[str], model: Path, redis_url: str, env: dict[str, str]
    ) -> str:
        """The adapter in front of ``engines`` (``env``: its settings, e.g. the worker token,
        never on a command line). Its URL."""
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        self.python("adapter", "adapter",
                    ["--engines", ",".join(engines), "--model", str(model), "--redis", redis_url,
                     "--port", str(port)],
                    http_ok(f"{url}/health"), env=env)  # fmt: skip
        return url

    def start_relay_adapter(
        self, upstream: str, model: str, key_env: str | None, redis_url: str, env: dict[str, str]
    ) -> str:
        """The adapter in relay mode in front of the OpenAI-compatible ``upstream`` (its API
        key read from ``$key_env`` by the adapter, never passed on). Its URL."""
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        key = ["--upstream-key-env", key_env] if key_env else []
        self.python("adapter", "adapter",
                    ["--upstream-url", upstream, "--upstream-model", model, *key,
                     "--redis", redis_url, "--port", str(port)],
                    http_ok(f"{url}/health"), env=env)  # fmt: skip
        return url

    def stop_all(self) -> None:
        """Stop processes newest first, each fully before the next (the worker drains while
        Redis is still up): SIGTERM, then SIGKILL after ``STOP_GRACE_S``."""
        for name in reversed(list(self.procs)):
            self.procs[name].stop()
        self.procs.clear()


def adapter_env(worker_token: str, admin_token: str | None) -> dict[str, str]:
    """The adapter's tokens as environment settings (never on a command line)."""
    env = {"SWERL_ADAPTER__WORKER_TOKEN": worker_token}
    if admin_token is not None:
        env["SWERL_ADAPTER__ADMIN_TOKEN"] = admin_token
    return env


@dataclass(frozen=True)
class ToyServices:
    """Where the toy-task stack of :func:`start_toy_services` listens."""

    redis_url: str
    engine_url: str
    adapter_url: str
    node: str


def start_toy_services(
    stack: LocalStack,
    model: Path,
    worker_token: str,
    *,
    slots: int = 4,
    node: str = "toy-node",
    engine_args: tuple[str, ...] = (),
    admin_token: str | None = None,
) -> ToyServices:
    """Redis, a reference engine sampling ``model`` (the warm-started toy model,
    docs/toy-task.md), the adapter in training mode (``worker_token``) and a toy-only sandbox
    worker (``--kinds toy``: no container, no sandbox backend is used). The caller brings the
    rollout manager (``RolloutManager(redis_url).start()``) and submits requests of kind toy.
    ``admin_token`` opens the adapter's /admin routes (a training run publishing weights)."""
    from services.queue.config import QueueConfig
    from services.queue.submitter import SubmitterQueue

    redis_url = stack.start_redis()
    port = free_port()
    engine_url = f"http://127.0.0.1:{port}"
    stack.python("engine", "services.reference_engine.server",
                 ["--model", str(model), "--port", str(port), *engine_args],
                 http_ok(f"{engine_url}/health"))  # fmt: skip
    port = free_port()
    adapter_url = f"http://127.0.0.1:{port}"
    stack.python("adapter", "adapter",
                 ["--engines", engine_url, "--model", str(model), "--redis", redis_url,
                  "--port", str(port)],
                 http_ok(f"{adapter_url}/health"),
                 env=adapter_env(worker_token, admin_token))  # fmt: skip
    queue = SubmitterQueue(redis_url, QueueConfig())

    def alive() -> bool:
        return any(n.name == node and n.alive for n in queue.nodes())

    env = {"SWERL_WORKER__ROLLOUT__ADAPTER_URL": adapter_url,
           "SWERL_WORKER__ROLLOUT__ADAPTER_TOKEN": worker_token}  # fmt: skip
    try:
        stack.python("worker", "sandbox_worker",
                     ["--redis", redis_url, "--node", node, "--slots", str(slots),
                      "--backend", "bwrap", "--kinds", "toy"],
                     alive, env=env, timeout_s=120)  # fmt: skip
    finally:
        queue.close()
    return ToyServices(redis_url, engine_url, adapter_url, node)
