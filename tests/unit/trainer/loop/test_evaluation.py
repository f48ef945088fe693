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
