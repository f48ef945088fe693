"""The worker's side of the queue, used by a sandbox worker (``sandbox_worker.worker.Worker``).

A worker registers its node (consumer group, heartbeat), claims the entries of its node's
stream (only as many as it has free slots), starts and finishes tasks, hands tasks back or
dead-letters unusable entries, and, restarted under the same node name, takes over the entries
its previous run left pending. Its consumer name is its node name.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import redis

from services.protocol.tasks import TaskResult
from services.queue.base import QueueSide, RequeueKind, as_text
from services.queue.keys import WORKER_GROUP

#: A stream entry as read: (entry id, raw fields).
RawEntry = tuple[str, dict[bytes, bytes]]


class WorkerQueue(QueueSide):
    """The queue as one node's worker uses it (thread-safe: redis-py pools connections)."""

    # ------------------------------------------------------------------ registration
    def ensure_group(self, node: str) -> None:
        """Create the node's stream and consumer group (from id 0: no entry is ever skipped)."""
        try:
            self.redis.xgroup_create(self.keys.node_stream(node), WORKER_GROUP, "0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def heartbeat(
        self,
        node: str,
        fields: dict[str, str | int | float],
        running_entries: Iterable[str] = (),
        running_batches: Iterable[str] = (),
    ) -> tuple[bool, set[str]]:
        """Refresh a node's heartbeat and its running entries' idle time.

        Returns (first heartbeat of this node's life, cancelled batches among
        ``running_batches``). Running entries are re-claimed by their own consumer with
        ``XCLAIM ... JUSTID``, which resets their idle time without counting a delivery, so
        ``XAUTOCLAIM`` never takes work from a live worker however long a trajectory runs.
        """
        entries = list(running_entries)
        batches = sorted(set(running_batches))
        key = self.keys.node(node)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, mapping={**fields, "ts": time.time()})
        pipe.pexpire(key, int(self.cfg.heartbeat_ttl_s * 1000))
        pipe.sadd(self.keys.nodes, node)
        if entries:
            pipe.xclaim(self.keys.node_stream(node), WORKER_GROUP, node, 0, entries, justid=True)
        for b in batches:
            pipe.exists(self.keys.cancel(b))
        replies = pipe.execute()
        new = int(replies[0]) > 1  # HSET counts new fields: a fresh hash gets all of them
        flags = replies[-len(batches) :] if batches else []
        if new:
            self._wake_dispatcher()
        return new, {b for b, f in zip(batches, flags, strict=True) if int(f)}

    def _wake_dispatcher(self) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.lpush(self.keys.wake, "1")
        pipe.ltrim(self.keys.wake, 0, 0)
        pipe.execute()

    def node_heartbeat(self, node: str) -> dict[str, str]:
        """The node's current heartbeat hash (empty once it has expired)."""
        raw = self.redis.hgetall(self.keys.node(node))
        return {as_text(k): as_text(v) for k, v in raw.items()}

    def set_draining(self, node: str) -> None:
        """Stop dispatch to ``node`` (the dispatch script checks this flag atomically)."""
        self.redis.hset(self.keys.node(node), "draining", "1")

    def drop_heartbeat(self, node: str) -> None:
        self.redis.delete(self.keys.node(node))

    # ------------------------------------------------------------------ claiming
    def read_tasks(self, node: str, count: int, block_ms: int) -> list[RawEntry]:
        """New entries for ``node`` (at most ``count``: the worker's free slots)."""
        if count <= 0:
            return []
        stream = self.keys.node_stream(node)
        try:
            resp = self.redis.xreadgroup(
                WORKER_GROUP, node, {stream: ">"}, count=count, block=max(block_ms, 1)
            )
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self.ensure_group(node)  # Redis lost its data (no AOF): start over, nothing to skip
            return []
        return [(as_text(eid), fields) for eid, fields in (resp[0][1] if resp else [])]

    def own_pending(self, node: str) -> list[RawEntry]:
        """Entries delivered to ``node``'s consumer and not acknowledged (its PEL): what a
        previous run left behind (takeover) or a read whose reply was lost."""
        stream = self.keys.node_stream(node)
        out: list[RawEntry] = []
        last = "0"
        try:
            while True:
                resp = self.redis.xreadgroup(WORKER_GROUP, node, {stream: last}, count=100)
                entries = resp[0][1] if resp else []
                if not entries:
                    break
                for eid, fields in entries:
                    if fields:
                        out.append((as_text(eid), fields))
                    else:  # deleted from the stream while pending: nothing to run
                        self.redis.xack(stream, WORKER_GROUP, eid)
                last = as_text(entries[-1][0])
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        return out

    # ------------------------------------------------------------------ running / finishing
    def start(self, task_id: str, entry: str, node: str) -> str:
        """Mark a task running; anything but ``"running"`` means drop the entry (acked)."""
        args = [self.cfg.prefix, task_id, entry, node, time.time()]
        return as_text(self.scripts.start(args=args))

    def complete(self, result: TaskResult, entry: str) -> str:
        """Report a result; idempotent. Returns final | retry | duplicate | stale | unknown."""
        return as_text(
            self.scripts.complete(
                args=[
                    self.cfg.prefix,
                    result.task_id,
                    entry,
                    result.node,
                    result.model_dump_json(),
                    str(result.outcome.status),
                    result.outcome.abort_reason or "",
                    time.time(),
                    self.cfg.results_maxlen,
                    "1" if result.outcome.retryable else "0",
                ]
            )
        )

    def requeue(self, task_id: str, entry: str, node: str, reason: str, kind: RequeueKind) -> str:
        """Hand a task back (front of the pending list), closing its attempt's open record;
        see :meth:`QueueSide._requeue`."""
        return self._requeue(task_id, entry, node, reason, kind)

    def dead_letter(
        self, node: str, entry: str, fields: dict[bytes, bytes] | dict[str, str], reason: str
    ) -> str:
        """Move an unusable entry to the dead-letter stream, with the reason and its fields."""
        return self._dead_letter(node, entry, fields, reason)
