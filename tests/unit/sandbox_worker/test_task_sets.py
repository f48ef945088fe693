"""A worker's namespaced task sets: ``<dataset>/<instance_id>`` keys from
``worker.rollout.datasets`` and the task-set directory, and each dataset's image rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
