"""The torch backend's optional KL term to the frozen initial model, and the metrics users watch
first: entropy, grad norm and the warm-up learning rate of each step."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.trajectory_records import record, turn
from trainer.backends import StepObjective, create_backend
from trainer.backends.torch_backend import TorchBackend
from trainer.config import TrainerConfig
from trainer.data import TrainBatch, build_batch

pytestmark = pytest.mark.slow  # several backends and steps on the tiny model


def backend(model_dir: Path, **overrides) -> TorchBackend:
    b = create_backend(TrainerConfig(model=str(model_dir), **overrides))
    assert isinstance(b, TorchBackend)
    return b


def on_policy_batch(b: TorchBackend) -> TrainBatch:
    records = [
        record(f"k{i}", [([3, 4, 5], [turn([], [30 + i, 31, 32], 0)])], float(i % 2), f"g{i // 2}")
        for i in range(4)
    ]
    batch, _ = build_batch(records, trainer_version=0)
    return replace(batch, behavior_logp=b.logprobs_and_values(batch).logprobs)


def drift(b: TorchBackend, batch: TrainBatch, start) -> float:
    now = b.logprobs_and_values(batch).logprobs
    return float((now - start)[batch.action_mask].abs().mean())


def test_kl_term_holds_the_actor_near_the_reference(tiny_model_dir: Path) -> None:
    free = backend(tiny_model_dir, actor={"lr": 3e-3})
    assert free.reference is None  # off by default: no reference model is loaded
    held = backend(tiny_model_dir, actor={"lr": 3e-3}, kl_coef=20.0)
    batch = on_policy_batch(free)
    start = batch.behavior_logp
    objective = StepObjective(algorithm="grpo")
    kls = []
    for _ in range(3):
        m_free = free.train_step(batch, objective)
        m_held = held.train_step(batch, objective)
        assert "actor/kl_ref" not in m_free
        kls.append(m_held["actor/kl_ref"])
    assert kls[0] == 0.0  # the first step starts at the reference
    assert all(k > 0 for k in kls[1:])
    assert 0 < drift(held, batch, start) < 0.8 * drift(free, batch, start)


def test_entropy_grad_norm_and_warm_up_lr_of_each_step(tiny_model_dir: Path) -> None:
    b = backend(
        tiny_model_dir,
        actor={"lr": 1e-3, "warmup_steps": 2},
        critic={"optimizer": {"lr": 2e-3, "warmup_steps": 2}},
    )
    batch = on_policy_batch(b)
    lrs, critic_lrs = [], []
    for _ in range(3):
        before = b.logprobs_and_values(batch)
        metrics = b.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
        entropy = float(before.entropy[batch.action_mask].mean())
        assert metrics["actor/entropy"] == pytest.approx(entropy, rel=1e-5)
        assert metrics["actor/grad_norm"] > 0 and metrics["critic/grad_norm_pass0"] > 0
        lrs.append(metrics["actor/lr"])
        critic_lrs.append(metrics["critic/lr"])
    # the lr each step used: linear warm-up over warmup_steps optimizer steps, then flat
    assert lrs == pytest.approx([1e-3 / 2, 1e-3, 1e-3])
    # the critic takes K = 2 steps per train step: its first step's lr is (1/2, 1, 1) x lr
    assert critic_lrs == pytest.approx([1e-3, 2e-3, 2e-3])


def test_cosine_decay_sets_the_lr_of_each_step(tiny_model_dir: Path) -> None:
    b = backend(
        tiny_model_dir,
        actor={"lr": 1e-3, "schedule": "cosine", "decay_steps": 2, "min_lr_ratio": 0.1},
        critic={"optimizer": {"lr": 2e-3, "schedule": "linear", "decay_steps": 4}},
    )
    batch = on_policy_batch(b)
    lrs, critic_lrs = [], []
    for _ in range(4):
        metrics = b.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
        lrs.append(metrics["actor/lr"])
        critic_lrs.append(metrics["critic/lr"])
    # cosine over 2 optimizer steps: peak, halfway (1 + 0.1) / 2, then the floor 0.1
    assert lrs == pytest.approx([1e-3, 0.55e-3, 1e-4, 1e-4])
    # linear to 0 over 4 critic steps, K = 2 per train step: each step's first pass logs
    assert critic_lrs == pytest.approx([2e-3, 1e-3, 0.0, 0.0], abs=1e-12)
