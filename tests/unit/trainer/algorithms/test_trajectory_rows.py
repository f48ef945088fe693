"""A trajectory with several segments gives several rows; the statistics count trajectories.

Batches are built from real records (two segments for trajectory ``t-a``) by
:func:`trainer.data.build_batch`. Every expected value is worked out by hand in the comments:
group of two trajectories, ``R = (1, 0)``, so ``mu = 0.5`` and the unbiased
``sigma = sqrt(0.5)``. Counting rows instead (``t-a`` twice) gives ``mu = 2/3``,
``sigma = sqrt(1/3)``, other losses and other readiness counts, which each test also checks
by passing no trajectory index (every row its own trajectory, the old behaviour).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tests.support.trajectory_records import record, turn
from trainer.algorithms import (
    ObjectiveBatch,
    ObjectiveConfig,
    compute_objective,
    group_residual_targets,
)
from trainer.data import TrainBatch, build_batch

A = 0.5 / (math.sqrt(0.5) + 1e-6)  # GRPO advantage of t-a (t-b gets -A), Eq. 2 with eps 1e-6


def _two_segment(group: str = "g0"):
    # rows: t-a segment 0 (actions at 0, 1, 3), t-a segment 1 (actions at 0, 1, 2)
    return record(
        "t-a",
        [
            ([5, 6], [turn([], [7, 8], 2), turn([9], [10], 3)]),
            ([5, 11, 12], [turn([], [13, 14, 15], 3)]),
        ],
        reward=1.0,
        group=group,
    )


def _batch(group_b: str = "g0") -> TrainBatch:
    other = record("t-b", [([5, 6, 20], [turn([], [21], 3)])], reward=0.0, group=group_b)
    batch, _ = build_batch([_two_segment(), other], trainer_version=3)
    assert batch.trajectory_index.tolist() == [0, 0, 1]  # rows: t-a, t-a, t-b
    return batch


def _objective_batch(
    batch: TrainBatch, logp: torch.Tensor, values: torch.Tensor | None = None
) -> ObjectiveBatch:
    return batch.objective_batch(logp, values)


def _rows_only(batch: ObjectiveBatch) -> ObjectiveBatch:
    return dataclasses.replace(batch, trajectory_index=None)


def _logp_with_ratio_on_first_segment(batch: TrainBatch, ratio: float) -> torch.Tensor:
    logp = batch.behavior_logp.clone()
    logp[0] += math.log(ratio) * batch.action_mask[0]  # rho = ratio on t-a's first segment
    return logp


def test_grpo_counts_trajectories_in_the_group_and_weights_each_by_its_action_tokens() -> None:
    batch = _batch()
    ob = _objective_batch(batch, _logp_with_ratio_on_first_segment(batch, 1.2))
    result = compute_objective("grpo", ob)
    # t-a: 6 action tokens, rho 1.2 on 3 of them and 1 on 3 -> token mean 1.1 (inside the
    # clip range 1.28); t-b: rho 1. J = (1.1 A - 1.0 A) / 2 trajectories, loss = -J.
    assert float(result.actor_loss.detach()) == pytest.approx(-0.05 * A, rel=1e-5)
    assert result.metrics["batch/trajectories"] == 2.0
    assert result.metrics["batch/rows"] == 3.0
    assert result.metrics["batch/largest_group"] == 2.0
    assert result.metrics["batch/reward_mean"] == pytest.approx(0.5)
    # rows as trajectories: mu 2/3, sigma sqrt(1/3): J = (1.2 a + a - 2 a) / 3, a = (1/3)/sigma
    a = (1 / 3) / (math.sqrt(1 / 3) + 1e-6)
    rows = compute_objective("grpo", _rows_only(ob))
    assert float(rows.actor_loss.detach()) == pytest.approx(-0.2 * a / 3, rel=1e-5)


def test_dis_and_gspo_take_the_trajectory_as_the_sequence() -> None:
    batch = _batch()
    ob = _objective_batch(batch, _logp_with_ratio_on_first_segment(batch, 1.2))
    values = torch.zeros(batch.tokens.shape, requires_grad=True)
    li2sao = compute_objective("li2sao", dataclasses.replace(ob, values=values))
    # DIS keeps rho in (0.7, 6): the same J as PPO clip above
    assert float(li2sao.actor_loss.detach()) == pytest.approx(-0.05 * A, rel=1e-5)
    gspo = compute_objective("gspo", ob, config=ObjectiveConfig(gspo_eps_high=1.0))
    # s_a = exp(mean log rho over t-a's 6 tokens) = sqrt(1.2), s_b = 1
    s_a = math.sqrt(1.2)
    assert gspo.metrics["actor/seq_ratio_abs_dev_mean"] == pytest.approx((s_a - 1) / 2, rel=1e-5)
    assert float(gspo.actor_loss.detach()) == pytest.approx(-(s_a * A - A) / 2, rel=1e-5)


def test_li2sao_picks_gae_when_every_group_holds_one_trajectory() -> None:
    batch = _batch(group_b="g1")  # t-a (two rows) alone in g0, t-b alone in g1
    values = torch.zeros(batch.tokens.shape, requires_grad=True)
    ob = _objective_batch(batch, batch.behavior_logp.clone(), values)
    result = compute_objective("li2sao", ob, phase="switched")
    assert result.estimator == "gae"
    assert result.metrics["batch/largest_group"] == 1.0
    assert compute_objective("li2sao", _rows_only(ob), phase="switched").estimator == "grpo"


def _values_with_terminals(batch: TrainBatch) -> torch.Tensor:
    values = torch.zeros(batch.tokens.shape)
    values[0, 3] = -0.4  # t-a segment 0's last action: not t-a's terminal state
    values[1, 2] = 0.3  # t-a segment 1's last action: t-a's terminal value
    values[2, 0] = 0.1  # t-b's terminal value
    return values.requires_grad_()


def test_bootstrap_readiness_and_ranking_count_trajectories() -> None:
    batch = _batch()
    ob = _objective_batch(batch, batch.behavior_logp.clone(), _values_with_terminals(batch))
    result = compute_objective("li2sao", ob, phase="bootstrap")
    stats = result.readiness
    assert stats is not None
    # Z = R - mu = (0.5, -0.5), V = (0.3, 0.1): one pair, ordered correctly
    assert (stats.count, stats.pairs, stats.correct_pairs) == (2, 1, 1)
    # residual Z - V = (0.2, -0.6): population variances 0.16 and 0.25
    assert stats.explained_variance == pytest.approx(1 - 0.16 / 0.25)
    assert result.metrics["critic/rank_loss"] == pytest.approx(0.0)  # relu(0.1 - 0.3 + 0.1)
    rows = compute_objective("li2sao", _rows_only(ob), phase="bootstrap").readiness
    assert rows is not None and (rows.count, rows.pairs, rows.correct_pairs) == (3, 2, 1)


def test_centred_critic_targets_use_the_trajectory_mean() -> None:
    returns = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])  # G = R on every token
    rewards = torch.tensor([1.0, 1.0, 0.0])
    groups = torch.zeros(3, dtype=torch.long)
    index = torch.tensor([0, 0, 1])
    targets, keep = group_residual_targets(returns, rewards, groups, trajectory_index=index)
    assert targets.tolist() == [[0.5, 0.5], [0.5, 0.5], [-0.5, -0.5]]  # mu = (1 + 0) / 2
    assert keep.tolist() == [True, True, True]
    by_rows, _ = group_residual_targets(returns, rewards, groups)
    assert by_rows[2, 0] == pytest.approx(-2 / 3)


@pytest.mark.parametrize(
    ("index", "rewards", "message"),
    [
        (torch.tensor([0, 0, 1]), torch.tensor([1.0, 0.0, 0.0]), "share its reward"),
        (torch.tensor([0.0, 0.0, 1.0]), torch.tensor([1.0, 1.0, 0.0]), "integer"),
        (torch.tensor([0, 1]), torch.tensor([1.0, 1.0, 0.0]), "mismatch"),
        (torch.tensor([0, -1, 1]), torch.tensor([1.0, 1.0, 0.0]), "non-negative"),
    ],
)
def test_a_bad_trajectory_index_is_a_named_error(index, rewards, message) -> None:
    batch = _batch()
    with pytest.raises(ValueError, match=message):
        ObjectiveBatch(
            tokens=batch.tokens,
            action_mask=batch.action_mask,
            group_ids=batch.group_ids,
            rewards=rewards,
            behavior_logp=batch.behavior_logp,
            logp=batch.behavior_logp.clone(),
            trajectory_index=index,
        )


def test_rows_of_one_trajectory_must_share_the_group() -> None:
    batch = _batch()
    with pytest.raises(ValueError, match="share its group id"):
        ObjectiveBatch(
            tokens=batch.tokens,
            action_mask=batch.action_mask,
            group_ids=torch.tensor([0, 1, 1]),
            rewards=batch.rewards,
            behavior_logp=batch.behavior_logp,
            logp=batch.behavior_logp.clone(),
            trajectory_index=batch.trajectory_index,
        )
