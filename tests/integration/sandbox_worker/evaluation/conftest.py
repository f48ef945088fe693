"""Real backends (private dockerd, bwrap) and the mini set's images for the evaluation tests.

Nothing skips: if dockerd cannot start or an image cannot be built the fixture fails, since a
reward-evaluation test that silently does not run proves nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_worker import images
from sandbox_worker.backends import SandboxBackend, make_backend
from services.datasets import load_instances
from services.protocol.instance import SWEInstance
from tests.support.docker import ensure_dockerd
from tests.support.paths import TEST_DATA

INSTANCES = TEST_DATA / "instances.jsonl"
RUN_TAG = f"ev{os.getpid() % 100000}"


@pytest.fixture(scope="session")
def eval_backends() -> Iterator[dict[str, SandboxBackend]]:
    ensure_dockerd()
    images.build(INSTANCES)  # base image, instance images, bwrap trees; cached
    root = Path(tempfile.mkdtemp(prefix="swerl-ev-"))  # short: unix socket paths live here
    try:
        yield {
            "docker": make_backend("docker", state_root=root / "docker"),
            "bwrap": make_backend("bwrap", state_root=root / "bwrap"),
        }
        leftovers = [
            str(p)
            for sub in ("docker", "bwrap")
            if (root / sub).is_dir()
            for p in (root / sub).iterdir()
        ]
        assert not leftovers, f"sandbox state left behind: {leftovers}"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def instances() -> dict[str, SWEInstance]:
    return {inst.instance_id: inst for inst in load_instances(INSTANCES)}


@pytest.fixture
def node(eval_backends: dict[str, SandboxBackend]) -> Iterator[str]:
    """A node name of this test alone; none of its sandboxes may outlive the test."""
    name = f"{RUN_TAG}-{uuid.uuid4().hex[:8]}"
    yield name
    leaked = {kind: b.list_sandboxes(name) for kind, b in eval_backends.items()}
    for backend in eval_backends.values():
        backend.cleanup_node(name)
    assert not any(leaked.values()), f"evaluation leaked sandboxes: {leaked}"
