"""The dispatcher's side of the queue, used by the manager's dispatch loop
(``services.manager.dispatcher.Dispatcher``).

It reads the cluster (pending count, node status), moves pending tasks onto node streams within
the budget of :mod:`services.queue.budget`, takes back the work of dead nodes, and moves entries
queued on a busy node back to the pending list (rebalancing). It reads node streams as the
consumer :data:`~services.queue.keys.MANAGER_CONSUMER`, racing atomically with the workers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis

from services.queue.base import QueueSide, RequeueKind, as_text
from services.queue.entries import entry_fields
from services.queue.keys import MANAGER_CONSUMER, WORKER_GROUP
from services.queue.models import NodeStatus

#: Entries read or claimed per round trip when taking a node's work back.
_BATCH = 100


def _no_group(exc: redis.ResponseError) -> bool:
    """The node's stream or consumer group does not exist (nothing was ever dispatched)."""
    return "NOGROUP" in str(exc)


class DispatcherQueue(QueueSide):
    """The queue as the dispatch loop uses it (thread-safe: redis-py pools connections)."""

    # ------------------------------------------------------------------ reading the cluster
    def node_names(self) -> list[str]:
        return self._node_names()

    def cluster_state(self, names: Sequence[str]) -> tuple[int, list[NodeStatus], int]:
        """In one round trip: the pending count, these nodes' status, and how many nodes are
        known now (differs from ``len(names)`` when a new node has appeared)."""
        return self._cluster_state(names)

    def nodes(self) -> list[NodeStatus]:
        return self._nodes()

    def server_uptime_s(self) -> int:
        """Seconds since the Redis server started (a restart resets it)."""
        return int(self.redis.info("server")["uptime_in_seconds"])

    def wait_wake(self, timeout_s: float) -> bool:
        """Block until something asks the manager to dispatch (or the timeout); True if woken."""
        return self.redis.blpop([self.keys.wake], timeout=max(timeout_s, 0.01)) is not None

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, node: str, max_outstanding: int, n: int) -> tuple[int, int]:
        """Move up to ``n`` pending tasks onto ``node``'s stream; returns (sent, pending_left)."""
        args = [self.cfg.prefix, node, max_outstanding, n, time.time(), self.cfg.dead_maxlen]
        sent, left = self.scripts.dispatch(args=args)
        return int(sent), int(left)

    def take_back_undelivered(self, node: str, count: int, reason: str) -> int:
        """Move up to ``count`` entries queued for ``node`` and not yet read by its worker back
        to the pending list (work stealing: the worker and this read race atomically, each
        entry goes to exactly one of them). Returns how many were moved."""
        if count <= 0:
            return 0
        try:
            entries = self._read_undelivered(node, count)
        except redis.ResponseError as exc:
            if not _no_group(exc):
                raise
            return 0
        return sum(
            self._take_back(node, eid, fields, reason, "rebalance") == "requeued"
            for eid, fields in entries
        )

    # ------------------------------------------------------------------ dead nodes
    def reclaim_node(self, node: str, reason: str) -> int:
        """Take back the tasks of a dead node; returns how many were handed back.

        Entries never delivered to the node's worker are read as the manager consumer; entries
        delivered but not acknowledged are taken with ``XAUTOCLAIM`` once idle for
        ``claim_min_idle_s`` (a live worker refreshes its running entries on every heartbeat,
        so only lost ones get that idle). Each goes back to the pending list through the
        requeue script, which ignores entries that no longer stand for their task.
        """
        n = 0
        try:
            while entries := self._read_undelivered(node, _BATCH):
                for eid, fields in entries:
                    n += self._take_back(node, eid, fields, f"{reason}; never started") == (
                        "requeued"
                    )
            n += self._claim_idle(node, reason)
        except redis.ResponseError as exc:
            if not _no_group(exc):
                raise
        return n

    def _claim_idle(self, node: str, reason: str) -> int:
        """Hand back the delivered entries of ``node`` idle for ``claim_min_idle_s``."""
        stream = self.keys.node_stream(node)
        min_idle_ms = int(self.cfg.claim_min_idle_s * 1000)
        n, start = 0, "0-0"
        while True:
            nxt, claimed, _deleted = self.redis.xautoclaim(
                stream, WORKER_GROUP, MANAGER_CONSUMER, min_idle_ms, start, count=_BATCH
            )
            for eid, fields in claimed:
                if fields is None:  # deleted meanwhile
                    self.redis.xack(stream, WORKER_GROUP, eid)
                    continue
                n += self._take_back(node, as_text(eid), fields, reason) == "requeued"
            if as_text(nxt) in ("0-0", "0"):
                return n
            start = as_text(nxt)

    def _read_undelivered(self, node: str, count: int) -> list[tuple[str, dict[bytes, bytes]]]:
        """Entries of ``node``'s stream its worker has not read, read as the manager."""
        stream = self.keys.node_stream(node)
        resp = self.redis.xreadgroup(WORKER_GROUP, MANAGER_CONSUMER, {stream: ">"}, count=count)
        return [(as_text(eid), fields) for eid, fields in (resp[0][1] if resp else [])]

    def _take_back(
        self,
        node: str,
        entry: str,
        fields: dict[bytes, bytes],
        reason: str,
        kind: RequeueKind = "lost",
    ) -> str:
        tid = entry_fields(fields).get("task_id", "")
        if not tid:
            return self._dead_letter(node, entry, fields, "entry has no task_id")
        return self._requeue(tid, entry, node, reason, kind)
