"""Opening and closing a task's trajectory record at the adapter, shared by every runner.

Both the sandbox runner (:mod:`sandbox_worker.sandbox_runner`) and the toy runner
(:mod:`sandbox_worker.toy.runner`) open the record with the task's identifiers before the first
LLM call and close it with the :class:`Outcome` at the end; what the adapter *kept* has the last
word (an abort the adapter recorded itself is never overwritten by a score), and a close that
cannot be confirmed makes the run aborted (an unconfirmed record is never trained on).
"""

from __future__ import annotations

from typing import Any

from sandbox_worker.adapter_client import (
    AdapterError,
    OpenReplyLostError,
    TrajectoryExistsError,
    TrajectoryRecords,
)
from sandbox_worker.outcomes import aborted, with_counts
from services.protocol.tasks import RolloutTask
from services.protocol.trajectory import Outcome, OutcomeStatus, TrajectoryMeta


class OpenFailedError(Exception):
    """The record could not be opened; ``opened`` says whether it exists anyway (ours: it must
    be closed as aborted like any other failed run)."""

    def __init__(self, reason: str, *, opened: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.opened = opened


def trajectory_meta(task: RolloutTask, node: str, **extra: Any) -> TrajectoryMeta:
    """The record's identifiers: task, batch, group, instance; job, attempt, sample, policy
    version, node and task kind in ``extra``."""
    return TrajectoryMeta(
        trajectory_id=task.trajectory_id,
        task_id=task.task_id,
        batch_id=task.batch_id,
        group_id=task.group_id,
        instance_id=task.instance_id,
        extra={
            "job_id": task.job_id,
            "attempt": task.attempt,
            "sample_index": task.sample_index,
            "policy_version": task.policy_version,
            "node": node,
            "kind": task.kind,
            **extra,
        },
    )


def open_record(adapter: TrajectoryRecords, meta: TrajectoryMeta) -> str | None:
    """Open the record and return its trajectory token; :class:`OpenFailedError` otherwise."""
    try:
        return adapter.open(meta)
    except OpenReplyLostError as exc:
        raise OpenFailedError(f"LLM endpoint: {exc}", opened=True) from exc
    except TrajectoryExistsError as exc:
        # A previous run of this very attempt left a record; its tokens are not ours.
        raise OpenFailedError(f"{exc}; not reusing it", opened=False) from exc
    except AdapterError as exc:
        raise OpenFailedError(
            f"LLM endpoint: cannot open the trajectory: {exc}", opened=False
        ) from exc


def close_record(adapter: TrajectoryRecords, trajectory_id: str, outcome: Outcome) -> Outcome:
    """Close the record with ``outcome``; returns the outcome to report (see module doc)."""
    try:
        result = adapter.close(trajectory_id, outcome)
    except AdapterError as exc:
        if outcome.status is OutcomeStatus.ABORTED:
            return outcome
        return aborted(
            f"could not record the outcome at the adapter: {exc}",
            patch=outcome.patch,
            test_report=outcome.test_report,
        )
    kept = result.outcome
    adapter_aborted = kept is not None and kept.status is OutcomeStatus.ABORTED
    if adapter_aborted and outcome.status is not OutcomeStatus.ABORTED:
        assert kept is not None
        outcome = aborted(
            f"adapter: {kept.abort_reason}", patch=outcome.patch, test_report=outcome.test_report
        )
    return with_counts(outcome, result.n_turns, result.n_tokens)
