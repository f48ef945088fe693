"""Bad input gets a ValueError that names the problem, at every public function."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from trainer.algorithms import (
    ObjectiveBatch,
    ObjectiveConfig,
    ReadinessStats,
    adaptive_lambda,
    bce_value_loss,
    clipped_value_loss,
    compute_objective,
    dis_policy_loss,
    divergence_mask,
    dynamic_sampling_filter,
    first_action_values,
    group_residual_targets,
    grpo_advantages,
    gspo_policy_loss,
    li2sao_objective,
    normalize_rewards,
    pact_advantages,
    pact_credit,
    pact_critic_targets,
    pact_is_weights,
    pact_objective,
    ppo_clip_policy_loss,
    readiness_statistics,
    skip_observation_gae,
    srppo_advantages,
    srppo_passk_weights,
    terminal_ranking_loss,
    tis_weights,
    whiten,
)

N, T = 3, 5
MASK = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
TOKENS = torch.tensor([[4, 5, 6, 7, -1], [4, 5, 1, -1, -1], [9, 2, -1, -1, -1]])
REWARDS = torch.tensor([1.0, 0.0, 1.0])
GROUPS = torch.tensor([0, 0, 1])


def _floats() -> torch.Tensor:
    return torch.zeros(N, T)


def _nan() -> torch.Tensor:
    x = _floats()
    x[1, 2] = float("nan")
    return x


def _inf() -> torch.Tensor:
    x = _floats()
    x[0, 0] = float("inf")
    return x


EMPTY_ROW = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]])

Case = tuple[str, Callable[[], object], str]
CASES: list[Case] = [
    # grpo_advantages
    ("grpo 2-D rewards", lambda: grpo_advantages(_floats(), GROUPS), "1-D"),
    (
        "grpo NaN rewards",
        lambda: grpo_advantages(torch.tensor([1.0, float("nan"), 0]), GROUPS),
        "NaN",
    ),
    ("grpo negative id", lambda: grpo_advantages(REWARDS, torch.tensor([0, -1, 1])), "negative"),
    ("grpo id length", lambda: grpo_advantages(REWARDS, torch.tensor([0, 1])), "mismatch"),
    ("grpo float ids", lambda: grpo_advantages(REWARDS, torch.tensor([0.0, 1, 1])), "integer"),
    ("grpo int rewards", lambda: grpo_advantages(torch.tensor([1, 0, 1]), GROUPS), "floating"),
    # adaptive_lambda
    ("lambda empty row", lambda: adaptive_lambda(EMPTY_ROW), "no action token"),
    ("lambda non 0/1 mask", lambda: adaptive_lambda(MASK * 2), "0 and 1"),
    ("lambda alpha", lambda: adaptive_lambda(MASK, alpha=0.0), "alpha"),
    # GAE
    ("gae shape", lambda: skip_observation_gae(_floats(), torch.zeros(N, T + 1), MASK), "mismatch"),
    ("gae NaN values", lambda: skip_observation_gae(_floats(), _nan(), MASK), "NaN"),
    ("gae inf rewards", lambda: skip_observation_gae(_inf(), _floats(), MASK), "inf"),
    ("gae empty row", lambda: skip_observation_gae(_floats(), _floats(), EMPTY_ROW), "no action"),
    (
        "gae reward on obs",
        lambda: skip_observation_gae(MASK.logical_not().float(), _floats(), MASK),
        "outside action",
    ),
    ("gae lambda range", lambda: skip_observation_gae(_floats(), _floats(), MASK, lam=1.5), "lam"),
    (
        "gae lambda rows",
        lambda: skip_observation_gae(_floats(), _floats(), MASK, lam=torch.ones(2)),
        "mismatch",
    ),
    ("gae gamma", lambda: skip_observation_gae(_floats(), _floats(), MASK, gamma=-0.1), "gamma"),
    ("gae 1-D values", lambda: skip_observation_gae(torch.zeros(T), torch.zeros(T), MASK), "2-D"),
    ("gae outcome rows", lambda: skip_observation_gae(torch.ones(2), _floats(), MASK), "mismatch"),
    ("gae 3-D rewards", lambda: skip_observation_gae(torch.zeros(N, T, 1), _floats(), MASK), "2-D"),
    # whiten
    ("whiten empty mask", lambda: whiten(_floats(), torch.zeros(N, T)), "no entry"),
    ("whiten NaN", lambda: whiten(_nan(), MASK), "NaN"),
    # policy losses
    ("dis shape", lambda: dis_policy_loss(_floats(), torch.zeros(N, 4), REWARDS, MASK), "mismatch"),
    ("dis NaN logp", lambda: dis_policy_loss(_nan(), _floats(), REWARDS, MASK), "NaN"),
    (
        "dis empty row",
        lambda: dis_policy_loss(_floats(), _floats(), REWARDS, EMPTY_ROW),
        "no action",
    ),
    (
        "dis adv rows",
        lambda: dis_policy_loss(_floats(), _floats(), torch.ones(2), MASK),
        "mismatch",
    ),
    (
        "dis interval",
        lambda: dis_policy_loss(_floats(), _floats(), REWARDS, MASK, 2.0, 1.0),
        "low < high",
    ),
    (
        "dis aggregation",
        lambda: dis_policy_loss(_floats(), _floats(), REWARDS, MASK, aggregation="sum"),
        "aggregation",
    ),  # type: ignore[arg-type]
    ("ppo inf behaviour", lambda: ppo_clip_policy_loss(_floats(), _inf(), REWARDS, MASK), "inf"),
    (
        "gspo empty row",
        lambda: gspo_policy_loss(_floats(), _floats(), REWARDS, EMPTY_ROW),
        "no action",
    ),
    # critic
    ("targets 2-D rewards", lambda: group_residual_targets(_floats(), _floats(), GROUPS), "1-D"),
    (
        "targets rows",
        lambda: group_residual_targets(torch.zeros(2, T), REWARDS, GROUPS),
        "mismatch",
    ),
    (
        "value loss shape",
        lambda: clipped_value_loss(_floats(), torch.zeros(N, 4), _floats(), MASK),
        "mismatch",
    ),
    ("value loss NaN", lambda: clipped_value_loss(_floats(), _floats(), _nan(), MASK), "NaN"),
    (
        "ranking negative id",
        lambda: terminal_ranking_loss(REWARDS, REWARDS, torch.tensor([0, 0, -3])),
        "negative",
    ),
    ("ranking 2-D values", lambda: terminal_ranking_loss(_floats(), REWARDS, GROUPS), "1-D"),
    # divergence
    (
        "divergence pad inside",
        lambda: divergence_mask(torch.tensor([[4, -1, 5, 6, -1]] * 3), MASK, REWARDS, GROUPS),
        "suffix",
    ),
    (
        "divergence action on pad",
        lambda: divergence_mask(TOKENS.clamp(max=3) * 0 - 1, MASK, REWARDS, GROUPS),
        "padding",
    ),
    ("divergence token < -1", lambda: divergence_mask(TOKENS - 5, MASK, REWARDS, GROUPS), "-1"),
    (
        "divergence rewards rows",
        lambda: divergence_mask(TOKENS, MASK, REWARDS[:2], GROUPS),
        "mismatch",
    ),
    (
        "divergence empty row",
        lambda: divergence_mask(TOKENS, EMPTY_ROW, REWARDS, GROUPS),
        "no action",
    ),
    # PACT / SR-PPO primitives
    ("normalize 2-D rewards", lambda: normalize_rewards(_floats()), "1-D"),
    ("normalize NaN", lambda: normalize_rewards(torch.tensor([0.5, float("nan")])), "NaN"),
    ("normalize above max", lambda: normalize_rewards(torch.tensor([0.5, 1.01])), "outside"),
    ("normalize empty range", lambda: normalize_rewards(REWARDS, 1.0, 0.0), "reward_max"),
    ("normalize NaN bound", lambda: normalize_rewards(REWARDS, float("nan")), "finite"),
    ("first value shape", lambda: first_action_values(torch.zeros(N, T + 1), MASK), "mismatch"),
    ("first value empty row", lambda: first_action_values(_floats(), EMPTY_ROW), "no action"),
    ("pact adv empty row", lambda: pact_advantages(REWARDS, _floats(), EMPTY_ROW), "no action"),
    ("pact adv NaN values", lambda: pact_advantages(REWARDS, _nan(), MASK), "NaN"),
    ("credit empty row", lambda: pact_credit(REWARDS, _floats(), EMPTY_ROW), "no action"),
    ("credit rows", lambda: pact_credit(torch.ones(2), _floats(), MASK), "mismatch"),
    ("credit gamma", lambda: pact_credit(REWARDS, _floats(), MASK, gamma=1.5), "gamma"),
    ("tis shape", lambda: tis_weights(_floats(), torch.zeros(N, 4), MASK), "mismatch"),
    ("tis range", lambda: tis_weights(_floats(), _floats(), MASK, 2.0, 2.0), "low must be <"),
    ("tis negative low", lambda: tis_weights(_floats(), _floats(), MASK, -1.0), "low"),
    ("tis inf", lambda: tis_weights(_inf(), _floats(), MASK), "inf"),
    (
        "targets mode",
        lambda: pact_critic_targets(REWARDS, _floats(), _floats(), MASK, "sequence"),  # type: ignore[arg-type]
        "mode",
    ),
    (
        "targets reward above 1",
        lambda: pact_critic_targets(torch.tensor([1.0, 2.0, 0.0]), _floats(), _floats(), MASK),
        "normalise",
    ),
    (
        "targets reward rows",
        lambda: pact_critic_targets(torch.ones(2), _floats(), _floats(), MASK),
        "mismatch",
    ),
    (
        "targets accept range",
        lambda: pact_critic_targets(REWARDS, _floats(), _floats(), MASK, "token", 6.0, 1.0),
        "accept_low must be <",
    ),
    ("targets NaN new", lambda: pact_critic_targets(REWARDS, _nan(), _floats(), MASK), "NaN"),
    (
        "is weights empty row",
        lambda: pact_is_weights(_floats(), _floats(), EMPTY_ROW),
        "no action",
    ),
    ("is weights mode", lambda: pact_is_weights(_floats(), _floats(), MASK, "x"), "mode"),  # type: ignore[arg-type]
    ("bce shape", lambda: bce_value_loss(_floats(), torch.zeros(N, 4), MASK), "mismatch"),
    ("bce NaN targets", lambda: bce_value_loss(_floats(), _nan(), MASK), "NaN"),
    ("bce int logits", lambda: bce_value_loss(MASK, _floats(), MASK), "floating"),
    ("bce mask values", lambda: bce_value_loss(_floats(), _floats(), MASK * 3), "0 and 1"),
    ("bce no terms", lambda: bce_value_loss(_floats(), _floats(), MASK, 0.0, 0.0), "both 0"),
    ("bce negative coef", lambda: bce_value_loss(_floats(), _floats(), MASK, -1.0), "bce_coef"),
    ("passk k below 1", lambda: srppo_passk_weights(REWARDS, 0.5), "k must be"),
    ("passk k NaN", lambda: srppo_passk_weights(REWARDS, float("nan")), "k must be"),
    ("passk k bool", lambda: srppo_passk_weights(REWARDS, True), "k must be"),  # type: ignore[arg-type]
    ("passk 2-D", lambda: srppo_passk_weights(_floats()), "1-D"),
    (
        "srppo reward below 0",
        lambda: srppo_advantages(torch.tensor([-0.5, 0.0, 1.0]), _floats(), MASK),
        "normalise",
    ),
    ("srppo empty row", lambda: srppo_advantages(REWARDS, _floats(), EMPTY_ROW), "no action"),
    ("srppo 2-D rewards", lambda: srppo_advantages(_floats(), _floats(), MASK), "1-D"),
    # readiness / sampling
    (
        "readiness NaN",
        lambda: readiness_statistics(torch.tensor([0.0, float("nan"), 1]), REWARDS, GROUPS),
        "NaN",
    ),
    ("sampling target", lambda: dynamic_sampling_filter(REWARDS, GROUPS, -1), "target_groups"),
    (
        "sampling negative id",
        lambda: dynamic_sampling_filter(REWARDS, torch.tensor([-1, 0, 0]), 2),
        "negative",
    ),
]


@pytest.mark.parametrize(("name", "call", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_named_value_error(name: str, call: Callable[[], object], message: str):
    with pytest.raises(ValueError, match=message):
        call()


def _batch(**overrides: object) -> ObjectiveBatch:
    fields: dict[str, object] = {
        "tokens": TOKENS,
        "action_mask": MASK,
        "group_ids": GROUPS,
        "rewards": REWARDS,
        "behavior_logp": _floats(),
        "logp": _floats(),
        "values": _floats(),
    }
    fields.update(overrides)
    return ObjectiveBatch(**fields)  # type: ignore[arg-type]


BATCH_CASES: list[Case] = [
    ("batch 2-D rewards", lambda: _batch(rewards=_floats()), "1-D"),
    ("batch NaN logp", lambda: _batch(logp=_nan()), "NaN"),
    ("batch inf values", lambda: _batch(values=_inf()), "inf"),
    ("batch shape", lambda: _batch(behavior_logp=torch.zeros(N, T + 2)), "mismatch"),
    ("batch empty row", lambda: _batch(action_mask=EMPTY_ROW), "no action"),
    ("batch negative id", lambda: _batch(group_ids=torch.tensor([0, -2, 1])), "negative"),
    (
        "batch rows",
        lambda: _batch(rewards=torch.ones(2), group_ids=torch.zeros(2, dtype=torch.long)),
        "mismatch",
    ),
    (
        "batch versions alone",
        lambda: _batch(token_versions=torch.zeros(N, T, dtype=torch.long)),
        "together",
    ),
    ("batch old values alone", lambda: _batch(values=None, old_values=_floats()), "old_values"),
    ("unknown algorithm", lambda: compute_objective("ppo", _batch()), "unknown algorithm"),  # type: ignore[arg-type]
    ("critic needed", lambda: compute_objective("lisao", _batch(values=None)), "values"),
    ("bad phase", lambda: li2sao_objective(_batch(), "warmup"), "phase"),  # type: ignore[arg-type]
    ("bad config", lambda: ObjectiveConfig(dis_low=7.0), "dis_low"),
    ("bad gamma", lambda: ObjectiveConfig(gamma=2.0), "gamma"),
    # PACT / SR-PPO batch fields, stages and config
    (
        "values and logits",
        lambda: _batch(value_logits=_floats()),
        "values or value_logits, not both",
    ),
    ("logits NaN", lambda: _batch(values=None, value_logits=_nan()), "value_logits contains NaN"),
    (
        "logits integer",
        lambda: _batch(values=None, value_logits=MASK),
        "value_logits must have a floating",
    ),
    ("old_logp shape", lambda: _batch(old_logp=torch.zeros(N, T + 1)), "old_logp"),
    ("old_logp inf", lambda: _batch(old_logp=_inf()), "old_logp contains NaN or inf"),
    (
        "critic stage elsewhere",
        lambda: compute_objective("li2sao", _batch(), stage="critic"),
        "only for pact",
    ),
    ("bad stage", lambda: compute_objective("pact", _batch(), stage="both"), "stage"),  # type: ignore[arg-type]
    ("bad pact stage", lambda: pact_objective(_batch(), "critics"), "stage"),  # type: ignore[arg-type]
    ("pact critic values", lambda: compute_objective("pact", _batch(), stage="critic"), "logits"),
    ("srppo values", lambda: compute_objective("srppo", _batch()), "value_logits"),
    ("pact no critic", lambda: compute_objective("pact", _batch(values=None)), "values"),
    ("config policy loss", lambda: ObjectiveConfig(pact_policy_loss="gspo"), "pact_policy_loss"),  # type: ignore[arg-type]
    ("config IS mode", lambda: ObjectiveConfig(pact_critic_is="seq"), "pact_critic_is"),  # type: ignore[arg-type]
    ("config tis range", lambda: ObjectiveConfig(tis_low=2.0), "tis_low must be <"),
    ("config IS range", lambda: ObjectiveConfig(pact_is_high=-1.0), "pact_is_high"),
    ("config k", lambda: ObjectiveConfig(srppo_k=0.5), "srppo_k"),
    ("config coefs", lambda: ObjectiveConfig(srppo_bce_coef=0, srppo_mse_coef=0), "both 0"),
    ("config reward bound", lambda: ObjectiveConfig(reward_max=float("inf")), "reward_max"),
    ("config whiten", lambda: ObjectiveConfig(pact_whiten=1), "pact_whiten"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("name", "call", "message"), BATCH_CASES, ids=[c[0] for c in BATCH_CASES])
def test_bad_batch_raises_named_value_error(name: str, call: Callable[[], object], message: str):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_valid_batch_used_above_is_accepted() -> None:
    """The error cases above differ from a batch that works in one respect only.

    Worked by hand: groups {0, 1} (R = 1, 0) and {2} (R = 1); logp = behaviour, V = 0.
    GRPO (largest group 2): A = +-0.5 / (sqrt(0.5) + 1e-6) and 0 for the group of one, so
    with rho = 1 the DIS objective is mean_i A_i = 0. Critic: G = R on every action token;
    targets G - mu_g = +-0.5 in group 0 (group 1 has equal rewards: dropped); rows 0 and 1
    first differ at t = 2, so the critic mask keeps row 0's action at t = 3 and row 1's at
    t = 2: L_res = (0.25 + 0.25) / 2; one pair (0, 1): L_rank = relu(0.1 - 0 + 0) = 0.1;
    L = 0.25 + 0.1 * 0.1. Readiness: Z = (0.5, -0.5), V = 0: e = 1 - Var(Z) / Var(Z) = 0,
    the one pair is a tie (counts as wrong).
    """
    result = compute_objective("li2sao", _batch())
    a = 0.5 / (0.5**0.5 + 1e-6)
    assert result.estimator == "grpo"
    assert result.actor_loss is not None and float(result.actor_loss) == pytest.approx(
        0.0, abs=1e-6
    )
    assert result.critic_loss is not None and float(result.critic_loss) == pytest.approx(0.26)
    assert result.metrics["critic/residual_loss"] == pytest.approx(0.25)
    assert result.metrics["critic/rank_loss"] == pytest.approx(0.1)
    assert result.metrics["critic/mask_frac"] == pytest.approx(2 / 6)  # of 6 action tokens
    assert result.metrics["critic/kept_frac"] == pytest.approx(2 / 3)
    assert result.metrics["actor/adv_mean"] == pytest.approx((3 * a - 2 * a) / 6)
    assert result.readiness == ReadinessStats(
        count=2, sum_z=0.0, sumsq_z=0.5, sum_residual=0.0, sumsq_residual=0.5, pairs=1
    )
    assert result.readiness.explained_variance == pytest.approx(0.0)
    assert result.readiness.ranking_accuracy == 0.0
