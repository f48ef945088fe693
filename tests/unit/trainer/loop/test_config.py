"""The ``train`` section and a run's file: defaults, strictness, clear errors, the CLI's exits."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.config import ConfigError
from services.manager.client import RolloutManager
from services.protocol import RolloutRequest
from tests.support.engines import tiny_model_path
from trainer.loop.cli import load_run_config, main
from trainer.loop.config import (
    DatasetConfig,
    EvalSettings,
    TrainConfig,
    load_train_config,
    resolve_schedule,
    uses_dynamic_sampling,
    warmup_steps,
)
from trainer.loop.prompts import PromptCursor, load_instance_ids

MINIMAL = {"run_dir": "/tmp/r", "steps": 3, "dataset": {"instance_ids": ["a", "b"]}}


def write(tmp_path: Path, sections: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(sections))
    return path


def test_defaults_are_the_spec_shapes() -> None:
    cfg = TrainConfig(**MINIMAL)
    assert (cfg.bootstrap.prompts, cfg.bootstrap.group_size) == (32, 8)
    assert (cfg.single.batch_size, cfg.single.budget) == (256, 512)
    assert (cfg.gate.t_min, cfg.gate.t_max, cfg.gate.consecutive) == (60, 150, 10)
    assert (cfg.gate.eta_e, cfg.gate.eta_a, cfg.gate.beta) == (0.2, 0.65, 0.9)
    assert resolve_schedule(cfg, "li2sao") == "switch"
    assert [resolve_schedule(cfg, a) for a in ("grpo", "dapo", "gspo")] == ["groups"] * 3
    assert resolve_schedule(cfg, "lisao") == "single"
    assert (warmup_steps(cfg, "lisao"), warmup_steps(cfg, "li2sao")) == (10, 0)
    assert uses_dynamic_sampling(cfg, "dapo") and not uses_dynamic_sampling(cfg, "grpo")
    assert not uses_dynamic_sampling(TrainConfig(**MINIMAL, dynamic_sampling=False), "dapo")


@pytest.mark.parametrize(
    ("train", "needle"),
    [
        ({**MINIMAL, "stpes": 3}, r"train\.stpes: Extra inputs are not permitted"),
        (
            {**MINIMAL, "single": {"batch_size": 8, "in_flight": 8}},
            "must be larger than batch_size",
        ),
        ({**MINIMAL, "gate": {"t_min": 10, "t_max": 5}}, r"t_max \(5\) must be >= t_min \(10\)"),
        ({**MINIMAL, "bootstrap": {"group_size": 1}}, r"bootstrap\.group_size"),
        (
            {"run_dir": "/r", "steps": 1},
            "dataset needs instance_ids, an instances_file, toy_prompts or a mixture",
        ),
        ({**MINIMAL, "dataset": {"instance_ids": ["a"], "kind": "math"}}, r"dataset\.kind"),
        ({**MINIMAL, "dataset": {"instance_ids": ["a"], "kind": "toy"}}, "kind 'toy'"),
        ({**MINIMAL, "steps": 0}, r"train\.steps: Input should be greater than or equal to 1"),
    ],
)
def test_bad_train_sections_fail_with_the_key(tmp_path: Path, train: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_train_config(write(tmp_path, {"train": train}), environ={})


def test_unknown_key_gets_a_hint(tmp_path: Path) -> None:
    bad = {**MINIMAL, "bootstrap": {"promts": 4}}
    with pytest.raises(ConfigError, match=r"did you mean 'prompts'"):
        load_train_config(write(tmp_path, {"train": bad}), environ={})


def test_switch_needs_li2sao(tmp_path: Path) -> None:
    path = write(tmp_path, {"train": {**MINIMAL, "publish": False, "schedule": "switch"},
                            "trainer": {"algorithm": "grpo"}})  # fmt: skip
    with pytest.raises(ConfigError, match=r"schedule 'switch' needs .*li2sao, not 'grpo'"):
        load_run_config(str(path))


def test_publish_section_is_required_only_when_publishing(tmp_path: Path) -> None:
    path = write(tmp_path, {"train": MINIMAL})
    with pytest.raises(ConfigError, match=r"publish\.adapter_url: Field required"):
        load_run_config(str(path))
    cfg = load_run_config(str(write(tmp_path, {"train": {**MINIMAL, "publish": False}})), steps=9)
    assert cfg.publish is None and cfg.train.steps == 9


def test_cli_exits_2_on_a_bad_file_and_prints_the_effective_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", str(write(tmp_path, {"train": {"steps": 1}}))]) == 2
    assert "train.run_dir: Field required" in capsys.readouterr().err
    model = tmp_path / "model"  # --print-config checks that the model directory is one
    model.mkdir()
    (model / "config.json").write_text("{}")
    trainer = {"seed": 3, "model": str(model)}
    good = write(tmp_path, {"train": {**MINIMAL, "publish": False}, "trainer": trainer})
    assert main(["--config", str(good), "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["train"]["bootstrap"] == {"prompts": 32, "group_size": 8}
    assert printed["trainer"]["seed"] == 3 and "publish" not in printed


def test_cursor_draws_seeded_epochs_and_resumes_exactly(tmp_path: Path) -> None:
    ids = [f"i{n}" for n in range(5)]
    first = PromptCursor(ids, seed=1)
    drawn = first.take(7) + first.take(6)
    assert sorted(drawn[:5]) == ids and sorted(drawn[5:10]) == ids  # each epoch: every id once
    assert drawn[:5] != drawn[5:10]  # a new permutation per epoch
    again = PromptCursor(ids, seed=1)
    again.position = 7
    assert again.take(6) == drawn[7:]
    assert PromptCursor(ids, shuffle=False).take(6) == [*ids, "i0"]
    f = tmp_path / "ids.txt"
    f.write_text("x\n\ny\n")
    from trainer.loop.config import DatasetConfig

    assert load_instance_ids(DatasetConfig(instance_ids=["w"], instances_file=str(f))) == [
        "w",
        "x",
        "y",
    ]
    with pytest.raises(ValueError, match="'x' is listed twice"):
        load_instance_ids(DatasetConfig(instance_ids=["x"], instances_file=str(f)))


def test_the_deny_list_leaves_ids_out_with_their_reasons(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    deny = tmp_path / "deny.txt"
    deny.write_text("# broken\nb  # flaky on gold\nnot-in-the-run\n")
    cfg = DatasetConfig(instance_ids=["a", "b", "c"], deny_file=str(deny))
    with caplog.at_level("WARNING", logger="swerl.trainer.prompts"):
        assert load_instance_ids(cfg) == ["a", "c"]
    assert "b left out" in caplog.text and "flaky on gold" in caplog.text
    held_out = EvalSettings(instance_ids=["b", "e"], deny_file=str(deny))
    assert load_instance_ids(held_out, "eval") == ["e"]
    with pytest.raises(ValueError, match="every instance id is on the deny-list"):
        load_instance_ids(DatasetConfig(instance_ids=["b"], deny_file=str(deny)))
    with pytest.raises(ValueError, match=r"dataset\.deny_file: .*no such deny-list file"):
        load_instance_ids(DatasetConfig(instance_ids=["a"], deny_file=str(tmp_path / "none")))
    deny.write_text("a\na\n")
    with pytest.raises(ValueError, match="listed twice"):
        load_instance_ids(DatasetConfig(instance_ids=["a", "c"], deny_file=str(deny)))


@pytest.mark.slow
def test_resume_without_a_checkpoint_and_a_reused_run_fail_clearly(
    tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    train = {**MINIMAL, "run_dir": str(tmp_path / "run"), "publish": False, "tensorboard": False}
    path = write(
        tmp_path,
        {"train": train, "trainer": {"model": str(tiny_model_path(tmp_path))},
         "manager": {"redis_url": redis_url}},
    )  # fmt: skip
    assert main(["--config", str(path), "--resume"]) == 1
    assert f"--resume: no complete checkpoint in {tmp_path / 'run' / 'checkpoints'}" in (
        capsys.readouterr().err
    )
    # a fresh run refuses another run's batch ids, and another run's directory
    with RolloutManager(redis_url) as mgr:
        mgr.submit(RolloutRequest(batch_id="run-r00000", instance_ids=["a"]))
    assert main(["--config", str(path)]) == 1
    assert "rollout batch run-r00000 exists already" in capsys.readouterr().err
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["--config", str(path)]) == 1
    assert "already holds a run (metrics.jsonl)" in capsys.readouterr().err


def test_the_held_out_evaluation_is_off_by_default_and_validated() -> None:
    assert TrainConfig(**MINIMAL).eval_interval == 0  # no eval section needed when off
    good = TrainConfig(**MINIMAL, eval_interval=5, eval={"instance_ids": ["h1"], "n_samples": 2})
    assert (good.eval_interval, good.eval.n_samples, good.eval.sampling) == (5, 2, None)
    with pytest.raises(ValueError, match=r"needs eval\.instance_ids"):
        TrainConfig(**MINIMAL, eval_interval=5)
    with pytest.raises(ValueError, match=r"must be held out, but \['b'\]"):
        TrainConfig(**MINIMAL, eval_interval=5, eval={"instance_ids": ["h1", "b"]})
    with pytest.raises(ValueError, match="needs publish: true"):
        TrainConfig(**MINIMAL, eval_interval=5, publish=False, eval={"instance_ids": ["h1"]})
    toy = {**MINIMAL, "dataset": {"kind": "toy", "instance_ids": ["toy-lookup-0"]}}
    with pytest.raises(ValueError, match="kind 'toy'"):
        TrainConfig(**toy, eval_interval=5, eval={"instance_ids": ["h1"]})
    with pytest.raises(ValueError, match="n_samples"):
        TrainConfig(**MINIMAL, eval_interval=5, eval={"instance_ids": ["h1"], "n_samples": 0})
    with pytest.raises(ValueError, match="eval_interval"):
        TrainConfig(**MINIMAL, eval_interval=-1)


TOY = {"run_dir": "/tmp/r", "steps": 3, "publish": True, "eval_interval": 5,
       "dataset": {"kind": "toy", "toy_prompts": {"stop": 1000, "part": "train"}}}  # fmt: skip


def test_toy_prompts_give_the_training_part_and_held_out_sets() -> None:
    held_out = {"toy_prompts": {"stop": 1000, "part": "held_out"}}
    cfg = TrainConfig(
        **TOY, eval={**held_out, "shifted": {"toy_prompts": {"start": 1000, "stop": 1064}}}
    )
    train = load_instance_ids(cfg.dataset)
    held = load_instance_ids(cfg.eval, "eval")
    assert len(train) + len(held) == 1000 and not set(train) & set(held)
    assert cfg.eval.shifted is not None
    assert load_instance_ids(cfg.eval.shifted)[0] == "toy-lookup-1000"


@pytest.mark.parametrize(
    ("train", "needle"),
    [
        # held-out prompts that are training prompts, in the main or the shifted set
        ({**TOY, "eval": {"toy_prompts": {"stop": 1000}}}, "must be held out"),
        (
            {
                **TOY,
                "eval": {
                    "instance_ids": ["toy-lookup-1001"],
                    "shifted": {"toy_prompts": {"stop": 10}},
                },
            },
            "must be held out",
        ),
        # toy prompts of a run that is not a toy run
        ({**TOY, "dataset": {"toy_prompts": {"stop": 5}}}, "toy_prompts needs kind: toy"),
        (
            {**TOY, "dataset": {"kind": "toy", "toy_prompts": {"start": 9, "stop": 9}}},
            r"stop \(9\) must be above start \(9\)",
        ),
        (
            {**TOY, "dataset": {"kind": "toy", "toy_prompts": {"stop": 9, "part": "test"}}},
            "part",
        ),
        ({**TOY, "eval": {}}, "eval_interval needs"),
    ],
)
def test_bad_toy_prompt_sets_are_refused_by_name(train: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        TrainConfig(**train)
