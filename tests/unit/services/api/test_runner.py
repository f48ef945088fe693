"""The rollout job runner's pure parts: a task result as a result row, the metrics summary."""

from __future__ import annotations

import pytest

from services.api.runner import Tally, final_state, result_row
from services.api.schemas import JobState, RolloutSpec, TrajectoryCounts
from services.protocol.tasks import TaskResult
from services.protocol.trajectory import Outcome, OutcomeStatus


def result(
    task_id: str, status: OutcomeStatus, reward: float | None, reason: str = "lost"
) -> TaskResult:
    outcome = Outcome(status=status, reward=reward,
                      abort_reason=reason if reward is None else None, patch="diff")  # fmt: skip
    return TaskResult(task_id=task_id, batch_id="job-1", trajectory_id=f"{task_id}.a1",
                      node="n1", attempt=1, outcome=outcome)  # fmt: skip


def test_a_row_names_its_instance_and_sample() -> None:
    spec = RolloutSpec(instance_ids=["first", "second"], n_samples=3)
    row = result_row(result("job-1:1:2", OutcomeStatus.COMPLETED, 1.0), spec)
    assert (row["instance_id"], row["sample_index"]) == ("second", 2)
    assert (row["trajectory_id"], row["reward"]) == ("job-1:1:2.a1", 1.0)
    assert row["status"] == "completed"
    assert row["patch"] == "diff"


def test_tally_counts_statuses_and_leaves_aborted_out_of_rewards() -> None:
    spec = RolloutSpec(instance_ids=["a", "b"], n_samples=2)
    tally = Tally()
    for task, status, reward in [
        ("job-1:0:0", OutcomeStatus.COMPLETED, 1.0),
        ("job-1:0:1", OutcomeStatus.TIMEOUT, 0.0),
        ("job-1:1:0", OutcomeStatus.COMPLETED, 0.0),
        ("job-1:1:1", OutcomeStatus.ABORTED, None),
    ]:
        tally.add(result_row(result(task, status, reward), spec))
    summary = tally.summary()
    assert {k: summary[k] for k in ("n_aborted", "n_completed", "n_timeout")} == {
        "n_aborted": 1.0,
        "n_completed": 2.0,
        "n_timeout": 1.0,
    }
    assert (summary["mean_reward"], summary["resolved_rate"]) == (1 / 3, 1 / 3)
    # the job's record shows how they ended: a reward of 0 is graded, only the abort failed
    counts = TrajectoryCounts.from_metrics(summary)
    assert counts == TrajectoryCounts(total=4, graded=3, resolved=1, aborted=1)
    assert "mean_reward" not in Tally().summary()


def tally_of(*ends: tuple[OutcomeStatus, float | None, str]) -> Tally:
    spec = RolloutSpec(instance_ids=["a"], n_samples=len(ends))
    tally = Tally()
    for sample, (status, reward, reason) in enumerate(ends):
        tally.add(result_row(result(f"job-1:0:{sample}", status, reward, reason), spec))
    return tally


UNKNOWN = "unknown instance 'a': not in the worker's task files (set worker.rollout.instances)"
ABORT = (OutcomeStatus.ABORTED, None, UNKNOWN)


def test_a_job_whose_every_trajectory_aborted_failed_and_says_why() -> None:
    state, message = final_state(tally_of(ABORT, ABORT, ABORT), cancelled=False)
    assert state is JobState.FAILED
    assert "all 3 trajectories failed" in message
    assert f"3x {UNKNOWN}" in message  # the reason names the fix


def test_a_partial_job_succeeded_with_the_counts() -> None:
    tally = tally_of(
        (OutcomeStatus.COMPLETED, 1.0, ""),
        (OutcomeStatus.COMPLETED, 0.0, ""),
        ABORT,
        (OutcomeStatus.ABORTED, None, "sandbox lost"),
    )
    state, message = final_state(tally, cancelled=False)
    assert state is JobState.SUCCEEDED
    assert "4 trajectories: 2 graded (1 resolved), 2 aborted" in message
    assert UNKNOWN in message and "sandbox lost" in message


@pytest.mark.parametrize("status", [OutcomeStatus.COMPLETED, OutcomeStatus.ERROR,
                                    OutcomeStatus.TIMEOUT])  # fmt: skip
def test_a_reward_of_zero_is_a_normal_result_not_a_failure(status: OutcomeStatus) -> None:
    """Wrong answers, agent errors and timeouts are graded (the policy's own results)."""
    state, message = final_state(tally_of((status, 0.0, ""), (status, 0.0, "")), cancelled=False)
    assert state is JobState.SUCCEEDED
    assert "2 trajectories: 2 graded (0 resolved)" in message and "aborted" not in message


def test_cancelled_and_empty_jobs() -> None:
    assert final_state(tally_of(ABORT), cancelled=True)[0] is JobState.CANCELLED
    assert final_state(Tally(), cancelled=False)[0] is JobState.FAILED
