"""The OpenHands agent server inside a real sandbox (docker and bwrap), run from the host.

Real dockerd, real bubblewrap, real agent server started from the read-only bundle (host Python
+ project venv). The LLM is a scripted OpenAI server on the host that the sandbox reaches only
through the LLM relay; the worker reaches the agent server only through ``expose``.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox_worker.backends import SandboxBackend, make_backend
from sandbox_worker.backends.base import LlmRelay, NetworkPolicy, SandboxLimits, SandboxSpec
from sandbox_worker.openhands.config import OpenHandsConfig
from sandbox_worker.openhands.conversation import RemoteTarget, run_agent
from sandbox_worker.openhands.result import EndReason
from sandbox_worker.openhands.server import (
    AgentServerBundle,
    AgentServerError,
    AgentServerHandle,
    run_agent_in_sandbox,
    sandbox_llm_url,
    start_agent_server,
)
from sandbox_worker.relay.host_relay import RelayHub
from services.protocol.tasks import AgentLimits, SamplingConfig
from tests.support import sandboxes
from tests.support.docker import build_test_images, ensure_dockerd
from tests.support.fake_llm import FakeLLM, Reply, call

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

NODE = "ohtest"
CFG = OpenHandsConfig(num_retries=0)


@dataclass
class Env:
    root: Path
    image: str
    base_commit: str
    hub: RelayHub
    backends: dict[str, SandboxBackend]


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    ensure_dockerd()
    root = Path(tempfile.mkdtemp(prefix="swerl-oh-"))  # short: unix socket paths < 108 bytes
    hub = RelayHub()
    backends: dict[str, SandboxBackend] = {}
    try:
        image = build_test_images(root / "images")
        commit = sandboxes.tiny_base_commit(root / "repo")
        for kind in ("docker", "bwrap"):
            backends[kind] = make_backend(kind, state_root=root / kind, hub=hub)
        yield Env(root, image, commit, hub, backends)
        for kind, backend in backends.items():
            assert backend.list_sandboxes(NODE) == [], f"{kind} sandboxes left behind"
    finally:
        for backend in backends.values():
            backend.cleanup_node(NODE)
        hub.close()
        shutil.rmtree(root, ignore_errors=True)


def spec(
    env: Env, sandbox_id: str, llm_port: int, ro_mounts: dict[str, str], trajectory_id: str
) -> SandboxSpec:
    return SandboxSpec(
        image=env.image,
        node=NODE,
        sandbox_id=sandbox_id,
        network=NetworkPolicy.LLM_RELAY_ONLY,
        llm_relay=LlmRelay("127.0.0.1", llm_port, trajectory_id=trajectory_id),
        ro_mounts=ro_mounts,
        limits=SandboxLimits(cpus=1.0, memory_mb=2048, pids=512),
    )


@pytest.mark.parametrize("kind", ["docker", "bwrap"])
def test_agent_server_in_sandbox_runs_the_conversation(env: Env, kind: str) -> None:
    bundle = AgentServerBundle.current()
    bundle.check()
    swap = {
        "command": "str_replace",
        "path": "/testbed/calc.py",
        "old_str": "a + b",
        "new_str": "b + a",
    }
    replies = [
        Reply(tool_calls=[call("terminal", {"command": "printf 'from sandbox\\n' > made.txt"})]),
        Reply(tool_calls=[call("file_editor", swap)]),
        Reply(tool_calls=[call("finish", {"message": "done"})]),
    ]
    with (
        FakeLLM(replies) as llm,
        env.backends[kind].create(
            spec(env, f"run-{kind}", llm.port, bundle.ro_mounts, "traj-sbx.a1")
        ) as sb,
    ):
        result = run_agent_in_sandbox(
            sb,
            env.hub,
            bundle,
            "traj-sbx.a1",
            "Swap the operands in calc.py.",
            AgentLimits(max_steps=10, wall_time_s=300),
            SamplingConfig(max_tokens=64),
            config=CFG,
        )
        patch = sb.diff(env.base_commit)
    assert result.end_reason is EndReason.FINISHED, result
    assert result.n_steps == 3
    # The tools ran inside the sandbox, in /testbed: the patch has both changes.
    assert "+from sandbox" in patch and "made.txt" in patch
    assert "+    return b + a" in patch
    # Every LLM call came through the relay to the trajectory's URL, and only the agent's
    # three steps were made (the agent server's auto-title call is suppressed).
    assert [r.path for r in llm.requests] == ["/t/traj-sbx.a1/v1/chat/completions"] * 3


STUCK = Reply(tool_calls=[call("terminal", {"command": "sleep 120", "timeout": 300})])


def test_agent_server_dying_mid_run_is_reported_at_once(env: Env) -> None:
    """E.g. the OOM killer in the sandbox: infrastructure, not a wall-time timeout. The bar is
    half the wall time, not a wall-clock figure (it was 60 s): CI machines are noisy, and
    this test failed once in a loaded CI run whose output did not say why."""
    wall_s = 600
    bundle = AgentServerBundle.current()
    holder: dict[str, AgentServerHandle] = {}
    killed = threading.Event()

    def kill_after_first_call(body: dict[str, object]) -> Reply | None:
        if not killed.is_set():
            killed.set()
            threading.Timer(1.0, holder["server"].process.kill).start()
        return None

    with (
        FakeLLM([STUCK], choose=kill_after_first_call) as llm,
        env.backends["docker"].create(
            spec(env, "dies", llm.port, bundle.ro_mounts, "traj-dies")
        ) as sb,
    ):
        server = holder["server"] = start_agent_server(sb, env.hub, bundle)
        try:
            t0 = time.monotonic()
            result = run_agent(
                RemoteTarget(server.url, alive=server.process.is_running),
                sandbox_llm_url(sb, "traj-dies"),
                "x",
                AgentLimits(max_steps=10, wall_time_s=wall_s),
                SamplingConfig(),
                config=CFG,
            )
            elapsed = time.monotonic() - t0
        finally:
            server.close()
    assert killed.is_set()
    assert result.end_reason is EndReason.AGENT_SERVER_ERROR, result
    assert result.is_infrastructure
    assert elapsed < wall_s / 2, elapsed  # ended by the death, not by the wall time


def test_remote_step_longer_than_the_wall_time_is_cut(env: Env) -> None:
    bundle = AgentServerBundle.current()
    cfg = OpenHandsConfig(num_retries=0, stop_grace_s=3)
    with (
        FakeLLM([STUCK]) as llm,
        env.backends["bwrap"].create(
            spec(env, "stuck", llm.port, bundle.ro_mounts, "traj-stuck")
        ) as sb,
    ):
        t0 = time.monotonic()
        result = run_agent_in_sandbox(
            sb,
            env.hub,
            bundle,
            "traj-stuck",
            "x",
            AgentLimits(max_steps=10, wall_time_s=5),
            SamplingConfig(),
            config=cfg,
        )
        elapsed = time.monotonic() - t0  # includes the agent server's start-up
    assert result.end_reason is EndReason.TIMEOUT, result
    assert result.duration_s < 5 + 3 + 15, result
    assert elapsed < 240


def test_agent_server_that_cannot_start_is_an_infrastructure_failure(env: Env) -> None:
    real = AgentServerBundle.current()
    broken_venv = env.root / "broken-venv"  # mounted, but holds no interpreter
    broken_venv.mkdir(exist_ok=True)
    bundle = AgentServerBundle(real.python_root, str(broken_venv))
    with (
        FakeLLM([Reply(content="unused")]) as llm,
        env.backends["docker"].create(
            spec(env, "broken", llm.port, bundle.ro_mounts, "traj-broken")
        ) as sb,
    ):
        with pytest.raises(AgentServerError, match="exited"):
            start_agent_server(sb, env.hub, bundle, startup_timeout_s=60)
        result = run_agent_in_sandbox(
            sb,
            env.hub,
            bundle,
            "traj-broken",
            "x",
            AgentLimits(),
            SamplingConfig(),
            config=CFG,
            startup_timeout_s=60,
        )
    assert result.end_reason is EndReason.AGENT_SERVER_ERROR
    assert result.is_infrastructure
    assert llm.requests == []


def test_bundle_mounts_and_llm_url_are_checked(env: Env) -> None:
    bundle = AgentServerBundle.current()
    with env.backends["bwrap"].create(spec(env, "nomounts", 9, {}, "t-1.a1")) as sb:
        with pytest.raises(ValueError, match="bundle mounts"):
            start_agent_server(sb, env.hub, bundle)
        assert sandbox_llm_url(sb, "t-1.a1") == "http://127.0.0.1:18080/t/t-1.a1/v1"
        with pytest.raises(ValueError, match="trajectory id"):
            sandbox_llm_url(sb, "../admin")
    with pytest.raises(ValueError, match="absolute"):
        AgentServerBundle("relative/python", "/venv")
