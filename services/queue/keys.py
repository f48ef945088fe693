"""Every Redis key of the execution plane, in one place, under one prefix.

The Lua scripts build the same names from the prefix (see :mod:`services.queue.scripts`); this
module is the Python side and the reference for ``docs/execution.md``. Keys are built by string
concatenation so that ``prefix`` alone decides the namespace (default ``swerl:``), which lets
several deployments or test runs share one Redis.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Consumer group of the workers on every per-node task stream.
WORKER_GROUP = "workers"
#: Consumer name the manager uses when it takes entries of a dead node back.
MANAGER_CONSUMER = "manager"
#: Consumer group a long-running reader of the global results stream uses by default.
RESULTS_GROUP = "consumers"


@dataclass(frozen=True)
class Keys:
    prefix: str = "swerl:"

    # -- work distribution ------------------------------------------------------------------
    @property
    def pending(self) -> str:
        """LIST of task ids waiting for dispatch (new tasks LPUSH, retries RPUSH, RPOP takes)."""
        return f"{self.prefix}pending"

    def node_stream(self, node: str) -> str:
        """STREAM of tasks dispatched to one node (consumer group :data:`WORKER_GROUP`)."""
        return f"{self.prefix}tasks:{node}"

    def node(self, node: str) -> str:
        """HASH heartbeat of a node's worker, with a TTL: absent means the node is dead."""
        return f"{self.prefix}node:{node}"

    def node_assigned(self, node: str) -> str:
        """SET of task ids dispatched to a node and not yet reported (its outstanding work)."""
        return f"{self.prefix}node:{node}:assigned"

    @property
    def nodes(self) -> str:
        """SET of every node name that ever sent a heartbeat."""
        return f"{self.prefix}nodes"

    @property
    def wake(self) -> str:
        """LIST the manager blocks on; one element means "something changed, dispatch now"."""
        return f"{self.prefix}manager:wake"

    # -- state ------------------------------------------------------------------------------
    def task(self, task_id: str) -> str:
        """HASH of one task: state, attempt, payload, node, stream entry, result."""
        return f"{self.prefix}task:{task_id}"

    def batch(self, batch_id: str) -> str:
        """HASH of one batch: the request, its state and counters."""
        return f"{self.prefix}batch:{batch_id}"

    def batch_tasks(self, batch_id: str) -> str:
        """LIST of a batch's task ids in submission order."""
        return f"{self.prefix}batch:{batch_id}:tasks"

    def batch_results(self, batch_id: str) -> str:
        """STREAM of a batch's final results, exactly one entry per task."""
        return f"{self.prefix}batch:{batch_id}:results"

    @property
    def batches(self) -> str:
        """ZSET of batch ids scored by creation time."""
        return f"{self.prefix}batches"

    def job(self, job_id: str) -> str:
        """HASH of a job's counters (batches, tasks)."""
        return f"{self.prefix}job:{job_id}"

    def job_batches(self, job_id: str) -> str:
        """SET of the batch ids of a job."""
        return f"{self.prefix}job:{job_id}:batches"

    # -- outputs ----------------------------------------------------------------------------
    @property
    def results(self) -> str:
        """STREAM of every final result of every batch (capped), for group consumers."""
        return f"{self.prefix}results"

    @property
    def dead(self) -> str:
        """STREAM of dead letters: invalid payloads and tasks lost too often, with a reason."""
        return f"{self.prefix}dead"

    # -- cancellation -----------------------------------------------------------------------
    def cancel(self, batch_id: str) -> str:
        """STRING present while a batch is cancelled (workers poll it; survives restarts)."""
        return f"{self.prefix}cancel:{batch_id}"

    @property
    def cancel_channel(self) -> str:
        """Pub/sub channel carrying the id of each cancelled batch (the fast path)."""
        return f"{self.prefix}cancel"
