"""The mini set's images (docker and bwrap trees) for the evaluation script's tests.

Nothing skips: an evaluation test that silently does not run proves nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_worker import images
from services.datasets import load_instances
from services.protocol.instance import SWEInstance
from tests.support.docker import ensure_dockerd
from tests.support.paths import TEST_DATA

INSTANCES = TEST_DATA / "instances.jsonl"


@pytest.fixture(scope="session")
def mini_set() -> Path:
    ensure_dockerd()
    images.build(INSTANCES)  # base image, instance images, bwrap trees; cached
    return INSTANCES


@pytest.fixture(scope="session")
def instances(mini_set: Path) -> dict[str, SWEInstance]:
    return {inst.instance_id: inst for inst in load_instances(mini_set)}
