"""A train job's spec as the driver's run config: the mapping, the base file under it, and
every way a spec can fail to map (a clear SpecError, never a crash)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.config import ConfigError
from trainer.loop.cli import load_run_config
from trainer.service.spec import SpecError, load_base, training_env, write_run_config

BASE = {"train": {"publish": False, "checkpoint_every": 3},
        "trainer": {"model": "base-model", "actor": {"lr": 2e-6}},
        "manager": {"redis_url": "redis://127.0.0.1:1/0"}}  # fmt: skip


def spec(tmp: Path, **over: Any) -> dict[str, Any]:
    ids = tmp / "ids.txt"
    ids.write_text("a\nb\n")
    return {"model": "m1", "dataset": str(ids), "steps": 7,
            "batch": {"prompts_per_step": 4, "samples_per_prompt": 2},
            "checkpoint_dir": str(tmp / "ck"), **over}  # fmt: skip


def test_the_spec_maps_over_the_base(tmp_path: Path) -> None:
    path = write_run_config(spec(tmp_path), "train-x1", tmp_path / "run", BASE, {})
    assert path == tmp_path / "run" / "run.yaml"
    cfg = load_run_config(str(path), environ={})
    assert (cfg.train.steps, cfg.train.run_id, cfg.train.run_dir) == (
        7,
        "train-x1",
        str(path.parent),
    )
    assert (cfg.train.bootstrap.prompts, cfg.train.bootstrap.group_size) == (4, 2)
    assert cfg.train.single.batch_size == 8  # the same trajectories per step in both phases
    assert cfg.train.dataset.instances_file == str((tmp_path / "ids.txt").resolve())
    assert (cfg.trainer.model, cfg.trainer.algorithm) == ("m1", "li2sao")
    assert cfg.trainer.checkpoint.dir == str(tmp_path / "ck")
    assert cfg.trainer.actor.lr == 2e-6 and cfg.train.checkpoint_every == 3  # from the base
    assert cfg.train.publish is False


def test_one_sample_per_prompt_sets_only_the_single_batch(tmp_path: Path) -> None:
    raw = spec(tmp_path, algorithm="lisao", batch={"prompts_per_step": 5, "samples_per_prompt": 1})
    data = yaml.safe_load(write_run_config(raw, "j", tmp_path / "r", BASE, {}).read_text())
    assert "bootstrap" not in data["train"] and data["train"]["single"] == {"batch_size": 5}


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"dataset": "/no/such/ids.txt"}, "spec.dataset '/no/such/ids.txt' is neither"),
        ({"dataset": "g=/no/such.parquet:1"}, "no such dataset file '/no/such.parquet'"),
        ({"algorithm": "nosuch"}, "unknown algorithm 'nosuch': the trainer knows"),
        ({"steps": 0}, "invalid train spec"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_a_spec_that_cannot_map_is_a_spec_error(
    tmp_path: Path, over: dict[str, Any], needle: str
) -> None:
    with pytest.raises(SpecError, match=re.escape(needle)):
        write_run_config(spec(tmp_path, **over), "j", tmp_path / "r", BASE, {})


def test_the_run_needs_what_the_base_must_give(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"publish\.adapter_url"):  # publish on, no adapter
        write_run_config(spec(tmp_path), "j", tmp_path / "r", {}, {})


def test_validated_with_the_environment_the_run_gets(tmp_path: Path) -> None:
    moved = {"SWERL_TRAINER__CHECKPOINT__DIR": "/elsewhere", "SWERL_PUBLISH__X": "1"}
    assert training_env(moved) == {"SWERL_PUBLISH__X": "1"}  # the job's keys win
    write_run_config(spec(tmp_path), "j", tmp_path / "r", BASE, moved)
    with pytest.raises(SpecError, match="checkpoint_every"):
        env = {"SWERL_TRAIN__CHECKPOINT_EVERY": "0"}  # not a job key: it applies, and is bad
        write_run_config(spec(tmp_path), "j", tmp_path / "r", BASE, env)


def test_the_base_file_must_be_a_mapping(tmp_path: Path) -> None:
    assert load_base("") == {}
    bad = tmp_path / "base.yaml"
    bad.write_text("- train\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_base(str(bad))


def test_a_mixture_dataset_becomes_the_runs_mixture(tmp_path: Path) -> None:
    """``swerl submit train --dataset gym=a.jsonl:0.5,smith=b.parquet:0.5``: the trainer's run
    draws from the mixture; a bad row fails the job before the run, naming file and line."""
    from tests.support.mixtures import write_two_file_mixture

    mix = write_two_file_mixture(tmp_path)
    path = write_run_config(spec(tmp_path, dataset=mix.spec), "j", tmp_path / "r", BASE, {})
    cfg = load_run_config(str(path), environ={})
    assert cfg.train.dataset.mixture == mix.spec and not cfg.train.dataset.instances_file
    mix.gym.write_text('{"instance_id": "x"}\n')
    with pytest.raises(SpecError, match=re.escape(f"{mix.gym}:line 1")):
        write_run_config(spec(tmp_path, dataset=mix.spec), "j", tmp_path / "r2", BASE, {})
