"""The objective layer: each algorithm is the documented composition of the primitives."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.support import algorithm_reference as ref
from tests.support.algorithm_batches import DTYPES, on_devices_and_dtypes, random_batch
from trainer.algorithms import (
    ALGORITHMS,
    ObjectiveBatch,
    ObjectiveConfig,
    ReadinessGate,
    ReadinessStats,
    compute_objective,
)


def _objective_batch(b, *, values: bool = True, versions: bool = False) -> ObjectiveBatch:
    return ObjectiveBatch(
        tokens=b.tokens,
        action_mask=b.action_mask,
        group_ids=b.group_ids,
        rewards=b.rewards,
        behavior_logp=b.behavior_logp,
        logp=b.logp.clone().requires_grad_(),
        values=b.values.clone().requires_grad_() if values else None,
        old_values=b.old_values if values else None,
        token_versions=b.token_versions if versions else None,
        trainer_version=b.trainer_version if versions else None,
    )


def _grouped_seed(start: int) -> int:
    """A seed whose batch has a group of two or more (so Li2SAO takes the GRPO branch)."""
    seed = start
    while int(random_batch(seed).group_ids.unique(return_counts=True)[1].max()) < 2:
        seed += 1000
    return seed


def _lists(batch: ObjectiveBatch) -> dict[str, list]:
    return {
        "mask": batch.action_mask.tolist(),
        "rewards": batch.rewards.tolist(),
        "groups": batch.group_ids.tolist(),
        "logp": batch.logp.tolist(),
        "behavior": batch.behavior_logp.tolist(),
    }


def _token_adv(per_row: list[float], mask: list[list[bool]]) -> list[list[float]]:
    return [[a] * len(row) for a, row in zip(per_row, mask, strict=True)]


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", range(6))
def test_li2sao_bootstrap_is_grpo_dis_and_masked_residual_critic(seed, dtype, device) -> None:
    b = random_batch(_grouped_seed(seed), dtype, device)
    batch = _objective_batch(b)
    cfg = ObjectiveConfig()
    result = compute_objective("li2sao", batch, phase="bootstrap", config=cfg)
    assert result.estimator == "grpo"
    x = _lists(batch)
    adv = ref.grpo_advantages(x["rewards"], x["groups"])
    want_actor, want_actor_grad = ref.dis_loss(
        x["logp"], x["behavior"], _token_adv(adv, x["mask"]), x["mask"], 0.7, 6.0,
        "seq-mean-token-mean",
    )  # fmt: skip
    # critic: G = R (gamma = lambda = 1), centred, divergence mask, kept groups only
    n, width = len(x["mask"]), len(x["mask"][0])
    returns = [
        [x["rewards"][i] if x["mask"][i][t] else 0.0 for t in range(width)] for i in range(n)
    ]
    targets, keep = ref.residual_targets(returns, x["rewards"], x["groups"], x["mask"])
    div = ref.divergence_mask(b.tokens.tolist(), x["mask"], x["rewards"], x["groups"])
    critic_mask = [[div[i][t] and keep[i] for t in range(width)] for i in range(n)]
    res, _ = ref.clipped_value_loss(
        batch.values.tolist(), batch.old_values.tolist(), targets, critic_mask, 0.2
    )
    last = [ref.action_positions(row)[-1] for row in x["mask"]]
    final = [batch.values.tolist()[i][last[i]] for i in range(n)]
    rank = ref.ranking_loss(final, x["rewards"], x["groups"], 0.1)
    rel = 1e-4 if dtype == torch.float32 else 1e-8
    assert result.actor_loss.item() == pytest.approx(want_actor, rel=rel, abs=rel)
    assert result.critic_loss.item() == pytest.approx(res + 0.1 * rank, rel=rel, abs=rel)
    (result.actor_loss + result.critic_loss).backward()
    torch.testing.assert_close(
        batch.logp.grad.cpu(), torch.tensor(want_actor_grad, dtype=dtype), rtol=rel, atol=rel
    )
    ev, acc = ref.readiness(final, x["rewards"], x["groups"])
    assert result.readiness is not None
    assert result.readiness.ranking_accuracy == acc
    if ev is not None:
        assert result.readiness.explained_variance == pytest.approx(ev, rel=1e-5, abs=1e-6)
    assert result.metrics["critic/residual_loss"] == pytest.approx(res, rel=rel, abs=rel)
    assert result.metrics["actor/estimator_is_grpo"] == 1.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(6))
def test_li2sao_singletons_use_whitened_adaptive_gae(seed: int, dtype: torch.dtype) -> None:
    b = random_batch(seed, dtype, singleton=True)
    batch = _objective_batch(b)
    for phase in ("bootstrap", "switched"):
        result = compute_objective("li2sao", batch, phase=phase)
        assert result.estimator == "gae"
        x = _lists(batch)
        lam = ref.adaptive_lambda(x["mask"])
        token_rewards = [
            [
                x["rewards"][i] if t == ref.action_positions(row)[-1] else 0.0
                for t in range(len(row))
            ]
            for i, row in enumerate(x["mask"])
        ]
        adv, _ = ref.skip_observation_gae(
            token_rewards, batch.old_values.tolist(), x["mask"], 1.0, lam
        )
        adv = ref.whiten(adv, x["mask"])
        want_actor, _ = ref.dis_loss(
            x["logp"], x["behavior"], adv, x["mask"], 0.7, 6.0, "seq-mean-token-mean"
        )
        rel = 1e-4 if dtype == torch.float32 else 1e-8
        assert result.actor_loss.item() == pytest.approx(want_actor, rel=rel, abs=rel)
        if phase == "switched":
            _, returns = ref.skip_observation_gae(
                token_rewards, batch.old_values.tolist(), x["mask"], 1.0, [1.0] * len(lam)
            )
            want_critic, _ = ref.clipped_value_loss(
                batch.values.tolist(), batch.old_values.tolist(), returns, x["mask"], 0.2
            )
            assert result.critic_loss.item() == pytest.approx(want_critic, rel=rel, abs=rel)
            assert result.readiness is None
        else:
            # singleton groups: nothing to centre or rank, the residual critic loss is 0
            assert result.critic_loss.item() == 0.0
            assert result.readiness == ReadinessStats()


@pytest.mark.parametrize("seed", range(4))
def test_li2sao_switched_phase_with_groups_fits_absolute_returns(seed: int) -> None:
    """The prefetched n_b batch after the switch: GRPO actor, absolute-return critic."""
    b = random_batch(_grouped_seed(seed))
    batch = _objective_batch(b)
    result = compute_objective("li2sao", batch, phase="switched")
    assert result.estimator == "grpo" and result.readiness is None
    mask = batch.action_mask.tolist()
    returns = [[b.rewards.tolist()[i] if m else 0.0 for m in row] for i, row in enumerate(mask)]
    want, _ = ref.clipped_value_loss(
        batch.values.tolist(), batch.old_values.tolist(), returns, mask, 0.2
    )
    assert result.critic_loss.item() == pytest.approx(want)


@pytest.mark.parametrize("seed", range(4))
def test_baselines_compose_the_documented_pieces(seed: int) -> None:
    b = random_batch(_grouped_seed(seed))
    batch = _objective_batch(b, values=False)
    x = _lists(batch)
    adv = _token_adv(ref.grpo_advantages(x["rewards"], x["groups"]), x["mask"])
    grpo = compute_objective("grpo", batch)
    want, _, _ = ref.ppo_loss(
        x["logp"], x["behavior"], adv, x["mask"], 0.2, 0.28, "seq-mean-token-mean"
    )
    assert grpo.actor_loss.item() == pytest.approx(want) and grpo.critic_loss is None
    dapo = compute_objective("dapo", batch)
    want, _, _ = ref.ppo_loss(x["logp"], x["behavior"], adv, x["mask"], 0.2, 0.28, "token-mean")
    assert dapo.actor_loss.item() == pytest.approx(want) and dapo.critic_loss is None
    gspo = compute_objective("gspo", batch)
    want, _ = ref.gspo_loss(x["logp"], x["behavior"], adv, x["mask"], 3e-4, 4e-4)
    assert gspo.actor_loss.item() == pytest.approx(want) and gspo.critic_loss is None


def test_lisao_is_gae_dis_and_absolute_critic() -> None:
    b = random_batch(11, singleton=True)
    batch = _objective_batch(b)
    lisao = compute_objective("lisao", batch)
    li2sao = compute_objective("li2sao", batch, phase="switched")
    assert lisao.estimator == "gae"
    torch.testing.assert_close(lisao.actor_loss, li2sao.actor_loss)
    torch.testing.assert_close(lisao.critic_loss, li2sao.critic_loss)


@pytest.mark.parametrize(
    ("algorithm", "stage"),
    [(a, "actor") for a in ALGORITHMS] + [("pact", "critic")],
)
def test_every_algorithm_returns_finite_losses_and_float_metrics(algorithm: str, stage) -> None:
    b = random_batch(_grouped_seed(2))
    batch = _objective_batch(b, versions=True)
    config = ObjectiveConfig()
    if algorithm in ("pact", "srppo"):  # sigmoid head; rewards of random_batch lie in [-2, 2]
        batch = dataclasses.replace(
            batch, values=None, old_values=None, value_logits=b.values.clone().requires_grad_()
        )
        config = ObjectiveConfig(reward_min=-2.0, reward_max=2.0)
    result = compute_objective(algorithm, batch, stage=stage, config=config)  # type: ignore[arg-type]
    losses = [x for x in (result.actor_loss, result.critic_loss) if x is not None]
    assert losses and all(bool(torch.isfinite(x)) for x in losses)
    assert sum(losses).requires_grad  # type: ignore[union-attr]
    assert all(isinstance(v, float) for v in result.metrics.values())
    lags = ref.policy_lag(b.trainer_version, b.token_versions.tolist(), b.action_mask.tolist())
    assert result.metrics["staleness/mean_lag"] == pytest.approx(sum(lags) / len(lags))
    assert result.metrics["batch/trajectories"] == float(b.rewards.shape[0])
    assert (result.critic_loss is None) == (
        algorithm in ("grpo", "dapo", "gspo") or (algorithm, stage) == ("pact", "actor")
    )
    assert (result.actor_loss is None) == ((algorithm, stage) == ("pact", "critic"))


def test_whitening_uses_the_all_reduce_hook() -> None:
    b = random_batch(4, singleton=True)
    batch = _objective_batch(b)
    seen: list[torch.Tensor] = []

    def fake_all_reduce(t: torch.Tensor) -> torch.Tensor:
        seen.append(t.clone())
        return t * 2  # as if a second rank held an identical shard

    plain = compute_objective("li2sao", batch, phase="switched")
    reduced = compute_objective("li2sao", batch, phase="switched", all_reduce=fake_all_reduce)
    assert len(seen) == 1 and seen[0].shape == (3,)
    torch.testing.assert_close(plain.actor_loss, reduced.actor_loss)  # same mean and std


def test_gate_and_objective_work_together() -> None:
    """Bootstrap until the gate opens, then singleton batches use GAE."""
    gate = ReadinessGate(consecutive=2, t_min=1, t_max=5)
    step, switched = 0, False
    while not switched:
        step += 1
        b = random_batch(_grouped_seed(step))
        result = compute_objective("li2sao", _objective_batch(b), phase="bootstrap")
        assert result.readiness is not None
        switched = gate.update(step, result.readiness)
    assert gate.switch_step == step <= 5
    after = compute_objective(
        "li2sao", _objective_batch(random_batch(1, singleton=True)), phase="switched"
    )
    assert after.estimator == "gae"
