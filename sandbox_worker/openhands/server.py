"""The OpenHands agent server inside a sandbox, and a conversation run through it.

Layout (see docs/openhands.md and docs/sandboxes.md)::

    worker (host)                                  sandbox (no network); <ctl> and the inner
                                                   relays sit beside it (host side, its netns)
    RemoteConversation ──TCP──> RelayHub.tcp_to_unix ──> <ctl>/port-8000.sock
                                                     └─> inner relay ──TCP──> agent server :8000
                                                                              (tools run here)
    adapter <──TCP── RelayHub.llm_relay  <── <ctl>/llm.sock <── inner relay <── LLM calls
                                                                  127.0.0.1:18080

* The agent server is ``python -m openhands.agent_server`` from a **read-only bundle**: the host's
  Python runtime and the project venv, bind-mounted at their host paths
  (:attr:`AgentServerBundle.ro_mounts`, to be put into ``SandboxSpec.ro_mounts``). The task image
  stays untouched; it only needs ``bash`` for the terminal tool.
* The worker reaches the server through ``Sandbox.expose(port)`` (a unix socket in the
  per-sandbox control dir on the host, relayed to the server's loopback port by a relay in the
  sandbox's network namespace, out of the agent's reach) wrapped in a host TCP
  listener; REST and the event websocket both go through it.
* The agent's LLM calls leave the sandbox only through the LLM relay: the agent's ``base_url``
  is ``sandbox.llm_base_url + "/t/<trajectory_id>/v1"``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from sandbox_worker.backends.base import (
    SANDBOX_HOME,
    BackgroundProcess,
    Sandbox,
    SandboxInfraError,
)
from sandbox_worker.openhands.config import OpenHandsConfig
from sandbox_worker.openhands.env import INPUTRC_TEXT, SDK_ENVIRONMENT
from sandbox_worker.openhands.result import AgentRunResult, EndReason
from sandbox_worker.relay.host_relay import RelayHandle, RelayHub
from services.protocol.tasks import AgentLimits, SamplingConfig

if TYPE_CHECKING:  # .conversation imports the SDK (~15 CPU-s); only needed once a run starts
    from sandbox_worker.openhands.conversation import CancelSignal, EventCallback

_log = logging.getLogger("swerl.openhands.server")

AGENT_SERVER_PORT = 8000  # inside the sandbox (loopback only)
SERVER_LOG = f"{SANDBOX_HOME}/openhands-agent-server.log"
_STATE_DIR = f"{SANDBOX_HOME}/openhands"
_TRAJECTORY_ID_CHARS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-"
)


class AgentServerError(SandboxInfraError):
    """The agent server could not be started or reached (an infrastructure failure)."""


@dataclass(frozen=True)
class AgentServerBundle:
    """The Python runtime + venv the agent server runs from, mounted read-only in sandboxes.

    ``python_root`` is the runtime's prefix (``sys.base_prefix``) and ``venv`` the project venv
    (``sys.prefix``); both keep their host paths inside the sandbox because the venv's
    ``bin/python`` symlink and ``pyvenv.cfg`` name the runtime by absolute path.
    """

    python_root: str
    venv: str

    @classmethod
    def current(cls) -> AgentServerBundle:
        """The bundle of the running interpreter (the worker's own environment)."""
        if sys.prefix == sys.base_prefix:
            raise AgentServerError(
                "the worker must run from the project venv: its interpreter is the agent "
                f"server bundle (sys.prefix {sys.prefix} is not a venv)"
            )
        return cls(str(Path(sys.base_prefix).resolve()), str(Path(sys.prefix).resolve()))

    def __post_init__(self) -> None:
        for name in ("python_root", "venv"):
            value = getattr(self, name)
            if not Path(value).is_absolute():
                raise ValueError(f"AgentServerBundle.{name} must be absolute, got {value!r}")

    @property
    def python(self) -> str:
        return f"{self.venv}/bin/python"

    @property
    def ro_mounts(self) -> dict[str, str]:
        """``SandboxSpec.ro_mounts`` entries that make the bundle available in a sandbox."""
        return {self.python_root: self.python_root, self.venv: self.venv}

    def check(self) -> None:
        """Fail early (on the host) if the bundle cannot start an agent server."""
        if not Path(self.python).exists():
            raise AgentServerError(f"no interpreter at {self.python}")
        if not any(Path(self.venv).glob("lib/python3*/site-packages/openhands/agent_server")):
            raise AgentServerError(f"openhands-agent-server is not installed in {self.venv}")


def agent_server_env(workdir: str) -> dict[str, str]:
    """Environment of the agent server process (and of the agent's tools, which inherit it)."""
    return {
        **SDK_ENVIRONMENT,
        "OH_CONVERSATIONS_PATH": f"{_STATE_DIR}/conversations",
        "OH_BASH_EVENTS_DIR": f"{_STATE_DIR}/bash_events",
        "OH_WORKSPACE_PATH": workdir,
        "OH_ENABLE_VSCODE": "0",
        "OH_ENABLE_BROWSER": "0",
        "HOME": SANDBOX_HOME,
        "PYTHONUNBUFFERED": "1",
    }


def agent_server_command(bundle: AgentServerBundle, port: int = AGENT_SERVER_PORT) -> list[str]:
    return [
        bundle.python,
        "-m",
        "openhands.agent_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


@dataclass
class AgentServerHandle:
    """A running agent server: ``url`` is its address on the host."""

    url: str
    process: BackgroundProcess
    relay: RelayHandle
    sandbox: Sandbox

    def log_tail(self, n_bytes: int = 4000) -> str:
        return _log_tail(self.sandbox, n_bytes)

    def close(self) -> None:
        """Stop listening on the host and kill the server (idempotent)."""
        with contextlib.suppress(Exception):
            self.relay.close()
        with contextlib.suppress(Exception):
            self.process.kill()


def _log_tail(sandbox: Sandbox, n_bytes: int = 4000) -> str:
    try:
        return sandbox.read_file(SERVER_LOG)[-n_bytes:].decode("utf-8", "replace")
    except Exception as exc:  # the log is diagnostics only
        return f"(no agent server log: {exc})"


def start_agent_server(
    sandbox: Sandbox,
    hub: RelayHub,
    bundle: AgentServerBundle,
    *,
    port: int = AGENT_SERVER_PORT,
    startup_timeout_s: float = 300.0,
) -> AgentServerHandle:
    """Start the agent server in ``sandbox`` and wait until it answers ``/ready``.

    The sandbox must have been created with ``bundle.ro_mounts``. Raises
    :class:`AgentServerError` (an infrastructure failure) with the server's log if it exits or
    does not become ready in time. Start-up imports the SDK: ~15 CPU-seconds.
    """
    missing = {h: s for h, s in bundle.ro_mounts.items() if sandbox.spec.ro_mounts.get(h) != s}
    if missing:
        raise ValueError(f"the sandbox lacks the agent server bundle mounts {missing}")
    sandbox.write_file(f"{SANDBOX_HOME}/.inputrc", INPUTRC_TEXT.encode())
    process = sandbox.spawn(
        agent_server_command(bundle, port),
        workdir=sandbox.spec.workdir,
        env=agent_server_env(sandbox.spec.workdir),
        log_path=SERVER_LOG,
    )
    relay: RelayHandle | None = None
    try:
        relay = hub.tcp_to_unix(sandbox.expose(port))
        handle = AgentServerHandle(f"http://127.0.0.1:{relay.port}", process, relay, sandbox)
        _wait_ready(handle, startup_timeout_s)
        return handle
    except BaseException:
        if relay is not None:
            relay.close()
        process.kill()
        raise


def _wait_ready(handle: AgentServerHandle, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    t0 = time.monotonic()
    with httpx.Client(timeout=5.0) as client:
        while True:
            if not handle.process.is_running():
                raise AgentServerError(
                    f"the agent server exited with {handle.process.exit_code()} during start-up:"
                    f"\n{handle.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{handle.url}/ready").status_code == 200:
                    _log.info("agent server ready after %.1fs", time.monotonic() - t0)
                    return
            if time.monotonic() > deadline:
                raise AgentServerError(
                    f"the agent server was not ready after {timeout_s:.0f}s:\n{handle.log_tail()}"
                )
            time.sleep(0.5)


def sandbox_llm_url(sandbox: Sandbox, trajectory_id: str) -> str:
    """The adapter's per-trajectory URL as seen from inside ``sandbox`` (through the relay)."""
    base = sandbox.llm_base_url
    if base is None:
        raise ValueError("the sandbox has no LLM relay (network policy llm_relay_only needed)")
    if not trajectory_id or not set(trajectory_id) <= _TRAJECTORY_ID_CHARS:
        raise ValueError(f"invalid trajectory id {trajectory_id!r}")
    relay = sandbox.spec.llm_relay
    if relay is not None and relay.trajectory_id != trajectory_id:
        raise ValueError(
            f"the sandbox's relay serves trajectory {relay.trajectory_id!r}, not {trajectory_id!r}"
        )
    return f"{base}/t/{trajectory_id}/v1"


def run_agent_in_sandbox(
    sandbox: Sandbox,
    hub: RelayHub,
    bundle: AgentServerBundle,
    trajectory_id: str,
    task_prompt: str,
    limits: AgentLimits,
    sampling: SamplingConfig,
    *,
    config: OpenHandsConfig | None = None,
    cancel: CancelSignal | None = None,
    callbacks: Sequence[EventCallback] = (),
    startup_timeout_s: float = 300.0,
) -> AgentRunResult:
    """Start the agent server in ``sandbox``, run the conversation there, stop the server.

    The wall-time limit covers the conversation, not the server's start-up. A server that does
    not start is an ``agent_server_error`` result (infrastructure), not an exception.
    """
    from sandbox_worker.openhands.conversation import RemoteTarget, run_agent

    llm_url = sandbox_llm_url(sandbox, trajectory_id)
    t0 = time.monotonic()
    try:
        server = start_agent_server(sandbox, hub, bundle, startup_timeout_s=startup_timeout_s)
    except AgentServerError as exc:
        return AgentRunResult(EndReason.AGENT_SERVER_ERROR, 0, time.monotonic() - t0, str(exc))
    try:
        result = run_agent(
            RemoteTarget(
                server.url, working_dir=sandbox.spec.workdir, alive=server.process.is_running
            ),
            llm_url,
            task_prompt,
            limits,
            sampling,
            config=config,
            cancel=cancel,
            callbacks=callbacks,
        )
        if result.end_reason is EndReason.AGENT_SERVER_ERROR:
            _log.warning("agent server failed; its log:\n%s", server.log_tail())
        return result
    finally:
        server.close()
