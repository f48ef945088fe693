"""The ``trainer`` config section: spec defaults, env overrides, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.config import ConfigError
from trainer.config import TrainerConfig, load_trainer_config


def test_defaults_are_the_spec_values() -> None:
    cfg = load_trainer_config(environ={})
    assert cfg == TrainerConfig()
    assert (cfg.actor.lr, cfg.critic.optimizer.lr, cfg.critic.updates_per_step) == (1e-6, 5e-6, 2)
    assert cfg.objective.value_clip == 0.2
    assert cfg.batch.max_policy_lag == 4
    assert (cfg.device, cfg.precision) == ("cpu", "fp32")


def test_pact_and_srppo_configure_with_the_sigmoid_head() -> None:
    for algorithm in ("pact", "srppo"):
        env = {"SWERL_TRAINER__ALGORITHM": algorithm, "SWERL_TRAINER__CRITIC__HEAD": "sigmoid"}
        assert load_trainer_config(environ=env).critic.head == "sigmoid"


def test_yaml_and_env_reach_nested_keys(tmp_path: Path) -> None:
    f = tmp_path / "swerl.yaml"
    f.write_text(
        "trainer:\n  model: /m\n  critic: {updates_per_step: 3}\n  objective: {dis_high: 5}\n"
    )
    env = {"SWERL_TRAINER__ACTOR__LR": "2e-6", "SWERL_TRAINER__OBJECTIVE__VALUE_CLIP": "0.3"}
    cfg = load_trainer_config(f, environ=env)
    assert cfg.model == "/m" and cfg.critic.updates_per_step == 3
    env = {"SWERL_TRAINER__BACKEND": "megatron", "SWERL_TRAINER__MEGATRON__TENSOR_PARALLEL": "2"}
    megatron = load_trainer_config(environ=env)
    assert (megatron.backend, megatron.megatron.tensor_parallel) == ("megatron", 2)
    assert megatron.megatron.context_parallel == 1  # the default: every rank whole sequences
    env = {"SWERL_TRAINER__MEGATRON__CONTEXT_PARALLEL": "4"}
    assert load_trainer_config(environ=env).megatron.context_parallel == 4
    assert (cfg.actor.lr, cfg.objective.value_clip, cfg.objective.dis_high) == (2e-6, 0.3, 5.0)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"SWERL_TRAINER__ALGORITHM": "ppo2"}, "unknown algorithm 'ppo2'"),
        ({"SWERL_TRAINER__OBJECTIVE__BOGUS": "1"}, "trainer.objective.bogus"),
        ({"SWERL_TRAINER__OBJECTIVE__DIS_LOW": "7"}, "dis_low must be < dis_high"),
        ({"SWERL_TRAINER__ACTOR__LR": "0"}, "trainer.actor.lr"),
        ({"SWERL_TRAINER__ACTOR__BETAS": "[0.9, 1.5]"}, "betas must lie in [0, 1)"),
        ({"SWERL_TRAINER__PRECISION": "bf16"}, "bf16 is the GPU path"),
        ({"SWERL_TRAINER__DEVICE": "tpu"}, "device must be cpu, cuda"),
        ({"SWERL_TRAINER__CRITIC__HEAD": "tanh"}, "trainer.critic.head"),
        ({"SWERL_TRAINER__BATCH__OVERLONG": "cut"}, "trainer.batch.overlong"),
        ({"SWERL_TRAINER__ALGORITHM": "pact"}, "algorithm 'pact' needs critic.head: sigmoid"),
        ({"SWERL_TRAINER__ACTOR_MINIBATCHES": "0"}, "trainer.actor_minibatches"),
        ({"SWERL_TRAINER__BACKEND": "deepspeed"}, "trainer.backend"),
        ({"SWERL_TRAINER__MEGATRON__TENSOR_PARALLEL": "0"}, "trainer.megatron.tensor_parallel"),
        ({"SWERL_TRAINER__MEGATRON__CONTEXT_PARALLEL": "0"}, "trainer.megatron.context_parallel"),
        (
            {
                "SWERL_TRAINER__MEGATRON__CONTEXT_PARALLEL": "2",
                "SWERL_TRAINER__MEGATRON__PIPELINE_PARALLEL": "2",
            },
            "context_parallel 2 with pipeline_parallel 2 is not built",
        ),
        (
            {
                "SWERL_TRAINER__MEGATRON__CONTEXT_PARALLEL": "2",
                "SWERL_TRAINER__MEGATRON__EXPERT_PARALLEL": "2",
            },
            "context_parallel 2 with expert_parallel 2 is not built",
        ),
    ],
)
def test_bad_values_name_the_key(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_trainer_config(environ=env)
    assert needle in str(err.value)


def test_a_registered_baseline_is_a_valid_algorithm_for_the_config_and_the_step() -> None:
    from trainer.algorithms import ALGORITHM_REGISTRY, register_composed
    from trainer.backends import StepObjective

    with pytest.raises(ValueError, match="unknown algorithm 'test_cfg_baseline'; known: dapo"):
        TrainerConfig(algorithm="test_cfg_baseline")
    register_composed("test_cfg_baseline", "grpo", "dis")
    try:
        assert TrainerConfig(algorithm="test_cfg_baseline").algorithm == "test_cfg_baseline"
        assert StepObjective(algorithm="test_cfg_baseline").algorithm == "test_cfg_baseline"  # type: ignore[arg-type]
    finally:
        ALGORITHM_REGISTRY.unregister("test_cfg_baseline")
    with pytest.raises(ValueError, match="unknown algorithm 'test_cfg_baseline'"):
        StepObjective(algorithm="test_cfg_baseline")  # type: ignore[arg-type]
