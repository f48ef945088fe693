"""A worker's namespaced task sets: ``<dataset>/<instance_id>`` keys from
``worker.rollout.datasets`` and the task-set directory, and each dataset's image rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox_worker import images, task_sets
from sandbox_worker.task_sets import keyed_image, load_keyed_instances, task_set_files
from services.datasets import DatasetError
from tests.support.mixtures import SHARED_ID, mini_rows, write_two_file_mixture


def test_keys_come_from_the_spec_and_the_directory(tmp_path: Path) -> None:
    mix = write_two_file_mixture(tmp_path)
    sets = tmp_path / "tasksets"
    sets.mkdir()
    (sets / "mine.jsonl").write_text(json.dumps(mini_rows()[0]) + "\n")
    (sets / "not a name.jsonl").write_text("ignored: not a dataset name\n")
    assert set(task_set_files(sets)) == {"mine"}
    found = load_keyed_instances(mix.spec, sets)
    assert set(found) == set(mix.rows) | {"mine/swerl__spanlib-1"}
    assert load_keyed_instances("", tmp_path / "absent") == {}
    (sets / "gym.jsonl").write_text(json.dumps(mini_rows()[0]) + "\n")
    with pytest.raises(DatasetError, match="dataset 'gym' is both"):
        load_keyed_instances(mix.spec, sets)


def test_each_dataset_has_its_image_rule(tmp_path: Path) -> None:
    mix = write_two_file_mixture(tmp_path)
    found = load_keyed_instances(mix.spec, None)
    gym, smith = found[f"gym/{SHARED_ID}"], found[f"smith/{SHARED_ID}"]
    local = keyed_image(f"gym/{SHARED_ID}", gym, {})
    assert local == "swerl/gym/sweb.eval.x86_64.swerl_1776_strkit-2:latest"
    assert keyed_image(f"smith/{SHARED_ID}", smith, {}) != local  # datasets never collide
    published = keyed_image(f"smith/{SHARED_ID}", smith, {"smith": "swebench"})
    assert published == "swebench/sweb.eval.x86_64.swerl_1776_strkit-2:latest"


def _register(directory: Path, name: str, rows: list[dict]) -> Path:
    file = task_sets.rows_path(directory, name)
    directory.mkdir(parents=True, exist_ok=True)
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    built = tuple(images.local_image(name, r["instance_id"]) for r in rows)
    manifest = task_sets.TaskSetManifest(name=name, source="/src/mine.jsonl", images=built,
                                         valid=len(rows))  # fmt: skip
    task_sets.write_manifest(directory, manifest)
    return file


def test_a_registered_set_round_trips_and_is_resolved_by_name_or_file(tmp_path: Path) -> None:
    sets = tmp_path / "tasksets"
    row = mini_rows()[0]
    file = _register(sets, "mine", [row])
    assert task_sets.registered_sets(sets) == ["mine"]
    manifest = task_sets.read_manifest(sets, "mine")
    assert manifest is not None and manifest.images == (
        images.local_image("mine", row["instance_id"]),
    )
    assert task_sets.resolve_task_set("mine", sets) == ("mine", file)
    assert task_sets.resolve_task_set(str(file), sets) == ("mine", file)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps(row) + "\n")
    assert task_sets.resolve_task_set(str(other), sets) is None  # a plain file
    key = task_sets.task_set_key("mine", row["instance_id"])
    assert set(load_keyed_instances("", sets)) == {key}
    assert task_sets.unregister(sets, "mine") is True
    assert task_sets.registered_sets(sets) == [] and not file.exists()
    assert task_sets.unregister(sets, "mine") is False
    assert load_keyed_instances("", sets) == {}


def test_an_unknown_set_names_the_known_ones(tmp_path: Path) -> None:
    sets = tmp_path / "tasksets"
    _register(sets, "alpha", mini_rows()[:1])
    with pytest.raises(task_sets.TaskSetError, match=r"neither a file nor a task set.*alpha"):
        task_sets.resolve_task_set("beta", sets)
    task_sets.write_manifest(sets, task_sets.TaskSetManifest(
        name="empty", source="/s", images=("swerl/empty/x:latest",), valid=0))  # fmt: skip
    assert task_sets.registered_sets(sets) == ["alpha", "empty"]
    with pytest.raises(task_sets.TaskSetError, match="no valid instances"):
        task_sets.resolve_task_set("empty", sets)
    (sets / "broken.json").write_text("{")
    with pytest.raises(task_sets.TaskSetError, match="unreadable task-set manifest"):
        task_sets.read_manifest(sets, "broken")
