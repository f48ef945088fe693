"""An agent that fills its sandbox's disk quota ends as the policy's doing, never as aborted.

The real OpenHands agent server in a real docker / bwrap sandbox with a small disk quota; a
scripted LLM makes the agent exhaust the inodes of its writable places (bytes: the same). The
agent server keeps its own state in the sandbox's /tmp (``OH_CONVERSATIONS_PATH``), so it
answers 500 (ENOSPC) from then on and the conversation stalls until the wall-time limit: a
``timeout`` ending, graded on the patch like any other -- never an agent-server or
infrastructure error (``aborted``: excluded from training, which would reward filling the disk
whenever a trajectory is going badly).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_worker.backends import SandboxBackend, make_backend
from sandbox_worker.backends.base import LlmRelay, NetworkPolicy, SandboxLimits, SandboxSpec
from sandbox_worker.openhands.config import OpenHandsConfig
from sandbox_worker.openhands.result import EndReason
from sandbox_worker.openhands.server import AgentServerBundle, run_agent_in_sandbox
from sandbox_worker.relay.host_relay import RelayHub
from services.protocol.tasks import AgentLimits, SamplingConfig
from tests.support.docker import build_test_images, ensure_dockerd
from tests.support.fake_llm import FakeLLM, Reply, call

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

NODE = "ohdisk"
# Bounded (100,000 files), so that a broken quota cannot flood the host's inodes.
FLOOD = "python3 -c \"for n in range(100000): open(f'/tmp/{n}', 'w').close()\""


@pytest.fixture(scope="module")
def hub() -> Iterator[RelayHub]:
    relay_hub = RelayHub()
    yield relay_hub
    relay_hub.close()


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    ensure_dockerd()
    path = Path(tempfile.mkdtemp(prefix="swerl-ohd-"))  # short: unix socket paths < 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["docker", "bwrap"])
def backend(request: pytest.FixtureRequest, root: Path, hub: RelayHub) -> Iterator[SandboxBackend]:
    backend = make_backend(request.param, state_root=root / request.param, hub=hub)
    yield backend
    left = backend.list_sandboxes(NODE)
    backend.cleanup_node(NODE)
    assert left == [], f"sandboxes left behind: {left}"


def test_an_agent_that_fills_its_disk_and_inodes_ends_graded_not_aborted(
    backend: SandboxBackend, root: Path, hub: RelayHub
) -> None:
    image = build_test_images(root / f"images-{backend.name}")
    bundle = AgentServerBundle.current()
    edit = {"command": "create", "path": "/testbed/fix.txt", "file_text": "fixed\n"}
    replies = [
        Reply(tool_calls=[call("file_editor", edit)]),
        Reply(tool_calls=[call("terminal", {"command": FLOOD})]),
        Reply(tool_calls=[call("finish", {"message": "done"})]),
    ]
    with FakeLLM(replies) as llm:
        spec = SandboxSpec(
            image=image,
            node=NODE,
            sandbox_id=f"fill-{backend.name}",
            network=NetworkPolicy.LLM_RELAY_ONLY,
            llm_relay=LlmRelay("127.0.0.1", llm.port, trajectory_id="traj-fill.a1"),
            ro_mounts=bundle.ro_mounts,
            limits=SandboxLimits(memory_mb=2048, disk_mb=64, inodes=4096),
        )
        with backend.create(spec) as sb:
            result = run_agent_in_sandbox(
                sb,
                hub,
                bundle,
                "traj-fill.a1",
                "Fill the disk.",
                AgentLimits(max_steps=10, wall_time_s=30),
                SamplingConfig(max_tokens=64),
                config=OpenHandsConfig(num_retries=0, stop_grace_s=5),
            )
            df = sb.exec("df -i /tmp | tail -1; df /tmp | tail -1").output
            alive = sb.exec("true").exit_code == 0  # what the runner checks before aborting
    assert result.end_reason in (EndReason.FINISHED, EndReason.TIMEOUT), result
    assert " 100% " in df, df  # the quota really was exhausted (here: the inodes)
    assert not result.is_infrastructure  # graded, not aborted
    assert alive  # so the patch extraction grades it (at worst an empty patch), no abort
