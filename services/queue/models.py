"""Typed views of the queue's Redis state: task and batch states, progress, nodes, dead letters."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, Field


class TaskState(StrEnum):
    PENDING = "pending"  # waiting in the pending list
    DISPATCHED = "dispatched"  # an entry on a node's stream, not yet started
    RUNNING = "running"  # a worker runs it
    DONE = "done"  # final result recorded
    CANCELLED = "cancelled"  # its batch was cancelled before it finished
    DEAD = "dead"  # dead-lettered (invalid payload, or lost too many times)

    @property
    def terminal(self) -> bool:
        return self in (TaskState.DONE, TaskState.CANCELLED, TaskState.DEAD)


class BatchState(StrEnum):
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"


class BatchProgress(BaseModel):
    """Where a batch stands. ``done`` counts every final result, whatever its status."""

    batch_id: str
    job_id: str
    state: BatchState
    total: int
    done: int
    running: int  # started by a worker and not finished
    queued: int  # not started yet: pending or on a node's stream
    completed: int = 0
    timeout: int = 0
    error: int = 0
    aborted: int = 0  # infrastructure failures, after retries
    cancelled: int = 0
    dead_lettered: int = 0
    retries: int = 0  # aborted attempts that were retried
    requeued: int = 0  # tasks handed back (lost worker, shutdown, dead node)
    rebalanced: int = 0  # queued entries moved from a busy node to one with a free slot
    created_at: float = 0.0
    finished_at: float | None = None
    results_by_status: dict[str, int] = Field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.done >= self.total


@dataclass(frozen=True)
class NodeStatus:
    """A node as the manager sees it: the worker's heartbeat plus its outstanding tasks."""

    name: str
    alive: bool
    slots: int
    busy: int
    outstanding: int  # dispatched to it and not reported yet (queued on its stream + running)
    draining: bool
    pid: int = 0
    host: str = ""
    instance: str = ""
    last_seen: float = 0.0


@dataclass(frozen=True)
class DeadLetter:
    entry_id: str
    source: str
    reason: str
    task_id: str
    fields: dict[str, str]
