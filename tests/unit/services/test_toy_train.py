"""The toy training composer's wiring: the adapter's tokens, the shipped toy configs as the
trainer reads them with the composer's environment overrides, a missing toy model."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from services.local_stack import StackError, adapter_env
from services.toy_train import (
    MetricsFollower,
    configured_steps,
    main,
    progress_line,
    toy_model_dir,
    trainer_command,
    trainer_env,
)
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
    # critic-based advantages collapsed the policy at 1e-3 (docs/training.md)
    assert (cfg.trainer.algorithm, cfg.trainer.actor.lr) == (
        algorithm,
        1e-3 if algorithm == "grpo" else 5e-4,
    )
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


def test_a_progress_line_shows_the_step_reward_phase_lag_and_time() -> None:
    row = {"step": 10, "reward/mean": 0.53125, "phase": "bootstrap", "lag/mean": 2.0,
           "time/step": 3.25}  # fmt: skip
    line = progress_line(row, 40, width=8)
    assert line.startswith("[##......] step 10/40")
    assert "reward 0.531" in line and "phase bootstrap" in line and "lag 2.0" in line
    assert line.endswith("3.2 s") or line.endswith("3.3 s")
    bare = progress_line({"step": 3, "reward/mean": None}, None)
    assert bare.startswith("step 3") and "reward -" in bare and "lag -" in bare


def test_the_follower_prints_each_complete_metrics_line_once(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    out = io.StringIO()
    follower = MetricsFollower(path, 3, out)
    follower.poll()  # no file yet: nothing
    assert out.getvalue() == ""
    path.write_text(json.dumps({"step": 1, "reward/mean": 0.25}) + "\n" + '{"step": 2, "rew')
    follower.poll()
    follower.poll()  # the half-written line waits; the first is not printed twice
    assert out.getvalue().count("step 1/3") == 1 and "step 2/3" not in out.getvalue()
    with open(path, "a") as fh:
        fh.write('ard/mean": 0.5}\nnot json\n' + json.dumps({"step": 3}) + "\n")
    follower.poll()
    lines = out.getvalue().splitlines()
    assert [line.split("] ")[1].split()[1] for line in lines] == ["1/3", "2/3", "3/3"]
    assert "reward 0.500" in lines[1]


def test_the_progress_total_comes_from_the_config(tmp_path: Path) -> None:
    assert configured_steps(CONFIGS / "toy_li2sao.yaml") == 50
    bad = tmp_path / "bad.yaml"
    for text in ("train: {steps: zero}", "train: [1]", ": : :", "other: 1"):
        bad.write_text(text)
        assert configured_steps(bad) is None, text
    assert configured_steps(tmp_path / "missing.yaml") is None


def test_the_trainer_runs_under_torchrun_only_with_several_ranks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = CONFIGS / "toy_li2sao.yaml"
    train = ["-m", "trainer", "train", "--config", str(config)]
    assert trainer_command(config) == [sys.executable, *train]
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3"]
    assert trainer_command(config, 3) == [sys.executable, *launcher, *train]
    with pytest.raises(StackError, match="--nproc must be >= 1, got 0"):
        trainer_command(config, 0)
    with pytest.raises(SystemExit) as exit_info:  # refused before any service starts
        main(["--config", str(config), "--run-dir", "/nonexistent/x", "--nproc", "0"])
    assert exit_info.value.code == 2
    assert "--nproc must be >= 1, got 0" in capsys.readouterr().err


def test_one_run_seed_sets_every_seed_of_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.toy_train import engine_seed_args, seed_overrides

    for key, value in seed_overrides(5).items():
        monkeypatch.setenv(key, value)
    cfg = load_run_config(str(CONFIGS / "toy_li2sao.yaml"))
    assert (cfg.trainer.seed, cfg.train.dataset.seed) == (5, 5)
    assert engine_seed_args(5) != engine_seed_args(6)
    assert engine_seed_args(5)[0] == "--seed" and int(engine_seed_args(5)[1]) >= 0
    with pytest.raises(StackError, match="--seed must be >= 0"):
        seed_overrides(-1)
