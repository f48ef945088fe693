"""Fixtures: the mini repositories as templates of the LocalDir test double."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_worker.evaluation import EvalConfig
from sandbox_worker.tasks.repos import available_repos, materialize_repo
from sandbox_worker.testing.local_sandbox import LocalDirBackend
from services.datasets import load_instances
from services.protocol.instance import SWEInstance
from tests.support.paths import TEST_DATA

INSTANCES = TEST_DATA / "instances.jsonl"
# The host venv's pytest, without the host's plugins (they cost seconds per run).
LOCAL_TEST_CMD = (
    f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {sys.executable} -m pytest -rA -p no:cacheprovider"
)


@pytest.fixture(scope="session")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each mini repository at its base commit; the image name is the repository name."""
    root = tmp_path_factory.mktemp("templates")
    return {name: _materialized(name, root / name) for name in available_repos()}


def _materialized(name: str, dest: Path) -> Path:
    materialize_repo(name, dest)
    return dest


@pytest.fixture(scope="session")
def mini_instances() -> dict[str, SWEInstance]:
    return {inst.instance_id: inst for inst in load_instances(INSTANCES)}


@pytest.fixture
def local_backend(templates: dict[str, Path], tmp_path: Path) -> Iterator[LocalDirBackend]:
    backend = LocalDirBackend(templates, tmp_path / "scratch")
    yield backend
    assert not backend.live, f"sandboxes left behind: {list(backend.live)}"


@pytest.fixture
def local_config(tmp_path: Path) -> EvalConfig:
    return EvalConfig(
        workdir=str(tmp_path / "testbed"),
        scratch_dir=str(tmp_path / "scratch"),
        test_cmd=LOCAL_TEST_CMD,
        test_timeout_s=120,
    )


def image_of(instance: SWEInstance) -> str:
    """The LocalDir "image" of an instance: its repository name."""
    return instance.repo.rsplit("/", 1)[-1]
