"""Queue layer of the execution plane: Redis Streams + consumer groups, no job framework.

One side per caller, over shared keys (:class:`Keys`) and Lua scripts
(:mod:`services.queue.scripts`): :class:`SubmitterQueue` (the rollout manager's client),
:class:`WorkerQueue` (a sandbox worker) and :class:`DispatcherQueue` (the manager's dispatch
loop); :func:`plan_dispatch` computes the backpressure budget. See docs/execution.md.
"""

from services.queue.budget import NodeLoad, max_outstanding, plan_dispatch
from services.queue.config import QueueConfig
from services.queue.connection import TRANSIENT_ERRORS, connect, retry_forever
from services.queue.dispatcher import DispatcherQueue
from services.queue.entries import PayloadError, TaskEntry, decode_task_entry
from services.queue.keys import Keys
from services.queue.models import BatchProgress, BatchState, DeadLetter, NodeStatus, TaskState
from services.queue.submitter import (
    BatchConflictError,
    QueueError,
    SubmitterQueue,
    UnknownBatchError,
)
from services.queue.worker import WorkerQueue

__all__ = [
    "TRANSIENT_ERRORS",
    "BatchConflictError",
    "BatchProgress",
    "BatchState",
    "DeadLetter",
    "DispatcherQueue",
    "Keys",
    "NodeLoad",
    "NodeStatus",
    "PayloadError",
    "QueueConfig",
    "QueueError",
    "SubmitterQueue",
    "TaskEntry",
    "TaskState",
    "UnknownBatchError",
    "WorkerQueue",
    "connect",
    "decode_task_entry",
    "max_outstanding",
    "plan_dispatch",
    "retry_forever",
]
