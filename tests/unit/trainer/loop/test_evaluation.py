"""The held-out evaluation's scores: aborted trajectories never scored, pass@n per instance."""

from __future__ import annotations

import math

from services.protocol import Outcome, OutcomeStatus, TaskResult
from trainer.loop.evaluation import eval_scores


def result(task: str, reward: float | None, status: OutcomeStatus = OutcomeStatus.COMPLETED):
    outcome = (
        Outcome(status=status, abort_reason="sandbox died")
        if status is OutcomeStatus.ABORTED
        else Outcome(status=status, reward=reward)
    )
    return TaskResult(task_id=task, batch_id="b", trajectory_id=f"{task}.a1", node="n",
                      attempt=1, outcome=outcome)  # fmt: skip


def test_scores_count_trainable_outcomes_and_solved_instances() -> None:
    instance_of = {"t0": "i0", "t1": "i0", "t2": "i1", "t3": "i1", "t4": "i2", "t5": "i2"}
    results = [
        result("t0", 0.0), result("t1", 1.0),  # i0 solved by one of its two samples
        result("t2", 0.0), result("t3", 0.0, OutcomeStatus.TIMEOUT),  # i1 unsolved
        result("t4", None, OutcomeStatus.ABORTED), result("t5", None, OutcomeStatus.ABORTED),
    ]  # fmt: skip
    scores = eval_scores(results, instance_of)
    assert scores["eval/reward_mean"] == 0.25  # 1 of the 4 scored trajectories
    assert scores["eval/pass_at_n"] == 0.5  # i0 of i0, i1: i2 (all aborted) is not scored
    assert (scores["eval/trajectories"], scores["eval/aborted"]) == (4.0, 2.0)


def test_an_all_aborted_evaluation_has_no_score_rather_than_zero() -> None:
    scores = eval_scores([result("t0", None, OutcomeStatus.ABORTED)], {"t0": "i0"})
    assert math.isnan(scores["eval/reward_mean"]) and math.isnan(scores["eval/pass_at_n"])
    assert scores["eval/aborted"] == 1.0


def test_the_standard_error_is_the_binomial_one_over_the_scored_samples() -> None:
    results = [result(f"t{i}", float(i < 30)) for i in range(120)]  # 30 of 120 solved
    results.append(result("t999", None, OutcomeStatus.ABORTED))  # not a sample
    scores = eval_scores(results, {r.task_id: r.task_id for r in results})
    assert scores["eval/reward_mean"] == 0.25
    assert scores["eval/reward_se"] == math.sqrt(0.25 * 0.75 / 120)
    shifted = eval_scores(results[:4], {r.task_id: r.task_id for r in results}, "eval/shifted/")
    assert set(shifted) == {
        "eval/shifted/reward_mean", "eval/shifted/reward_se", "eval/shifted/pass_at_n",
        "eval/shifted/trajectories", "eval/shifted/aborted",
    }  # fmt: skip
    assert shifted["eval/shifted/reward_mean"] == 1.0 and shifted["eval/shifted/reward_se"] == 0
