"""Task results and trajectory records of the training loop's tests, from the real protocol
types: a result as the manager reports it, a record as the adapter writes it to the store."""

from __future__ import annotations

import asyncio

from services.protocol import Outcome, OutcomeStatus, TaskResult, TrajectoryMeta, TrajectoryRecord
from services.store.trajectories import TrajectoryStore
from tests.support.trajectory_records import record, turn


def result(
    batch_id: str, prompt: int, sample: int = 0, reward: float = 1.0, *, aborted: bool = False
) -> TaskResult:
    """The result of task ``<batch_id>:<prompt>:<sample>`` (attempt 1)."""
    task_id = f"{batch_id}:{prompt}:{sample}"
    if aborted:
        outcome = Outcome(status=OutcomeStatus.ABORTED, abort_reason="sandbox could not start")
    else:
        outcome = Outcome(status=OutcomeStatus.COMPLETED, reward=reward)
    return TaskResult(
        task_id=task_id,
        batch_id=batch_id,
        trajectory_id=f"{task_id}.a1",
        node="n1",
        attempt=1,
        outcome=outcome,
    )


def record_of(
    res: TaskResult, versions: tuple[int, ...] = (0,), tokens: int = 3
) -> TrajectoryRecord:
    """A two-turn-shaped record for ``res``: one turn per version, ``tokens`` outputs each."""
    turns = [
        turn([7, 8] if n else [], [10 + (n + i) % 20 for i in range(tokens)], version)
        for n, version in enumerate(versions)
    ]
    rec = record(
        res.trajectory_id, [([1, 2, 3], turns)], res.outcome.reward, res.task_id.rsplit(":", 1)[0]
    )
    rec.meta = TrajectoryMeta(
        trajectory_id=res.trajectory_id,
        task_id=res.task_id,
        batch_id=res.batch_id,
        group_id=res.task_id.rsplit(":", 1)[0],
    )
    return rec


def write_records(redis_url: str, records: list[TrajectoryRecord], prefix: str = "swerl:") -> None:
    """Write ``records`` into the trajectory store as the adapter does (open, append, close)."""

    async def _write() -> None:
        store = TrajectoryStore.from_url(redis_url, prefix)
        try:
            for rec in records:
                await store.open(rec.meta)
                await store.append(rec.meta.trajectory_id, rec.to_entries(), {"turns": rec.n_turns})
                await store.close(rec.meta.trajectory_id, rec.outcome)
        finally:
            await store.close_connection()

    asyncio.run(_write())


def records_for_run(
    run_id: str, requests: int, prompts: int, samples: int
) -> list[TrajectoryRecord]:
    """A two-turn record (version 0) for attempt 1 of every task the loop's first ``requests``
    requests can have (``<run_id>-r<seq>:<prompt>:<sample>``); rewards alternate by sample."""
    return [
        record_of(result(f"{run_id}-r{seq:05d}", p, s, reward=float(s % 2)), (0, 0))
        for seq in range(requests)
        for p in range(prompts)
        for s in range(samples)
    ]
