"""The SWE training composer's wiring: the shipped config as the trainer reads it with the
composer's overrides, the instance ids it reads for the scripted engine, bad input named."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_worker.images import DEFAULT_INSTANCES
from services.datasets import load_instances
from services.local_stack import StackError
from services.swe_train import config_instance_ids, main
from services.toy_train import trainer_env
from trainer.loop.cli import load_run_config
from trainer.loop.config import resolve_schedule

CONFIG = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "swe_mini_lisao.yaml"


def test_the_swe_config_with_the_composers_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = trainer_env(tmp_path, tmp_path / "m", "redis://127.0.0.1:7/0", "http://127.0.0.1:9", "t")
    for key, value in env.items():
        if key.startswith("SWERL_"):
            monkeypatch.setenv(key, value)
    cfg = load_run_config(str(CONFIG))
    assert cfg.train.dataset.kind == "swe" and cfg.train.run_dispatcher and cfg.train.publish
    # groups of two: sample 0 on the scripted engine, sample 1 on the sampling one
    assert cfg.train.bootstrap.group_size == 2
    assert resolve_schedule(cfg.train, cfg.trainer.algorithm) == "groups"
    # critic advantages: the sampled member trains without the scripted one's reward
    assert cfg.trainer.algorithm == "lisao" and cfg.train.critic_warmup_steps == 0
    assert cfg.trainer.model == str(tmp_path / "m")
    assert cfg.publish is not None and cfg.publish.weights_dir == str(tmp_path / "weights")
    # every instance of the config is in the mini set the worker and the script read
    ids = config_instance_ids(CONFIG)
    assert [i.instance_id for i in load_instances(DEFAULT_INSTANCES, only=ids)] == ids


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("train: {steps: 2}\n", "no train.dataset.instance_ids"),
        ("train: {dataset: {instance_ids: []}}\n", "non-empty id list"),
        ("train: {dataset: {instance_ids: [1, 2]}}\n", "non-empty id list"),
        ("[unclosed\n", "no train.dataset.instance_ids"),
    ],
)
def test_a_config_without_instance_ids_is_named(tmp_path: Path, text: str, needle: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(StackError, match=needle):
        config_instance_ids(config)


def test_unknown_instances_fail_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("train: {dataset: {instance_ids: [swerl__nope-1]}}\n")
    assert main(["--config", str(config), "--run-dir", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert "swerl__nope-1" in err and "--instances" in err
    assert not (tmp_path / "run" / "redis").exists()  # nothing was started
