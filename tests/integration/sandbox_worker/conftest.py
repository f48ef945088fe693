"""Fixtures for the sandbox contract tests: both backends, real dockerd, real bwrap.

``backend`` is docker and bwrap; a test of the part of the contract that the LocalDir test
double honours (see :mod:`sandbox_worker.testing.local_sandbox`) is parametrised over
``backend`` with :data:`WITH_LOCALDIR` as well. Each test gets its own node name; at teardown
the test's sandboxes must already be gone (a leak fails the test) and the session asserts that
no container, netns, cgroup, bwrap process or state directory of the test run is left.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_worker.backends import SandboxBackend, make_backend
from sandbox_worker.backends.bwrap import NETNS_DIR
from sandbox_worker.backends.cgroups import Cgroups
from sandbox_worker.relay.host_relay import RelayHub
from sandbox_worker.testing.local_sandbox import LocalDirBackend
from tests.support import sandboxes
from tests.support.docker import build_test_images, ensure_dockerd

RUN_TAG = f"t{os.getpid() % 100000}"
#: ``@WITH_LOCALDIR``: run a contract test against the LocalDir test double too.
WITH_LOCALDIR = pytest.mark.parametrize("backend", ["docker", "bwrap", "localdir"], indirect=True)


class SessionEnv:
    def __init__(self, root: Path, image: str, hub: RelayHub) -> None:
        self.root = root
        self.image = image
        self.hub = hub
        self.backends: dict[str, SandboxBackend] = {}


def _bwrap_processes(marker: str) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and b"bwrap" in cmdline:
            out.append(int(proc.name))
    return out


@pytest.fixture(scope="session")
def sandbox_env() -> Iterator[SessionEnv]:
    ensure_dockerd()
    # Short paths: unix socket paths in the state dirs must stay under 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="swerl-sbx-"))
    hub = RelayHub()
    try:
        image = build_test_images(root / "images")
        env = SessionEnv(root, image, hub)
        env.backends["docker"] = make_backend("docker", state_root=root / "docker", hub=hub)
        env.backends["bwrap"] = make_backend("bwrap", state_root=root / "bwrap", hub=hub)
        # The double's "image" is the tiny repository build_test_images materialised.
        template = root / "images" / sandboxes.TINY_REPO.split("/")[-1]
        env.backends["localdir"] = LocalDirBackend({image: template}, root / "localdir-home")
        yield env
        leftovers: list[str] = []
        docker_backend = env.backends["docker"]
        containers = docker_backend.client.containers.list(  # type: ignore[attr-defined]
            all=True, filters={"label": "swerl.owner=swerl"}
        )
        leftovers += [c.name for c in containers if c.name.startswith(f"swerl.{RUN_TAG}-")]
        if NETNS_DIR.is_dir():
            leftovers += [p.name for p in NETNS_DIR.glob(f"swerl.{RUN_TAG}-*")]
        leftovers += sorted(Cgroups().names(f"{RUN_TAG}-"))
        leftovers += [f"bwrap pid {p}" for p in _bwrap_processes(str(root))]
        for sub in ("docker", "bwrap", "localdir"):
            d = root / sub
            if d.is_dir():
                leftovers += [str(p) for p in d.iterdir()]
        assert not leftovers, f"sandbox leftovers after the session: {leftovers}"
    finally:
        hub.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["docker", "bwrap"])
def backend(request: pytest.FixtureRequest, sandbox_env: SessionEnv) -> SandboxBackend:
    return sandbox_env.backends[request.param]


@pytest.fixture
def node(backend: SandboxBackend) -> Iterator[str]:
    """A node name of this test alone; its sandboxes must be gone when the test ends."""
    name = f"{RUN_TAG}-{uuid.uuid4().hex[:8]}"
    yield name
    left = backend.list_sandboxes(name)
    backend.cleanup_node(name)
    assert not left, f"test leaked sandboxes: {left}"
