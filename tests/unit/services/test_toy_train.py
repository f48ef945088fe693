"""The toy training composer's wiring: the adapter's tokens, the shipped toy configs as the
trainer reads them with the composer's environment overrides, a missing toy model."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.local_stack import StackError, adapter_env
from services.toy_train import toy_model_dir, trainer_env
from trainer.loop.cli import load_run_config
from trainer.loop.config import resolve_schedule

CONFIGS = Path(__file__).resolve().parents[3] / "trainer" / "configs"


def test_adapter_env_adds_the_admin_token_only_when_given() -> None:
    assert adapter_env("w", None) == {"SWERL_ADAPTER__WORKER_TOKEN": "w"}
    assert adapter_env("w", "a") == {
        "SWERL_ADAPTER__WORKER_TOKEN": "w",
        "SWERL_ADAPTER__ADMIN_TOKEN": "a",
    }


@pytest.mark.parametrize(("name", "algorithm", "schedule"),
                         [("toy_grpo.yaml", "grpo", "groups"),
                          ("toy_lisao.yaml", "lisao", "single"),
                          ("toy_li2sao.yaml", "li2sao", "switch")])  # fmt: skip
def test_the_toy_configs_with_the_composers_overrides(
    name: str, algorithm: str, schedule: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = trainer_env(tmp_path, tmp_path / "m", "redis://127.0.0.1:7/0", "http://127.0.0.1:9", "t")
    for key, value in env.items():
        if key.startswith("SWERL_"):
            monkeypatch.setenv(key, value)
    cfg = load_run_config(str(CONFIGS / name))
    assert cfg.train.run_dir == str(tmp_path / "train")
    assert cfg.train.dataset.kind == "toy"
    if schedule == "single":  # 64 single rollouts per step from the start
        assert cfg.train.single.batch_size == 64
    else:
        assert (cfg.train.bootstrap.prompts, cfg.train.bootstrap.group_size) == (8, 8)
    assert cfg.train.rollout.sampling.temperature == 1.0
    assert cfg.train.rollout.sampling.max_tokens == 32
    assert cfg.train.run_dispatcher
    assert (cfg.trainer.algorithm, cfg.trainer.actor.lr) == (algorithm, 1e-3)
    assert resolve_schedule(cfg.train, algorithm) == schedule
    assert cfg.trainer.model == str(tmp_path / "m")
    assert cfg.manager.redis_url == "redis://127.0.0.1:7/0"
    assert cfg.publish is not None
    assert (cfg.publish.adapter_url, cfg.publish.admin_token) == ("http://127.0.0.1:9", "t")
    assert cfg.publish.weights_dir == str(tmp_path / "weights")


def test_a_missing_toy_model_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWERL_CACHE_DIR", str(tmp_path))
    with pytest.raises(StackError, match="tiny-model-toy-v2 is missing"):
        toy_model_dir()
