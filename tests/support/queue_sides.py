"""The three sides of the queue over one Redis client, and the steps the queue tests drive them
with (submit, heartbeat, read as a worker, build a result), step by step and without processes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

from services.manager.client import tasks_for_request
from services.protocol import RolloutRequest, TaskResult
from services.protocol.trajectory import Outcome, OutcomeStatus
from services.queue.config import QueueConfig
from services.queue.connection import connect
from services.queue.dispatcher import DispatcherQueue
from services.queue.entries import decode_task_entry
from services.queue.keys import Keys
from services.queue.submitter import SubmitterQueue
from services.queue.worker import WorkerQueue
from services.store.trajectories import TrajectoryKeys

NODE = "n1"
#: Short reclaim idle time and two deliveries, so that loss and dead-lettering show in a test.
SIDES_CFG = QueueConfig(claim_min_idle_s=0.2, max_deliveries=2)


@dataclass
class QueueSides:
    """What the rollout manager's client, a worker and the dispatch loop each see."""

    submitter: SubmitterQueue
    worker: WorkerQueue
    dispatcher: DispatcherQueue

    @classmethod
    def connect(cls, redis_url: str, cfg: QueueConfig) -> QueueSides:
        client = connect(redis_url, cfg)
        return cls(
            SubmitterQueue(client, cfg), WorkerQueue(client, cfg), DispatcherQueue(client, cfg)
        )

    @property
    def redis(self) -> redis.Redis:
        return self.submitter.redis

    @property
    def keys(self) -> Keys:
        return self.submitter.keys

    @property
    def cfg(self) -> QueueConfig:
        return self.submitter.cfg

    def close(self) -> None:
        self.redis.close()


@pytest.fixture
def q(redis_url: str) -> Iterator[QueueSides]:
    sides = QueueSides.connect(redis_url, SIDES_CFG)
    sides.worker.ensure_group(NODE)
    yield sides
    sides.close()


def beat(q: QueueSides, node: str = NODE, slots: int = 2, **extra: str) -> None:
    q.worker.heartbeat(node, {"slots": slots, "busy": 0, "draining": "0", **extra})


def submit(q: QueueSides, n: int = 1, batch: str = "b1", **kw: object) -> list[str]:
    req = RolloutRequest(batch_id=batch, instance_ids=[f"i{k}" for k in range(n)], **kw)
    tasks = tasks_for_request(req)
    q.submitter.submit_batch(batch, req.job_id, req.model_dump_json(), tasks)
    return [t.task_id for t in tasks]


def take(q: QueueSides, node: str = NODE, count: int = 10) -> list[tuple[str, str, int]]:
    """Read entries as the node's worker: (entry id, task id, attempt)."""
    out = []
    for eid, fields in q.worker.read_tasks(node, count, 1):
        entry = decode_task_entry(eid, fields)
        out.append((eid, entry.task.task_id, entry.task.attempt))
    return out


def dispatch_one(q: QueueSides, tid: str, node: str = NODE) -> str:
    """Dispatch the one pending task ``tid`` to ``node``, read and start it; its entry id."""
    q.dispatcher.dispatch(node, 2, 1)
    [(eid, got, _)] = take(q, node=node)
    assert got == tid
    assert q.worker.start(tid, eid, node) == "running"
    return eid


def one_running_one_queued(q: QueueSides, node: str) -> tuple[str, str]:
    """A node with one slot running one task and holding another (prefetched, not read)."""
    t_run, t_queued = submit(q, 2)
    beat(q, node=node, slots=1)
    q.worker.ensure_group(node)
    assert q.dispatcher.dispatch(node, 2, 2) == (2, 0)
    [(eid, got, _)] = take(q, node=node, count=1)
    assert got == t_run
    q.worker.start(t_run, eid, node)
    return t_run, t_queued


def result(tid: str, attempt: int, status: str = "completed", node: str = NODE) -> TaskResult:
    if status == "aborted":
        outcome = Outcome(status=OutcomeStatus.ABORTED, abort_reason="sandbox gone")
    else:
        outcome = Outcome(status=OutcomeStatus(status), reward=1.0)
    return TaskResult(
        task_id=tid,
        batch_id=tid.split(":")[0],
        trajectory_id=f"{tid}.a{attempt}",
        node=node,
        attempt=attempt,
        outcome=outcome,
    )


def stored_record(q: QueueSides, trajectory_id: str) -> tuple[str, Outcome | None]:
    """A trajectory record's status and outcome, as stored."""
    info = q.redis.hgetall(TrajectoryKeys(q.cfg.prefix, trajectory_id).info)
    raw = info.get(b"outcome")
    status = info[b"status"].decode()
    return status, Outcome.model_validate_json(raw) if raw else None
