"""``train.dataset.mixture``: validated at start-up (file, line, field), drawn by the mixture's
seeded sampler (weights, one pass per dataset, keys ``<dataset>/<instance_id>``), the cursor
resumed to the same sequence, the deny-list and the contamination check applied."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from services.config import ConfigError
from services.protocol import RolloutRequest
from tests.support.mixtures import SHARED_ID, mini_rows, write_two_file_mixture
from trainer.loop.cli import load_run_config
from trainer.loop.config import DatasetConfig, TrainConfig
from trainer.loop.prompts import MixtureCursor, make_cursor


def _run_file(tmp_path: Path, dataset: dict) -> str:
    path = tmp_path / "run.yaml"
    train = {"run_dir": str(tmp_path / "r"), "steps": 1, "publish": False, "dataset": dataset}
    path.write_text(yaml.safe_dump({"train": train}))
    return str(path)


def test_a_mixture_is_a_training_dataset(tmp_path: Path) -> None:
    mix = write_two_file_mixture(tmp_path)
    cfg = load_run_config(_run_file(tmp_path, {"mixture": mix.spec}))
    cursor = make_cursor(cfg.train.dataset)
    assert isinstance(cursor, MixtureCursor)
    assert sorted(cursor.ids) == sorted(mix.rows)  # 10 keys, the shared id twice
    assert {f"gym/{SHARED_ID}", f"smith/{SHARED_ID}"} <= set(cursor.ids)
    keys = cursor.take(6)
    assert all(key in mix.rows for key in keys)
    RolloutRequest(instance_ids=keys)  # what the collector submits: valid request keys


@pytest.mark.parametrize(
    ("dataset", "needle"),
    [
        ({"mixture": "gym=nowhere.jsonl"}, r"train\.dataset\.mixture.*no such dataset file"),
        ({"mixture": "a.jsonl:zero"}, r"weight 'zero' is not a number"),
        ({"mixture": "MIX", "instance_ids": ["a"]}, r"mixture or instance ids.*not both"),
        ({"mixture": "MIX", "kind": "toy"}, r"kind 'toy' cannot use it"),
        ({"instance_ids": ["a"], "overlap_eval": "x.jsonl"}, r"overlap_eval checks a mixture"),
    ],
)
def test_bad_mixture_settings_fail_at_start_up(tmp_path: Path, dataset: dict, needle: str) -> None:
    mix = write_two_file_mixture(tmp_path)
    if dataset.get("mixture") == "MIX":
        dataset = {**dataset, "mixture": mix.spec}
    with pytest.raises(ConfigError, match=needle):
        load_run_config(_run_file(tmp_path, dataset))


def test_a_bad_row_fails_at_start_up_naming_file_line_and_field(tmp_path: Path) -> None:
    mix = write_two_file_mixture(tmp_path)
    rows = mini_rows()[:3]
    del rows[1]["problem_statement"]
    mix.gym.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError) as err:
        load_run_config(_run_file(tmp_path, {"mixture": mix.spec}))
    message = str(err.value)
    assert f"{mix.gym}:line 2" in message and "'problem_statement'" in message
    assert "train.dataset.mixture" in message


def test_weights_and_one_pass_per_dataset(tmp_path: Path) -> None:
    mix = write_two_file_mixture(tmp_path, gym_weight=3, smith_weight=1)
    cursor = make_cursor(DatasetConfig(mixture=mix.spec, seed=7))
    keys = cursor.take(4000)
    by_dataset = Counter(key.split("/")[0] for key in keys)
    assert 0.72 < by_dataset["gym"] / len(keys) < 0.78  # 3:1 -> 0.75
    gym = [k for k in keys if k.startswith("gym/")]
    for start in range(0, 5 * (len(gym) // 5), 5):  # every gym instance once per pass
        assert sorted(gym[start : start + 5]) == sorted(k for k in mix.rows if k.startswith("gym/"))


def test_the_cursor_resumes_the_same_sequence(tmp_path: Path) -> None:
    mix = write_two_file_mixture(tmp_path)
    config = DatasetConfig(mixture=mix.spec, seed=3)
    dead = make_cursor(config)
    dead.take(7)
    checkpointed = dead.position
    expected = dead.take(9)
    resumed = make_cursor(config)  # a new process: nothing drawn yet
    resumed.position = checkpointed
    assert resumed.take(9) == expected
    resumed.position = 2  # backwards too: replayed from the seed
    again = make_cursor(config)
    again.take(2)
    assert resumed.take(5) == again.take(5)
    other_seed = make_cursor(DatasetConfig(mixture=mix.spec, seed=4))
    assert other_seed.take(16) != make_cursor(config).take(16)


def test_driver_checkpoints_and_restores_the_mixture_cursor(tmp_path: Path) -> None:
    """The loop state's ``collector.cursor`` is the mixture cursor's position, and the
    driver's restore (``cursor.position = ...``) continues the sequence."""
    from trainer.loop.collector import Collector

    mix = write_two_file_mixture(tmp_path)
    train = TrainConfig(run_dir=str(tmp_path), steps=1, dataset={"mixture": mix.spec})
    cursor = make_cursor(train.dataset)
    collector = Collector(None, None, cursor, train)  # type: ignore[arg-type]
    cursor.take(5)
    state = collector.state_dict()
    assert state["cursor"] == 5
    nxt = cursor.take(3)
    restored = make_cursor(train.dataset)
    restored.position = int(state["cursor"])
    assert restored.take(3) == nxt


def test_deny_list_and_contamination_check_leave_entries_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mix = write_two_file_mixture(tmp_path)
    deny = tmp_path / "deny.txt"
    deny.write_text("swerl__spanlib-1  # flaky\nsmith/swerl__strkit-2  # this dataset's only\n")
    evaluation = tmp_path / "verified.jsonl"
    evaluation.write_text(json.dumps(mini_rows()[8]) + "\n")  # swerl__tinyini-3 leaked
    config = DatasetConfig(mixture=mix.spec, deny_file=str(deny), overlap_eval=str(evaluation))
    cursor = make_cursor(config)
    # the mini tinyini rows share one snapshot (repo + base commit): all three are left out
    tinyini = {f"smith/swerl__tinyini-{n}" for n in (1, 2, 3)}
    denied = {"gym/swerl__spanlib-1", "smith/swerl__strkit-2"}  # gym/swerl__strkit-2 stays
    assert set(cursor.ids) == set(mix.rows) - tinyini - denied
    assert set(cursor.take(50)) == set(cursor.ids)
    assert "gym/swerl__spanlib-1 left out, on the deny-list" in caplog.text
    assert "smith/swerl__strkit-2 left out, on the deny-list" in caplog.text
    assert "smith/swerl__tinyini-3 left out, same instance of swerl__tinyini-3" in caplog.text
    assert "smith/swerl__tinyini-1 left out, same snapshot of swerl__tinyini-3" in caplog.text
    only = tmp_path / "one.jsonl"
    only.write_text(json.dumps(mini_rows()[0]) + "\n")
    emptied = DatasetConfig(mixture=f"solo={only}", deny_file=str(deny))
    with pytest.raises(ValueError, match="no instances left in solo"):
        make_cursor(emptied)


def test_a_changed_dataset_is_caught_at_resume(tmp_path: Path) -> None:
    """The checkpointed cursor counts draws of one dataset: the loop state carries the
    dataset's fingerprint, and a resume under another dataset is an error naming the key to
    set, or with ``on_change: restart`` starts the new sequence."""
    from trainer.checkpoint import CheckpointError
    from trainer.loop.collector import Collector
    from trainer.loop.prompts import same_dataset

    mix = write_two_file_mixture(tmp_path)
    train = TrainConfig(run_dir=str(tmp_path), steps=1, dataset={"mixture": mix.spec})
    collector = Collector(None, None, make_cursor(train.dataset), train)  # type: ignore[arg-type]
    saved = collector.state_dict()["dataset"]
    deny = tmp_path / "deny.txt"
    deny.write_text("swerl__spanlib-1\n")
    reweighted = write_two_file_mixture(tmp_path, gym_weight=0.7, smith_weight=0.3).spec
    same = [DatasetConfig(mixture=mix.spec), DatasetConfig(mixture=mix.spec.replace(":0.5", ":2"))]
    changed = [
        DatasetConfig(mixture=mix.spec, seed=1),
        DatasetConfig(mixture=reweighted),
        DatasetConfig(mixture=mix.spec, deny_file=str(deny)),
        DatasetConfig(mixture=f"gym={mix.gym}"),
    ]
    for config in same:  # weights 2:2 normalise to 0.5:0.5: the same sequence
        assert make_cursor(config).fingerprint() == saved
    for config in changed:
        mine = make_cursor(config).fingerprint()
        assert mine != saved, config
        with pytest.raises(CheckpointError, match=r"train\.dataset\.on_change: restart"):
            same_dataset(tmp_path, saved, mine, "error")
        assert same_dataset(tmp_path, saved, mine, "restart") is False
    assert same_dataset(tmp_path, saved, saved, "error") is True
    assert same_dataset(tmp_path, None, saved, "error") is True  # an older checkpoint
    ids = DatasetConfig(instance_ids=["a", "b", "c"])
    plain = make_cursor(ids).fingerprint()
    assert plain == make_cursor(DatasetConfig(instance_ids=["a", "b", "c"])).fingerprint()
    for other in (["a", "c", "b"], ["a", "b"]):
        assert make_cursor(DatasetConfig(instance_ids=other)).fingerprint() != plain
    assert (
        make_cursor(DatasetConfig(instance_ids=["a", "b", "c"], shuffle=False)).fingerprint()
        != plain
    )
