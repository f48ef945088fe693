"""The rollout job runner's pure parts: a task result as a result row, the metrics summary."""

from __future__ import annotations

from services.api.runner import Tally, result_row
from services.api.schemas import RolloutSpec
from services.protocol.tasks import TaskResult
from services.protocol.trajectory import Outcome, OutcomeStatus


def result(task_id: str, status: OutcomeStatus, reward: float | None) -> TaskResult:
    outcome = Outcome(status=status, reward=reward,
                      abort_reason="lost" if reward is None else None, patch="diff")  # fmt: skip
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
    assert tally.summary() == {
        "n_aborted": 1.0,
        "n_completed": 2.0,
        "n_timeout": 1.0,
        "mean_reward": 1 / 3,
        "resolved_rate": 1 / 3,
    }
    assert Tally().summary() == {}
