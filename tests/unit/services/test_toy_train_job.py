"""The toy run as a train job: the run config split into the trainer service's base, the
job's dataset file and its spec, and that base + spec is what the trainer service accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.protocol.toy import toy_prompt_ids
from services.toy_train_job import JobFileError, split_config, submit_argv
from trainer.service.spec import write_run_config

CONFIGS = Path(__file__).resolve().parents[3] / "trainer" / "configs"


def load(name: str) -> dict:
    return yaml.safe_load((CONFIGS / name).read_text())


def test_the_demo_config_becomes_base_ids_and_spec() -> None:
    raw = load("toy_li2sao.yaml")
    base, ids, spec = split_config(raw, None)
    # the training part of request numbers 0-999: broad, and none of the held-out prompts
    assert len(ids) == len(set(ids)) and 800 < len(ids) < 1000
    held_out = toy_prompt_ids(0, 1000, "held_out")
    assert set(ids) | set(held_out) == set(toy_prompt_ids(0, 1000))
    assert not set(ids) & set(held_out)
    assert not {"instance_ids", "toy_prompts"} & set(base["train"]["dataset"])
    assert base["train"]["dataset"]["kind"] == "toy"
    assert not {"run_dir", "run_id", "steps"} & set(base["train"])
    assert base["train"]["eval"] == raw["train"]["eval"]  # held-out evaluation stays
    boot = raw["train"]["bootstrap"]
    assert spec == {
        "algorithm": "li2sao",
        "steps": raw["train"]["steps"],
        "batch": {"prompts_per_step": boot["prompts"], "samples_per_prompt": boot["group_size"]},
    }
    assert split_config(raw, 3)[2]["steps"] == 3
    assert "toy_prompts" in raw["train"]["dataset"]  # the caller's mapping is untouched
    assert "seed" not in raw["trainer"]
    # the run seed sets the trainer's and the prompt order's seeds
    seeded = split_config(raw, None, 7)[0]
    assert (seeded["trainer"]["seed"], seeded["train"]["dataset"]["seed"]) == (7, 7)
    assert split_config(raw, None, 7)[1] == ids  # the prompts do not depend on the seed


def test_base_and_spec_make_the_run_config_the_trainer_service_writes(tmp_path: Path) -> None:
    """The trainer service's own mapping of a spec over the base (trainer/service/spec.py)
    gives back the file's training run: same prompts, batches, algorithm, steps."""
    raw = load("toy_li2sao.yaml")
    base, ids, spec = split_config(raw, 4)
    dataset = tmp_path / "ids.txt"
    dataset.write_text("\n".join(ids) + "\n")
    full = {**spec, "model": "/m", "dataset": str(dataset), "checkpoint_dir": str(tmp_path / "c")}
    path = write_run_config(full, "train-x", tmp_path / "run", base, {})
    run = yaml.safe_load(path.read_text())
    assert run["train"]["steps"] == 4 and run["trainer"]["algorithm"] == "li2sao"
    assert run["train"]["bootstrap"] == raw["train"]["bootstrap"]
    assert run["train"]["single"]["batch_size"] == raw["train"]["single"]["batch_size"]
    assert Path(run["train"]["dataset"]["instances_file"]).read_text().split() == ids
    assert run["train"]["run_dir"] == str(tmp_path / "run")


def test_configs_a_job_cannot_carry_are_refused() -> None:
    raw = load("toy_li2sao.yaml")
    raw["train"]["single"]["batch_size"] = 32  # a job sets single = prompts x samples
    with pytest.raises(JobFileError, match=r"single\.batch_size 32"):
        split_config(raw, None)
    raw = load("toy_li2sao.yaml")
    del raw["train"]["dataset"]["toy_prompts"]
    with pytest.raises(JobFileError, match="no instance_ids or toy_prompts"):
        split_config(raw, None)
    raw["train"]["dataset"]["toy_prompts"] = {"start": 5, "stop": 5}
    with pytest.raises(JobFileError, match=r"toy_prompts.*stop"):
        split_config(raw, None)
    with pytest.raises(JobFileError, match="train: and trainer:"):
        split_config({"train": {}}, None)
    raw = load("toy_li2sao.yaml")
    raw["train"]["steps"] = "many"
    with pytest.raises(JobFileError, match="positive integer"):
        split_config(raw, None)


def test_submit_argv_is_a_valid_swerl_submit_train() -> None:
    from services.swerl_cli.main import build_parser, spec_from_args

    _, _, spec = split_config(load("toy_li2sao.yaml"), 7)
    argv = submit_argv(spec, Path("/m"), Path("/ids.txt"), Path("/ck"), "key-1")
    kind, parsed = spec_from_args(build_parser().parse_args(argv))
    assert kind == "train" and parsed["steps"] == 7 and parsed["algorithm"] == "li2sao"
    assert parsed["batch"] == spec["batch"]
    assert (parsed["model"], parsed["dataset"], parsed["checkpoint_dir"]) == (
        "/m", "/ids.txt", "/ck")  # fmt: skip
