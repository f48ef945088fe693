"""Queue layer of the execution plane: Redis Streams + consumer groups, no job framework.

Public entry points: :class:`TaskQueue` (all operations), :class:`QueueConfig`, :class:`Keys`
(the key layout) and :func:`plan_dispatch` (the backpressure budget). See docs/execution.md.
"""

from services.queue.config import QueueConfig
from services.queue.connection import TRANSIENT_ERRORS, connect, retry_forever
from services.queue.dispatch import NodeLoad, max_outstanding, plan_dispatch
from services.queue.entries import PayloadError, TaskEntry, decode_task_entry
from services.queue.keys import Keys
from services.queue.models import BatchProgress, BatchState, DeadLetter, NodeStatus, TaskState
from services.queue.store import BatchConflictError, QueueError, TaskQueue, UnknownBatchError

__all__ = [
    "TRANSIENT_ERRORS",
    "BatchConflictError",
    "BatchProgress",
    "BatchState",
    "DeadLetter",
    "Keys",
    "NodeLoad",
    "NodeStatus",
    "PayloadError",
    "QueueConfig",
    "QueueError",
    "TaskEntry",
    "TaskQueue",
    "TaskState",
    "UnknownBatchError",
    "connect",
    "decode_task_entry",
    "max_outstanding",
    "plan_dispatch",
    "retry_forever",
]
