"""The queue layer: Redis Streams with consumer groups, state hashes and Lua transitions.

One :class:`TaskQueue` object wraps one Redis client and is shared by the threads of a
process. The manager uses the submission, dispatch, reclaim, cancel and progress side; a
sandbox worker uses the read, start, complete, requeue, heartbeat and dead-letter side. Key
layout: :mod:`services.queue.keys`; transitions: :mod:`services.queue.scripts`; the design and
its guarantees: ``docs/execution.md``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import redis
from pydantic import ValidationError

from services.protocol.tasks import RolloutTask, TaskResult
from services.queue.config import QueueConfig
from services.queue.connection import connect
from services.queue.entries import entry_fields, task_payload
from services.queue.keys import MANAGER_CONSUMER, WORKER_GROUP, Keys
from services.queue.models import (
    BatchProgress,
    BatchState,
    DeadLetter,
    NodeStatus,
    TaskState,
)
from services.queue.scripts import Scripts
from services.store.trajectories import abort_lost_trajectory

log = logging.getLogger("swerl.queue")

RawEntry = tuple[str, dict[bytes, bytes]]
#: Why a task is handed back: its worker was lost (counts towards max_deliveries), its worker
#: shut down, or a queued entry is moved to a node with a free slot.
RequeueKind = Literal["lost", "handback", "rebalance"]


class QueueError(RuntimeError):
    """A queue operation cannot be done (the message says why)."""


class UnknownBatchError(QueueError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown batch"


class BatchConflictError(QueueError):
    """A batch id was submitted again with a different request."""


def _s(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def _int(value: bytes | str | None, default: int = 0) -> int:
    return int(value) if value not in (None, b"", "") else default


def _float(value: bytes | str | None) -> float | None:
    return float(value) if value not in (None, b"", "") else None


class TaskQueue:
    """Queue operations over one Redis client (thread-safe: redis-py pools connections)."""

    def __init__(
        self,
        url_or_client: str | redis.Redis,
        cfg: QueueConfig | None = None,
    ) -> None:
        self.cfg = cfg or QueueConfig()
        self.redis = (
            connect(url_or_client, self.cfg) if isinstance(url_or_client, str) else url_or_client
        )
        self.keys = Keys(self.cfg.prefix)
        self.scripts = Scripts(self.redis)

    def close(self) -> None:
        self.redis.close()

    def _p(self) -> str:
        return self.cfg.prefix

    # ------------------------------------------------------------------ submission / state
    def submit_batch(
        self, batch_id: str, job_id: str, request_json: str, tasks: Sequence[RolloutTask]
    ) -> bool:
        """Create a batch and queue its tasks atomically; False if it already existed unchanged.

        Submitting the same request twice is a no-op (a client may retry after a lost reply);
        the same batch id with another request raises :class:`BatchConflictError`.
        """
        if not tasks:
            raise QueueError(f"batch {batch_id} has no tasks")
        args: list[Any] = [self._p(), batch_id, job_id, request_json, time.time()]
        for task in tasks:
            if task.batch_id != batch_id:
                raise QueueError(f"task {task.task_id} belongs to batch {task.batch_id}")
            args += [task.task_id, task_payload(task), task.max_attempts]
        existing = self.scripts.submit(args=args)
        if existing is None:
            return True
        if _s(existing) != request_json:
            raise BatchConflictError(
                f"batch {batch_id} already exists with a different request; "
                "use a new batch id (or omit it to get a generated one)"
            )
        return False

    def batch_request(self, batch_id: str) -> str:
        raw = self.redis.hget(self.keys.batch(batch_id), "request")
        if raw is None:
            raise UnknownBatchError(f"unknown batch {batch_id!r}")
        return _s(raw)

    def progress(self, batch_id: str) -> BatchProgress:
        h = {_s(k): v for k, v in self.redis.hgetall(self.keys.batch(batch_id)).items()}
        if not h:
            raise UnknownBatchError(f"unknown batch {batch_id!r}")
        total, done, running = _int(h.get("total")), _int(h.get("n_done")), _int(h.get("n_running"))
        counters = {
            name: _int(h.get(f"n_{name}"))
            for name in ("completed", "timeout", "error", "aborted", "cancelled", "dead")
        }
        return BatchProgress(
            batch_id=batch_id,
            job_id=_s(h.get("job")) or "default",
            state=BatchState(_s(h.get("state"))),
            total=total,
            done=done,
            running=running,
            queued=max(0, total - done - running),
            completed=counters["completed"],
            timeout=counters["timeout"],
            error=counters["error"],
            aborted=counters["aborted"],
            cancelled=counters["cancelled"],
            dead_lettered=counters["dead"],
            retries=_int(h.get("n_retries")),
            requeued=_int(h.get("n_requeued")),
            rebalanced=_int(h.get("n_rebalanced")),
            created_at=_float(h.get("created")) or 0.0,
            finished_at=_float(h.get("finished")),
            results_by_status={k: v for k, v in counters.items() if v},
        )

    def task_state(self, task_id: str) -> dict[str, str]:
        """The raw task hash as text (debugging, tests, the job API)."""
        return {_s(k): _s(v) for k, v in self.redis.hgetall(self.keys.task(task_id)).items()}

    def batch_task_ids(self, batch_id: str) -> list[str]:
        return [_s(t) for t in self.redis.lrange(self.keys.batch_tasks(batch_id), 0, -1)]

    def batch_ids(self) -> list[str]:
        return [_s(b) for b in self.redis.zrange(self.keys.batches, 0, -1)]

    def pending_count(self) -> int:
        """Length of the pending list (may include stale ids of cancelled tasks)."""
        return int(self.redis.llen(self.keys.pending))

    def forget(self, batch_id: str) -> int:
        """Delete a finished or cancelled batch and its tasks; returns the keys removed."""
        prog = self.progress(batch_id)
        if prog.state is BatchState.RUNNING:
            raise QueueError(f"batch {batch_id} is still running; cancel it first")
        tids = self.batch_task_ids(batch_id)
        pipe = self.redis.pipeline(transaction=True)
        for tid in tids:
            pipe.delete(self.keys.task(tid))
        pipe.delete(
            self.keys.batch(batch_id),
            self.keys.batch_tasks(batch_id),
            self.keys.batch_results(batch_id),
            self.keys.cancel(batch_id),
        )
        pipe.zrem(self.keys.batches, batch_id)
        pipe.srem(self.keys.job_batches(prog.job_id), batch_id)
        return sum(int(x) for x in pipe.execute()[: len(tids) + 1])

    # ------------------------------------------------------------------ dispatch / nodes
    def dispatch(self, node: str, max_outstanding: int, n: int) -> tuple[int, int]:
        """Move up to ``n`` pending tasks onto ``node``'s stream; returns (sent, pending_left)."""
        sent, left = self.scripts.dispatch(
            args=[self._p(), node, max_outstanding, n, time.time(), self.cfg.dead_maxlen]
        )
        return int(sent), int(left)

    def node_names(self) -> list[str]:
        return sorted(_s(n) for n in self.redis.smembers(self.keys.nodes))

    def nodes(self) -> list[NodeStatus]:
        return self.cluster_state(self.node_names())[1]

    def cluster_state(self, names: Sequence[str]) -> tuple[int, list[NodeStatus], int]:
        """In one round trip: the pending count, these nodes' status, and how many nodes are
        known now (differs from ``len(names)`` when a new node has appeared)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(self.keys.pending)
        pipe.scard(self.keys.nodes)
        for name in names:
            pipe.hgetall(self.keys.node(name))
            pipe.scard(self.keys.node_assigned(name))
        replies = pipe.execute()
        out = []
        for i, name in enumerate(names):
            hb = {_s(k): _s(v) for k, v in replies[2 + 2 * i].items()}
            out.append(
                NodeStatus(
                    name=name,
                    alive=bool(hb),
                    slots=_int(hb.get("slots")),
                    busy=_int(hb.get("busy")),
                    outstanding=int(replies[3 + 2 * i]),
                    draining=hb.get("draining") == "1",
                    pid=_int(hb.get("pid")),
                    host=hb.get("host", ""),
                    instance=hb.get("instance", ""),
                    last_seen=_float(hb.get("ts")) or 0.0,
                )
            )
        return int(replies[0]), out, int(replies[1])

    def server_uptime_s(self) -> int:
        """Seconds since the Redis server started (a restart resets it)."""
        return int(self.redis.info("server")["uptime_in_seconds"])

    def wait_wake(self, timeout_s: float) -> bool:
        """Block until something asks the manager to dispatch (or the timeout); True if woken."""
        return self.redis.blpop([self.keys.wake], timeout=max(timeout_s, 0.01)) is not None

    def wake(self) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.lpush(self.keys.wake, "1")
        pipe.ltrim(self.keys.wake, 0, 0)
        pipe.execute()

    def reclaim_node(self, node: str, reason: str) -> int:
        """Take back the tasks of a dead node; returns how many were handed back.

        Entries never delivered to the node's worker are read as the manager consumer; entries
        delivered but not acknowledged are taken with ``XAUTOCLAIM`` once idle for
        ``claim_min_idle_s`` (a live worker refreshes its running entries on every heartbeat,
        so only lost ones get that idle). Each goes back to the pending list through the
        requeue script, which ignores entries that no longer stand for their task.
        """
        stream = self.keys.node_stream(node)
        n = 0
        try:
            while True:
                resp = self.redis.xreadgroup(
                    WORKER_GROUP, MANAGER_CONSUMER, {stream: ">"}, count=100
                )
                entries = resp[0][1] if resp else []
                if not entries:
                    break
                for eid, fields in entries:
                    n += self._take_back(node, _s(eid), fields, f"{reason}; never started") == (
                        "requeued"
                    )
            start = "0-0"
            min_idle_ms = int(self.cfg.claim_min_idle_s * 1000)
            while True:
                nxt, claimed, _deleted = self.redis.xautoclaim(
                    stream, WORKER_GROUP, MANAGER_CONSUMER, min_idle_ms, start, count=100
                )
                for eid, fields in claimed:
                    if fields is None:  # deleted meanwhile
                        self.redis.xack(stream, WORKER_GROUP, eid)
                        continue
                    n += self._take_back(node, _s(eid), fields, reason) == "requeued"
                if _s(nxt) in ("0-0", "0"):
                    break
                start = _s(nxt)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        return n

    def take_back_undelivered(self, node: str, count: int, reason: str) -> int:
        """Move up to ``count`` entries queued for ``node`` and not yet read by its worker back
        to the pending list (work stealing: the worker and this read race atomically, each
        entry goes to exactly one of them). Returns how many were moved."""
        if count <= 0:
            return 0
        try:
            resp = self.redis.xreadgroup(
                WORKER_GROUP, MANAGER_CONSUMER, {self.keys.node_stream(node): ">"}, count=count
            )
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            return 0
        moved = 0
        for eid, fields in resp[0][1] if resp else []:
            moved += self._take_back(node, _s(eid), fields, reason, "rebalance") == "requeued"
        return moved

    def _take_back(
        self,
        node: str,
        entry: str,
        fields: dict[bytes, bytes],
        reason: str,
        kind: RequeueKind = "lost",
    ) -> str:
        text = entry_fields(fields)
        tid = text.get("task_id", "")
        if not tid:
            return self.dead_letter(node, entry, fields, "entry has no task_id")
        return self.requeue(tid, entry, node, reason, kind)

    # ------------------------------------------------------------------ worker side
    def ensure_group(self, node: str) -> None:
        """Create the node's stream and consumer group (from id 0: no entry is ever skipped)."""
        try:
            self.redis.xgroup_create(self.keys.node_stream(node), WORKER_GROUP, "0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

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
        return [(_s(eid), fields) for eid, fields in (resp[0][1] if resp else [])]

    def own_pending(self, node: str) -> list[RawEntry]:
        """Entries delivered to ``node``'s consumer and not acknowledged (its PEL)."""
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
                        out.append((_s(eid), fields))
                    else:  # deleted from the stream while pending: nothing to run
                        self.redis.xack(stream, WORKER_GROUP, eid)
                last = _s(entries[-1][0])
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        return out

    def start(self, task_id: str, entry: str, node: str) -> str:
        """Mark a task running; anything but ``"running"`` means drop the entry (acked)."""
        return _s(self.scripts.start(args=[self._p(), task_id, entry, node, time.time()]))

    def complete(self, result: TaskResult, entry: str) -> str:
        """Report a result; idempotent. Returns final | retry | duplicate | stale | unknown."""
        return _s(
            self.scripts.complete(
                args=[
                    self._p(),
                    result.task_id,
                    entry,
                    result.node,
                    result.model_dump_json(),
                    str(result.outcome.status),
                    result.outcome.abort_reason or "",
                    time.time(),
                    self.cfg.results_maxlen,
                ]
            )
        )

    def requeue(self, task_id: str, entry: str, node: str, reason: str, kind: RequeueKind) -> str:
        """Hand a task back (front of the pending list). See the REQUEUE script.

        The attempt that held ``entry`` is over: its trajectory record, if it is still open,
        is closed as ``aborted`` ("worker lost") so that no record stays open forever
        (:func:`services.store.trajectories.abort_lost_trajectory`; an outcome its worker
        recorded is kept). Trajectory records share the queue's key prefix.
        """
        if kind == "rebalance":  # an entry no worker has read: no attempt ran, no record
            return self._requeue(task_id, entry, node, reason, kind)
        before = self.redis.hmget(self.keys.task(task_id), "entry", "attempt")
        status = self._requeue(task_id, entry, node, reason, kind)
        if status in ("requeued", "dead") and _s(before[0]) == entry and _s(before[1]).isdigit():
            # RolloutTask.trajectory_id: one trajectory per attempt
            trajectory_id = f"{task_id}.a{_s(before[1])}"
            try:
                closed = abort_lost_trajectory(self.redis, trajectory_id, reason, self._p())
            except redis.RedisError as exc:
                log.warning("could not close the record of %s (%s)", trajectory_id, exc)
            else:
                if closed == "closed":
                    log.info("closed the open record of %s as aborted (worker lost)", trajectory_id)
        return status

    def _requeue(self, task_id: str, entry: str, node: str, reason: str, kind: RequeueKind) -> str:
        return _s(
            self.scripts.requeue(
                args=[
                    self._p(),
                    task_id,
                    entry,
                    node,
                    reason,
                    kind,
                    self.cfg.max_deliveries,
                    time.time(),
                    self.cfg.dead_maxlen,
                    self.cfg.results_maxlen,
                ]
            )
        )

    def dead_letter(
        self, node: str, entry: str, fields: dict[bytes, bytes] | dict[str, str], reason: str
    ) -> str:
        """Move an unusable entry to the dead-letter stream, with the reason and its fields."""
        text = entry_fields(fields)
        return _s(
            self.scripts.dead_letter(
                args=[
                    self._p(),
                    node,
                    entry,
                    reason,
                    json.dumps(text, ensure_ascii=False),
                    text.get("task_id", "")[:200],
                    time.time(),
                    self.cfg.dead_maxlen,
                    self.cfg.results_maxlen,
                ]
            )
        )

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
            self.wake()
        return new, {b for b, f in zip(batches, flags, strict=True) if int(f)}

    def node_heartbeat(self, node: str) -> dict[str, str]:
        return {_s(k): _s(v) for k, v in self.redis.hgetall(self.keys.node(node)).items()}

    def set_draining(self, node: str) -> None:
        """Stop dispatch to ``node`` (the dispatch script checks this flag atomically)."""
        self.redis.hset(self.keys.node(node), "draining", "1")

    def drop_heartbeat(self, node: str) -> None:
        self.redis.delete(self.keys.node(node))

    def cancelled(self, batch_id: str) -> bool:
        return bool(self.redis.exists(self.keys.cancel(batch_id)))

    # ------------------------------------------------------------------ cancel / results
    def cancel(self, batch_id: str) -> int:
        """Cancel a batch; returns the number of unfinished tasks reported as cancelled."""
        n = int(
            self.scripts.cancel(args=[self._p(), batch_id, time.time(), self.cfg.results_maxlen])
        )
        if n < 0:
            raise UnknownBatchError(f"unknown batch {batch_id!r}")
        return n

    def read_batch_results(
        self, batch_id: str, after: str, count: int, block_ms: int | None
    ) -> tuple[str, list[TaskResult]]:
        """Results of a batch after stream id ``after``; returns (last id read, results).

        An entry that is not a valid result is moved to the dead-letter stream and skipped.
        """
        stream = self.keys.batch_results(batch_id)
        resp = self.redis.xread({stream: after}, count=count, block=block_ms)
        last = after
        out: list[TaskResult] = []
        for eid, fields in resp[0][1] if resp else []:
            last = _s(eid)
            text = entry_fields(fields)
            try:
                out.append(TaskResult.model_validate_json(text.get("result", "")))
            except ValidationError as exc:
                self._move_to_dead(stream, last, text, f"invalid result: {exc.errors()[0]['msg']}")
        return last, out

    def _move_to_dead(self, stream: str, entry: str, text: dict[str, str], reason: str) -> None:
        log.error("dead-lettering entry %s of %s: %s", entry, stream, reason)
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(
            self.keys.dead,
            {
                "source": stream,
                "entry": entry,
                "task_id": text.get("task_id", "")[:200],
                "reason": reason,
                "fields": json.dumps(text, ensure_ascii=False),
                "at": time.time(),
            },
            maxlen=self.cfg.dead_maxlen,
            approximate=True,
        )
        pipe.xdel(stream, entry)
        pipe.execute()

    def read_results_group(
        self, group: str, consumer: str, count: int = 100, block_ms: int | None = None
    ) -> list[tuple[str, TaskResult]]:
        """Read the global results stream as ``consumer`` of ``group`` (at-least-once).

        Call :meth:`ack_results` once the results are safely processed. Invalid entries are
        dead-lettered and acknowledged.
        """
        stream = self.keys.results
        try:
            self.redis.xgroup_create(stream, group, "0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        resp = self.redis.xreadgroup(group, consumer, {stream: ">"}, count=count, block=block_ms)
        out: list[tuple[str, TaskResult]] = []
        for eid, fields in resp[0][1] if resp else []:
            text = entry_fields(fields)
            try:
                out.append((_s(eid), TaskResult.model_validate_json(text.get("result", ""))))
            except ValidationError as exc:
                self.redis.xack(stream, group, eid)
                self._move_to_dead(
                    stream, _s(eid), text, f"invalid result: {exc.errors()[0]['msg']}"
                )
        return out

    def ack_results(self, group: str, entry_ids: Sequence[str]) -> int:
        return int(self.redis.xack(self.keys.results, group, *entry_ids)) if entry_ids else 0

    def dead_letters(self, count: int = 100) -> list[DeadLetter]:
        out = []
        for eid, fields in self.redis.xrange(self.keys.dead, count=count):
            text = entry_fields(fields)
            out.append(
                DeadLetter(
                    entry_id=_s(eid),
                    source=text.get("source", ""),
                    reason=text.get("reason", ""),
                    task_id=text.get("task_id", ""),
                    fields=text,
                )
            )
        return out


__all__ = [
    "BatchConflictError",
    "QueueError",
    "TaskQueue",
    "TaskState",
    "UnknownBatchError",
]
