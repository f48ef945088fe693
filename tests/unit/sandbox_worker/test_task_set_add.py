"""``python -m sandbox_worker.images add|list|remove``: the registration ``add`` writes, one
image naming rule from the build to the worker, and ``remove`` undoing ``add`` (a fake Docker
engine: the real one is tests/integration/sandbox_worker/images/test_task_set_add.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from sandbox_worker import images, task_set_add, task_sets
from sandbox_worker.config import TrajectoryRunnerConfig
from sandbox_worker.factory import _image_naming, worker_task_instances
from sandbox_worker.validate import InstanceResult
from services.protocol.instance import SWEInstance
from tests.support.mixtures import mini_rows

NAME = "mine"
BASE = "swerl/base:bookworm"


class _Engine:
    """A fake Docker engine: image tags, removal by tag."""

    def __init__(self, tags: list[str]) -> None:
        self.tags = list(tags)

    def module(self) -> types.ModuleType:
        engine = self

        class DockerException(Exception):
            pass

        class ImageNotFound(DockerException):
            pass

        class Images:
            def list(self) -> list[Any]:
                return [types.SimpleNamespace(tags=[t]) for t in engine.tags]

            def remove(self, tag: str) -> None:
                if tag not in engine.tags:
                    raise ImageNotFound(tag)
                engine.tags.remove(tag)

        class Client:
            def __init__(self, base_url: str) -> None:
                self.images = Images()

            def close(self) -> None:
                pass

        errors = types.SimpleNamespace(DockerException=DockerException, ImageNotFound=ImageNotFound)
        return types.SimpleNamespace(DockerClient=Client, errors=errors)  # type: ignore[return-value]


def _instances() -> list[SWEInstance]:
    return [SWEInstance.model_validate(row) for row in mini_rows()[:2]]


def _add(tmp_path: Path, sets: Path) -> list[str]:
    """What ``add`` does after building and validating: register (every row valid)."""
    source = tmp_path / "mine.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in mini_rows()[:2]))
    cfg = task_set_add.AddSettings(source, NAME, None, sets, "docker", False, 60)
    built = [images.local_image(NAME, i.instance_id) for i in _instances()]
    results = [InstanceResult(i.instance_id, wanted=(), instance=i) for i in _instances()]
    assert task_set_add.register(cfg, results, built) == 2
    return built


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SWERL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_build_namespace_is_the_image_workers_resolve(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, str] = {}

    def fake_run(cmd: list[str], env: dict[str, str], **_: Any) -> Any:
        seen.update(env)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(task_set_add.subprocess, "run", fake_run)
    inst = _instances()[0]
    assert task_set_add.build_one(inst, tmp_path / "mine.jsonl", NAME, False) is None
    # the image build_instances.py names under that environment ...
    built = images.instance_image(inst.instance_id, namespace=seen["SWERL_IMAGE_NAMESPACE"])
    # ... is the one a worker resolves for the set's key, from the registry alone
    sets = task_sets.default_task_sets_dir()
    _add(tmp_path, sets)
    rc = TrajectoryRunnerConfig()
    found = worker_task_instances(rc)
    key = task_sets.task_set_key(NAME, inst.instance_id)
    assert _image_naming(rc, found)(key) == built


def test_list_then_remove_undoes_add(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sets = tmp_path / "sets"
    built = _add(tmp_path, sets)
    stray = images.local_image(NAME, "acme__left-1")  # built by an add that failed half-way
    other = images.local_image("theirs", _instances()[0].instance_id)
    engine = _Engine([*built, stray, other, BASE])
    monkeypatch.setitem(sys.modules, "docker", engine.module())
    rootfs = cache / "rootfs"
    (rootfs / f"{images.rootfs_key(built[0])}.testbed").mkdir(parents=True)
    images.rootfs_stamp(built[0]).write_text("{}")
    (rootfs / "base-bookworm").mkdir()
    registry = ["--task-sets-dir", str(sets)]

    assert images.main(["list", *registry]) == 0
    listed = capsys.readouterr().out
    assert NAME in listed and str(tmp_path / "mine.jsonl") in listed

    assert images.main(["remove", "--name", NAME, *registry]) == 0
    assert engine.tags == [other, BASE]  # the set's images only: never the base image
    assert sorted(p.name for p in rootfs.iterdir()) == ["base-bookworm"]
    assert task_sets.registered_sets(sets) == []
    capsys.readouterr()

    assert images.main(["remove", "--name", NAME, *registry]) == 2  # nothing left of it
    err = capsys.readouterr().err
    assert f"unknown task set {NAME!r}" in err and "Traceback" not in err


def test_remove_keep_images_and_unknown_sets(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sets = tmp_path / "sets"
    built = _add(tmp_path, sets)
    engine = _Engine([*built, BASE])
    monkeypatch.setitem(sys.modules, "docker", engine.module())
    registry = ["--task-sets-dir", str(sets)]
    assert images.main(["remove", "--name", "nope", *registry]) == 2
    assert f"registered task sets in {sets}: {NAME}" in capsys.readouterr().err
    assert images.main(["remove", "--name", NAME, "--keep-images", *registry]) == 0
    assert engine.tags == [*built, BASE] and task_sets.registered_sets(sets) == []
    # the images left are still the set's: a later remove finds them by the naming rule
    assert images.main(["remove", "--name", NAME, *registry]) == 0
    assert engine.tags == [BASE]
