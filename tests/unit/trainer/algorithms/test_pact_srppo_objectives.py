"""``pact_objective`` (actor and critic stages) and ``srppo_objective`` against the references."""

from __future__ import annotations

import math

import pytest
import torch

from tests.support import algorithm_reference as ref
from tests.support.algorithm_batches import on_devices_and_dtypes, random_batch
from trainer.algorithms import (
    CRITIC_IS_MODES,
    ObjectiveBatch,
    ObjectiveConfig,
    compute_objective,
    pact_advantages,
    pact_objective,
    srppo_objective,
    whiten,
)

RANGE = {"reward_min": -2.0, "reward_max": 2.0}  # random_batch's rewards lie in [-2, 2]


def _batch(b, *, old_logp: bool = True, logits: bool = True, rewards=None) -> ObjectiveBatch:
    """``value_logits`` = the batch's raw values (a sigmoid head); ``old_logp`` between the
    behaviour and current log-probs (a trainer recomputation)."""
    return ObjectiveBatch(
        tokens=b.tokens,
        action_mask=b.action_mask,
        group_ids=b.group_ids,
        rewards=b.rewards if rewards is None else rewards,
        behavior_logp=b.behavior_logp,
        logp=b.logp.clone().requires_grad_(),
        values=None if logits else torch.sigmoid(b.old_values),
        value_logits=b.values.clone().requires_grad_() if logits else None,
        old_logp=(0.5 * (b.logp + b.behavior_logp)) if old_logp else None,
    )


def _rel(dtype: torch.dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 1e-9


def _unit(b) -> list[float]:
    return ref.normalize_rewards(b.rewards.tolist(), -2.0, 2.0)


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("loss", ["dis", "ppo"])
@pytest.mark.parametrize("with_old", [True, False])
def test_pact_actor_stage_matches_reference(seed, dtype, device, loss, with_old) -> None:
    b = random_batch(seed, dtype, device)
    batch = _batch(b, old_logp=with_old)
    cfg = ObjectiveConfig(pact_policy_loss=loss, **RANGE)
    result = compute_objective("pact", batch, stage="actor", config=cfg)
    assert result.critic_loss is None and result.estimator == "gae"
    mask = b.action_mask.tolist()
    rewards = _unit(b)
    old_values = batch.old_values.tolist()  # sigmoid(value_logits), frozen
    old = (batch.old_logp if with_old else batch.behavior_logp).tolist()
    adv = ref.pact_advantages(rewards, old_values, mask)
    low, high = (0.7, 6.0) if loss == "dis" else (0.2, 0.28)
    want, want_grad = ref.pact_actor_loss(
        batch.logp.tolist(), old, b.behavior_logp.tolist(), adv, mask, loss, low, high
    )
    rel = _rel(dtype)
    assert result.actor_loss.item() == pytest.approx(want, rel=rel, abs=rel)
    result.actor_loss.backward()
    torch.testing.assert_close(
        batch.logp.grad.cpu(), torch.tensor(want_grad, dtype=dtype), rtol=rel, atol=rel
    )
    assert batch.value_logits.grad is None  # the actor stage never touches the critic
    tis = ref.tis_weights(old, b.behavior_logp.tolist(), mask, 0.0, 2.0)
    picked = [(i, t) for i, row in enumerate(mask) for t, m in enumerate(row) if m]
    m = result.metrics
    assert m["actor/tis_mean"] == pytest.approx(
        sum(tis[i][t] for i, t in picked) / len(picked), rel=rel
    )
    capped = sum(math.exp(old[i][t] - b.behavior_logp.tolist()[i][t]) > 2 for i, t in picked)
    assert m["actor/tis_capped_frac"] == pytest.approx(capped / len(picked))
    if not with_old:
        assert m["actor/tis_mean"] == 1.0 and m["actor/tis_capped_frac"] == 0.0
    credit = ref.pact_credit(rewards, old_values, mask)
    want_credit = sum(abs(credit[i][t]) for i, t in picked) / len(picked)
    assert m["critic/mean_abs_credit"] == pytest.approx(want_credit, rel=rel)
    assert m["actor/adv_mean"] == pytest.approx(
        sum(adv[i][t] for i, t in picked) / len(picked), rel=rel, abs=rel
    )
    # explained variance of G = R by V_old over the action tokens: 1 - Var(R - V) / Var(R)
    g = [rewards[i] for i, _ in picked]
    resid = [rewards[i] - old_values[i][t] for i, t in picked]

    def pvar(xs: list[float]) -> float:
        mean = sum(xs) / len(xs)
        return sum((x - mean) ** 2 for x in xs) / len(xs)

    if pvar(g) > 0:
        want_ev = 1 - pvar(resid) / pvar(g)
        assert m["critic/explained_variance"] == pytest.approx(want_ev, rel=rel * 10, abs=rel)


def test_pact_actor_ratio_is_on_old_logp_and_tis_folds_into_the_advantage() -> None:
    """One token, hand numbers: rho = exp(logp - old) = 1.1, w = exp(old - mu) = 1.5."""
    mu = torch.tensor([[0.0]], dtype=torch.float64)
    old = torch.tensor([[math.log(1.5)]], dtype=torch.float64)
    logp = (old + math.log(1.1)).requires_grad_()
    value_logits = torch.tensor([[math.log(0.25 / 0.75)]], dtype=torch.float64)  # V = 0.25
    batch = ObjectiveBatch(
        tokens=torch.zeros(1, 1, dtype=torch.long),
        action_mask=torch.ones(1, 1),
        group_ids=torch.zeros(1, dtype=torch.long),
        rewards=torch.ones(1, dtype=torch.float64),
        behavior_logp=mu,
        logp=logp,
        old_logp=old,
        value_logits=value_logits,
    )
    result = pact_objective(batch, "actor")
    # DIS: l = w * rho * A = 1.5 * 1.1 * (1 - 0.25); loss = -l; d/dlogp = -l
    assert result.actor_loss.item() == pytest.approx(-1.5 * 1.1 * 0.75)
    result.actor_loss.backward()
    assert logp.grad.item() == pytest.approx(-1.5 * 1.1 * 0.75)
    ppo = pact_objective(batch, "actor", ObjectiveConfig(pact_policy_loss="ppo"))
    # PPO: rho = 1.1 < 1.28, A > 0: unclipped, the same value
    assert ppo.actor_loss.item() == pytest.approx(-1.5 * 1.1 * 0.75)


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mode", CRITIC_IS_MODES)
def test_pact_critic_stage_matches_reference(seed, dtype, device, mode) -> None:
    b = random_batch(seed, dtype, device)
    batch = _batch(b)  # batch.logp plays the updated actor's log-probs here
    cfg = ObjectiveConfig(pact_critic_is=mode, **RANGE)
    result = compute_objective("pact", batch, stage="critic", config=cfg)
    assert result.actor_loss is None
    mask = b.action_mask.tolist()
    targets, keep = ref.pact_critic_targets(
        _unit(b), batch.logp.tolist(), batch.old_logp.tolist(), mask, mode
    )
    want, want_grad = ref.bce_value_loss(batch.value_logits.tolist(), targets, keep)
    rel = _rel(dtype)
    assert result.critic_loss.item() == pytest.approx(want, rel=rel, abs=rel)
    result.critic_loss.backward()
    torch.testing.assert_close(
        batch.value_logits.grad.cpu(), torch.tensor(want_grad, dtype=dtype), rtol=rel, atol=rel
    )
    assert batch.logp.grad is None  # new log-probs are read detached
    actions = sum(sum(row) for row in mask)
    kept = sum(sum(row) for row in keep)
    assert result.metrics["critic/is_reject_frac"] == pytest.approx(1 - kept / actions)
    weights = ref.critic_is_weights(batch.logp.tolist(), batch.old_logp.tolist(), mask, mode)
    kept_w = [weights[i][t] for i, row in enumerate(keep) for t, k in enumerate(row) if k]
    assert result.metrics["critic/is_weight_mean"] == pytest.approx(
        sum(kept_w) / len(kept_w), rel=rel
    )
    assert result.metrics["critic/loss"] == pytest.approx(want, rel=rel, abs=rel)


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [1.0, 4.0])
def test_srppo_matches_reference(seed, dtype, device, k) -> None:
    b = random_batch(seed, dtype, device)
    batch = _batch(b)
    cfg = ObjectiveConfig(srppo_k=k, **RANGE)
    result = compute_objective("srppo", batch, config=cfg)
    assert result.estimator == "gae"
    mask = b.action_mask.tolist()
    rewards = _unit(b)
    old_values = batch.old_values.tolist()
    adv = ref.srppo_advantages(rewards, old_values, mask, k)
    # PPO clip on the rollout ratio exp(logp - mu): old_logp plays no part
    want_actor, want_actor_grad, _ = ref.ppo_loss(
        batch.logp.tolist(), b.behavior_logp.tolist(), adv, mask, 0.2, 0.28,
        "seq-mean-token-mean",
    )  # fmt: skip
    targets = [[rewards[i] if m else 0.0 for m in row] for i, row in enumerate(mask)]
    want_critic, want_critic_grad = ref.bce_value_loss(
        batch.value_logits.tolist(), targets, mask, 1.0, 1.0
    )
    rel = _rel(dtype)
    assert result.actor_loss.item() == pytest.approx(want_actor, rel=rel, abs=rel)
    assert result.critic_loss.item() == pytest.approx(want_critic, rel=rel, abs=rel)
    (result.actor_loss + result.critic_loss).backward()
    torch.testing.assert_close(
        batch.logp.grad.cpu(), torch.tensor(want_actor_grad, dtype=dtype), rtol=rel, atol=rel
    )
    torch.testing.assert_close(
        batch.value_logits.grad.cpu(),
        torch.tensor(want_critic_grad, dtype=dtype),
        rtol=rel,
        atol=rel,
    )
    first = [old_values[i][ref.action_positions(row)[0]] for i, row in enumerate(mask)]
    passk = [ref.passk_weight(v, k) for v in first]
    m = result.metrics
    assert m["actor/passk_weight_mean"] == pytest.approx(sum(passk) / len(passk), rel=rel)
    assert m["actor/passk_weight_min"] == pytest.approx(min(passk), rel=rel)
    assert m["actor/passk_weight_max"] == pytest.approx(max(passk), rel=rel)
    shares = [m[f"actor/passk_share_{name}"] for name in ("hard", "medium", "easy")]
    assert sum(shares) == pytest.approx(1.0)
    q = [min(max(v, 0), 1) for v in first]
    hard = sum(w for w, qi in zip(passk, q, strict=True) if qi < 3 / 8) / sum(passk)
    assert shares[0] == pytest.approx(hard, rel=rel, abs=rel)
    # explained variance of the targets y = R by V_old over the action tokens, and the gap
    picked = [(i, t) for i, row in enumerate(mask) for t, on in enumerate(row) if on]
    g = [rewards[i] for i, _ in picked]
    resid = [rewards[i] - old_values[i][t] for i, t in picked]
    mean = sum(g) / len(g)
    var_g = sum((x - mean) ** 2 for x in g) / len(g)
    mean_r = sum(resid) / len(resid)
    var_r = sum((x - mean_r) ** 2 for x in resid) / len(resid)
    if var_g > 0:
        ev = m["critic/explained_variance"]
        assert ev == pytest.approx(1 - var_r / var_g, rel=rel * 10, abs=rel)


def test_critic_metrics_hand_example() -> None:
    """Calibration: BCE and MSE of V_old vs R over action tokens, Delta_+- (PACT sec. 5.3)."""
    v = torch.tensor([[0.8, 0.6], [0.2, 0.4]], dtype=torch.float64)
    batch = ObjectiveBatch(
        tokens=torch.zeros(2, 2, dtype=torch.long),
        action_mask=torch.ones(2, 2),
        group_ids=torch.tensor([0, 1]),
        rewards=torch.tensor([1.0, 0.0], dtype=torch.float64),
        behavior_logp=torch.zeros(2, 2, dtype=torch.float64),
        logp=torch.zeros(2, 2, dtype=torch.float64, requires_grad=True),
        value_logits=torch.logit(v).requires_grad_(),
    )
    m = srppo_objective(batch).metrics
    bce = -(math.log(0.8) + math.log(0.6) + math.log(0.8) + math.log(0.6)) / 4
    assert m["critic/bce"] == pytest.approx(bce)
    assert m["critic/mse"] == pytest.approx((0.04 + 0.16 + 0.04 + 0.16) / 4)
    assert m["critic/value_gap"] == pytest.approx(0.7 - 0.3)
    # G = R: Var(G) = 0.25, Var(G - V) = Var([0.2, 0.4, -0.2, -0.4]) = 0.1
    assert m["critic/explained_variance"] == pytest.approx(1 - 0.1 / 0.25)
    critic = pact_objective(batch, "critic").metrics
    assert critic["critic/value_gap"] == pytest.approx(0.4)
    # logp = old_logp = behaviour: every weight is 1, nothing rejected
    assert critic["critic/is_reject_frac"] == 0.0 and critic["critic/is_weight_mean"] == 1.0


# --- edge cases ---


@pytest.mark.parametrize("seed", range(4))
def test_all_zero_rewards(seed: int) -> None:
    """No group statistic: R = 0 everywhere still gives A = -V (PACT), -w V (SR-PPO), y = 0."""
    b = random_batch(seed, singleton=seed % 2 == 0)
    zeros = torch.zeros_like(b.rewards)
    batch = _batch(b, old_logp=False, rewards=zeros)
    v = batch.old_values
    adv = pact_advantages(zeros, v, b.action_mask)
    torch.testing.assert_close(adv, torch.where(b.action_mask, -v, 0.0), rtol=0, atol=0)
    result = pact_objective(batch, "actor")
    assert result.metrics["actor/adv_mean"] < 0  # every advantage is -V < 0
    critic = pact_objective(batch, "critic")
    # targets 0: the BCE is mean softplus(z) over the action tokens
    z, mask = batch.value_logits.detach(), b.action_mask
    want = torch.nn.functional.softplus(z)[mask].mean()
    torch.testing.assert_close(critic.critic_loss.detach(), want)
    sr = srppo_objective(batch)
    assert sr.metrics["actor/adv_mean"] < 0 and math.isfinite(sr.metrics["critic/bce"])
    assert math.isnan(sr.metrics["critic/value_gap"])  # no R = 1 row


def test_single_token_responses_and_groups_of_one() -> None:
    batch = ObjectiveBatch(
        tokens=torch.tensor([[3], [4], [5]]),
        action_mask=torch.ones(3, 1),
        group_ids=torch.tensor([0, 1, 2]),
        rewards=torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64),
        behavior_logp=torch.full((3, 1), -1.0, dtype=torch.float64),
        logp=torch.full((3, 1), -1.0, dtype=torch.float64, requires_grad=True),
        value_logits=torch.zeros(3, 1, dtype=torch.float64, requires_grad=True),
    )
    actor = pact_objective(batch, "actor")
    # V = 0.5 everywhere: A = R - 0.5 = 0.5, -0.5, 0; rho = 1, w = 1; loss = -mean A
    assert actor.actor_loss.item() == pytest.approx(0.0)
    assert actor.metrics["critic/mean_abs_credit"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    sr = srppo_objective(batch)
    # w = 4 * 0.5^3 = 0.5 on every row
    assert sr.metrics["actor/passk_weight_mean"] == pytest.approx(0.5)
    assert sr.actor_loss.item() == pytest.approx(0.0)


def test_critic_stage_with_every_token_rejected_is_zero_with_graph() -> None:
    b = random_batch(2)
    batch = _batch(b)
    far = ObjectiveBatch(
        **{
            **{f: getattr(batch, f) for f in ("tokens", "action_mask", "group_ids", "rewards")},
            "behavior_logp": batch.behavior_logp,
            "logp": batch.old_logp + 5.0,  # c = e^5 > 6 on every action token
            "old_logp": batch.old_logp,
            "value_logits": batch.value_logits,
        }
    )
    result = pact_objective(far, "critic", ObjectiveConfig(**RANGE))
    assert result.critic_loss.item() == 0.0 and result.critic_loss.requires_grad
    result.critic_loss.backward()
    assert bool((batch.value_logits.grad == 0).all())
    assert result.metrics["critic/is_reject_frac"] == 1.0
    assert math.isnan(result.metrics["critic/is_weight_mean"])


@pytest.mark.parametrize("algorithm", ["pact", "srppo"])
def test_rewards_outside_the_configured_range_are_an_error(algorithm: str) -> None:
    b = random_batch(5, binary_rewards=False)
    batch = _batch(b)
    with pytest.raises(ValueError, match="rewards must lie in"):
        compute_objective(algorithm, batch)  # default range [0, 1]; rewards reach [-2, 2]
    with pytest.raises(ValueError, match="reward_max must be > reward_min"):
        ObjectiveConfig(reward_min=1.0, reward_max=1.0)


def test_pact_whiten_flag_whitens_the_lambda_one_advantages() -> None:
    b = random_batch(6)
    batch = _batch(b, old_logp=False)
    cfg = ObjectiveConfig(pact_whiten=True, **RANGE)
    result = pact_objective(batch, "actor", cfg)
    rewards = torch.tensor(_unit(b), dtype=b.rewards.dtype)
    adv = whiten(pact_advantages(rewards, batch.old_values, b.action_mask), b.action_mask)
    assert result.metrics["actor/adv_mean"] == pytest.approx(0.0, abs=1e-9)
    mask = b.action_mask.tolist()
    want, _ = ref.dis_loss(
        batch.logp.tolist(), b.behavior_logp.tolist(), adv.tolist(), mask, 0.7, 6.0,
        "seq-mean-token-mean",
    )  # fmt: skip
    assert result.actor_loss.item() == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_values_instead_of_logits_work_for_the_pact_actor_stage_only() -> None:
    b = random_batch(1)
    batch = _batch(b, logits=False)
    assert pact_objective(batch, "actor", ObjectiveConfig(**RANGE)).actor_loss is not None
    with pytest.raises(ValueError, match="value_logits"):
        pact_objective(batch, "critic", ObjectiveConfig(**RANGE))
    with pytest.raises(ValueError, match="value_logits"):
        srppo_objective(batch, ObjectiveConfig(**RANGE))


def test_value_logits_set_values_and_old_values_defaults() -> None:
    b = random_batch(3)
    batch = _batch(b)
    torch.testing.assert_close(batch.values, torch.sigmoid(batch.value_logits))
    assert batch.values.requires_grad and not batch.old_values.requires_grad
    torch.testing.assert_close(batch.old_values, torch.sigmoid(b.values))
    frozen = torch.full_like(b.values, 0.25)
    explicit = ObjectiveBatch(
        tokens=b.tokens,
        action_mask=b.action_mask,
        group_ids=b.group_ids,
        rewards=b.rewards,
        behavior_logp=b.behavior_logp,
        logp=b.logp,
        value_logits=b.values,
        old_values=frozen,
    )
    assert explicit.old_values is frozen  # a given V_old is kept (the actor's advantages use it)
    result = pact_objective(explicit, "actor", ObjectiveConfig(**RANGE))
    rewards = torch.tensor(_unit(b), dtype=b.rewards.dtype)
    want = torch.where(b.action_mask, rewards[:, None] - 0.25, 0.0)[b.action_mask].mean()
    assert result.metrics["actor/adv_mean"] == pytest.approx(float(want))
