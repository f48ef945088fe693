"""The torch backend runs the step plan each algorithm registers: PACT's actor steps, forward of
the updated actor and critic stage in that order; SR-PPO's sigmoid head; recomputed old_logp;
a stage without an actor loss never steps the actor."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest
import torch

from tests.unit.trainer.backends.test_torch_backend import backend, constructed_batch
from trainer.algorithms import (
    ACTOR_CRITIC,
    ACTOR_ONLY,
    ALGORITHM_REGISTRY,
    OLD_LOGP,
    PACT_PLAN,
    STAGES,
    AlgorithmEntry,
    ObjectiveBatch,
    ObjectiveRequest,
    ObjectiveResult,
    StepPlan,
    actor_steps,
    compute_objective,
)
from trainer.backends import BackendError, StepObjective
from trainer.backends.torch_backend import TorchBackend
from trainer.data import TrainBatch

Seen = list[tuple[str, ObjectiveBatch]]


@pytest.fixture
def spy() -> Iterator[Callable[..., Seen]]:
    """``spy(name, inner, plan, stages)`` registers algorithm ``name``: ``inner``'s objective
    (an algorithm name), recording each (stage, batch) it is called with."""
    names: list[str] = []

    def register(name: str, inner: str, plan: StepPlan, stages=("actor",), edit=None) -> Seen:
        seen: Seen = []

        def objective(batch: ObjectiveBatch, request: ObjectiveRequest) -> ObjectiveResult:
            seen.append((request.stage, batch))
            result = compute_objective(
                inner, batch, phase=request.phase, stage=request.stage, config=request.config
            )
            return edit(result) if edit else result

        ALGORITHM_REGISTRY.register(name)(AlgorithmEntry(objective, tuple(stages), plan))
        names.append(name)
        return seen

    yield register
    for name in names:
        ALGORITHM_REGISTRY.unregister(name)


def off_policy_batch(b: TorchBackend, rewards=(1.0, 0.0, 0.0, 1.0)) -> TrainBatch:
    """Behaviour logprobs 0.05 below the current policy's: TIS and the ratio are not 1."""
    batch = constructed_batch(b, rewards)
    return replace(batch, behavior_logp=batch.behavior_logp - 0.05 * batch.action_mask)


def record_steps(b: TorchBackend, events: list[tuple]) -> None:
    """Append ``("actor_step",)`` / ``("critic_step",)`` on every optimizer step and
    ``("forward", actor, critic)`` on every no-grad forward of ``b``."""
    b.actor_optimizer.register_step_post_hook(lambda *_: events.append(("actor_step",)))
    b.critic_optimizer.register_step_post_hook(lambda *_: events.append(("critic_step",)))
    forward = b._forward

    def recorded(*args, **kwargs):
        events.append(("forward", kwargs["actor"], kwargs["critic"]))
        return forward(*args, **kwargs)

    b._forward = recorded  # type: ignore[method-assign]


PACT_CONFIG = {
    "actor": {"lr": 1e-3},
    # a wider head init: logits of a few units, so the IS weights move the BCE visibly
    "critic": {"optimizer": {"lr": 1e-3}, "head": "sigmoid", "head_init_std": 0.3},
    "actor_minibatches": 2,
    "phase_timings": True,
}


@pytest.mark.slow  # three backends and several forwards of the tiny model
def test_pact_critic_stage_sees_the_updated_actor(tiny_model_dir: Path, spy) -> None:
    b = backend(tiny_model_dir, **PACT_CONFIG)
    batch = off_policy_batch(b)
    before = b.logprobs_and_values(batch)
    events: list[tuple] = []
    seen = spy("pact_spy", "pact", PACT_PLAN, STAGES)
    record_steps(b, events)
    metrics = b.train_step(batch, StepObjective(algorithm="pact_spy"))
    after = b.logprobs_and_values(batch).logprobs  # records one more forward
    mask = batch.action_mask
    assert events[:-1] == [
        ("forward", True, True),  # V_old and the pre-update logprobs (old_logp)
        ("actor_step",),  # minibatch 1 (group 0)
        ("forward", True, False),  # minibatch 2's rows under the moved actor
        ("actor_step",),  # minibatch 2 (group 1)
        ("forward", True, False),  # PACT step 3: one forward of the updated actor
        ("critic_step",),
        ("forward", False, True),  # the critic moved: its outputs on minibatch 2
        ("critic_step",),
    ]
    assert [stage for stage, _ in seen] == ["actor", "actor", "critic", "critic"]
    for stage, ob in seen:  # old_logp: the recomputed pre-update policy, in both stages
        assert ob.old_logp is not None and torch.equal(ob.old_logp, before.logprobs), stage
    critic_logp = seen[2][1].logp.detach()
    assert torch.allclose(critic_logp[mask], after[mask], atol=1e-6, rtol=0)  # the updated actor
    assert float((critic_logp - before.logprobs)[mask].abs().max()) > 1e-3  # which moved
    assert b.version == 1 and metrics["actor/optimizer_steps"] == 2.0
    assert {"critic/is_reject_frac", "critic/bce", "actor/tis_mean"} <= set(metrics)
    for key in ("forward", "actor", "forward_actor", "critic", "step"):
        assert metrics[f"time/{key}_s"] >= 0.0


@pytest.mark.slow  # two backends, a step each
def test_pact_critic_loss_is_bce_on_the_updated_actors_importance_weighted_target(
    tiny_model_dir: Path,
) -> None:
    b = backend(tiny_model_dir, **PACT_CONFIG)
    batch = off_policy_batch(b)
    old_logp = b.logprobs_and_values(batch).logprobs
    logits = b._forward(batch, b._plan(batch), actor=False, critic=True, raw=True).values
    assert logits is not None and float(logits[batch.action_mask].abs().max()) > 0.5
    metrics = b.train_step(batch, StepObjective(algorithm="pact"))
    new_logp = b.logprobs_and_values(batch).logprobs
    # independently: the critic stage at the first critic logits, old = pre-update, new = after
    ob = batch.objective_batch(new_logp, old_logp=old_logp, value_logits=logits)
    expected = compute_objective("pact", ob, stage="critic")
    assert expected.critic_loss is not None
    assert abs(metrics["critic/loss"] - float(expected.critic_loss)) < 1e-5
    assert abs(metrics["critic/is_weight_mean"] - expected.metrics["critic/is_weight_mean"]) < 1e-5
    # the target with the pre-update logprobs (a skipped forward) gives another loss
    stale = batch.objective_batch(old_logp, old_logp=old_logp, value_logits=logits)
    stale_loss = compute_objective("pact", stale, stage="critic").critic_loss
    assert stale_loss is not None and abs(float(stale_loss) - metrics["critic/loss"]) > 1e-4


@pytest.mark.slow  # several steps of the tiny model
def test_srppo_trains_its_sigmoid_head_on_bce_plus_mse(tiny_model_dir: Path, spy) -> None:
    linear = backend(tiny_model_dir)
    with pytest.raises(BackendError, match=r"needs critic\.head='sigmoid'"):
        linear.train_step(constructed_batch(linear), StepObjective(algorithm="srppo"))
    b = backend(tiny_model_dir, critic={"optimizer": {"lr": 1e-3}, "head": "sigmoid"})
    batch = off_policy_batch(b)
    seen = spy("srppo_spy", "srppo", ACTOR_CRITIC)
    calibration = []
    for _ in range(4):
        metrics = b.train_step(batch, StepObjective(algorithm="srppo_spy"))
        # loss = bce + mse (coefficients 1) of the critic outputs at the step's start
        assert abs(metrics["critic/loss"] - metrics["critic/bce"] - metrics["critic/mse"]) < 1e-6
        calibration.append(metrics["critic/bce"] + metrics["critic/mse"])
    ob = seen[0][1]  # the value logits reach the loss, and values are their sigmoid
    assert ob.value_logits is not None and ob.value_logits.requires_grad
    assert ob.values is not None and torch.equal(ob.values, torch.sigmoid(ob.value_logits))
    assert ob.old_logp is None  # SR-PPO's ratio is on the behaviour logprobs
    assert all(later < earlier for earlier, later in pairwise(calibration)), calibration
    assert calibration[-1] < calibration[0] - 0.02


def test_old_logp_is_recomputed_before_the_update_when_the_plan_asks(
    tiny_model_dir: Path, spy
) -> None:
    b = backend(tiny_model_dir, actor={"lr": 1e-3})
    batch = off_policy_batch(b)
    before = b.logprobs_and_values(batch).logprobs
    asks = spy("old_logp_spy", "grpo", StepPlan((OLD_LOGP, actor_steps())))
    plain = spy("plain_spy", "grpo", ACTOR_ONLY)
    b.train_step(batch, StepObjective(algorithm="old_logp_spy"))
    after = b.logprobs_and_values(batch).logprobs
    ((_, ob),) = asks
    assert ob.old_logp is not None and torch.equal(ob.old_logp, before)
    mask = batch.action_mask
    assert float((ob.old_logp - batch.behavior_logp)[mask].abs().min()) > 0.04  # not behaviour
    assert float((ob.old_logp - after)[mask].abs().max()) > 1e-3  # the update came after
    b.train_step(batch, StepObjective(algorithm="plain_spy"))
    ((_, plain_ob),) = plain
    assert plain_ob.old_logp is None


def test_a_stage_without_actor_loss_never_steps_the_actor(tiny_model_dir: Path, spy) -> None:
    b = backend(tiny_model_dir, actor={"lr": 1e-3}, critic={"optimizer": {"lr": 1e-3}})
    batch = off_policy_batch(b)
    spy("critic_only", "li2sao", ACTOR_CRITIC, edit=lambda r: replace(r, actor_loss=None))
    actor = {n: p.detach().clone() for n, p in b.actor.named_parameters()}
    head = b.critic.value_head.weight.detach().clone()
    events: list[tuple] = []
    record_steps(b, events)
    metrics = b.train_step(batch, StepObjective(algorithm="critic_only"))
    assert ("actor_step",) not in events and not b.actor_optimizer.state
    assert all(torch.equal(actor[n], p) for n, p in b.actor.named_parameters())
    assert b.version == 0 and "actor/grad_norm" not in metrics
    assert events.count(("critic_step",)) == 2  # K = 2 critic passes still ran
    assert not torch.equal(head, b.critic.value_head.weight)
    assert not any(key.startswith("time/") for key in metrics)  # phase_timings is off


@pytest.mark.parametrize("minibatches", [2, 3])
def test_actor_minibatches_are_whole_groups_one_step_each(
    tiny_model_dir: Path, minibatches
) -> None:
    b = backend(tiny_model_dir, actor={"lr": 1e-3}, actor_minibatches=minibatches)
    batch = off_policy_batch(b, rewards=(1.0, 0.0, 0.0, 1.0))  # groups g0 = rows 0-1, g1 = 2-3
    stepped: list[list[int]] = []
    backprop = b._backprop

    def recorded(batch, plan, grad, forward):
        stepped.append(sorted(r for m in plan if m.real for r in m.rows.tolist()))
        return backprop(batch, plan, grad, forward)

    b._backprop = recorded  # type: ignore[method-assign]
    metrics = b.train_step(batch, StepObjective(algorithm="li2sao"))
    # two actor steps (a third minibatch would be empty: skipped), then K = 2 critic passes
    # over the whole batch; every group in exactly one actor minibatch
    assert metrics["actor/optimizer_steps"] == 2.0 and b.version == 1
    assert sorted(stepped[:2]) == [[0, 1], [2, 3]]
    assert stepped[2:] == [[0, 1, 2, 3]] * 2
    assert {"actor/grad_norm_mb0", "actor/grad_norm_mb1", "actor/loss_mb1"} <= set(metrics)
