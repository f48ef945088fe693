"""The submitter's side of the queue, used by the rollout manager's client (``RolloutManager``).

It submits batches and reads them back: progress, results (per batch, or the global results
stream through a consumer group), dead letters and the nodes; it cancels and forgets batches.
An invalid entry on a results stream is moved to the dead-letter stream and skipped.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import redis
from pydantic import ValidationError

from services.protocol.tasks import RolloutTask, TaskResult
from services.queue.base import QueueSide, as_float, as_int, as_text
from services.queue.entries import entry_fields, task_payload
from services.queue.models import BatchProgress, BatchState, DeadLetter, NodeStatus

log = logging.getLogger("swerl.queue")

#: The batch counters of final results, by status (``n_<name>`` in the batch hash).
_RESULT_COUNTERS = ("completed", "timeout", "error", "aborted", "cancelled", "dead")


class QueueError(RuntimeError):
    """A queue operation cannot be done (the message says why)."""


class UnknownBatchError(QueueError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown batch"


class BatchConflictError(QueueError):
    """A batch id was submitted again with a different request."""


class SubmitterQueue(QueueSide):
    """Submit batches and read them back (thread-safe: redis-py pools connections)."""

    # ------------------------------------------------------------------ batches
    def submit_batch(
        self, batch_id: str, job_id: str, request_json: str, tasks: Sequence[RolloutTask]
    ) -> bool:
        """Create a batch and queue its tasks atomically; False if it already existed unchanged.

        Submitting the same request twice is a no-op (a client may retry after a lost reply);
        the same batch id with another request raises :class:`BatchConflictError`.
        """
        if not tasks:
            raise QueueError(f"batch {batch_id} has no tasks")
        args: list[Any] = [self.cfg.prefix, batch_id, job_id, request_json, time.time()]
        for task in tasks:
            if task.batch_id != batch_id:
                raise QueueError(f"task {task.task_id} belongs to batch {task.batch_id}")
            args += [task.task_id, task_payload(task), task.max_attempts]
        existing = self.scripts.submit(args=args)
        if existing is None:
            return True
        if as_text(existing) != request_json:
            raise BatchConflictError(
                f"batch {batch_id} already exists with a different request; "
                "use a new batch id (or omit it to get a generated one)"
            )
        return False

    def batch_request(self, batch_id: str) -> str:
        raw = self.redis.hget(self.keys.batch(batch_id), "request")
        if raw is None:
            raise UnknownBatchError(f"unknown batch {batch_id!r}")
        return as_text(raw)

    def progress(self, batch_id: str) -> BatchProgress:
        h = {as_text(k): v for k, v in self.redis.hgetall(self.keys.batch(batch_id)).items()}
        if not h:
            raise UnknownBatchError(f"unknown batch {batch_id!r}")
        total, done = as_int(h.get("total")), as_int(h.get("n_done"))
        running = as_int(h.get("n_running"))
        counters = {name: as_int(h.get(f"n_{name}")) for name in _RESULT_COUNTERS}
        return BatchProgress(
            batch_id=batch_id,
            job_id=as_text(h.get("job")) or "default",
            state=BatchState(as_text(h.get("state"))),
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
            retries=as_int(h.get("n_retries")),
            requeued=as_int(h.get("n_requeued")),
            rebalanced=as_int(h.get("n_rebalanced")),
            created_at=as_float(h.get("created")) or 0.0,
            finished_at=as_float(h.get("finished")),
            results_by_status={k: v for k, v in counters.items() if v},
        )

    def task_state(self, task_id: str) -> dict[str, str]:
        """The raw task hash as text (debugging, tests, the job API)."""
        raw = self.redis.hgetall(self.keys.task(task_id))
        return {as_text(k): as_text(v) for k, v in raw.items()}

    def batch_ids(self) -> list[str]:
        return [as_text(b) for b in self.redis.zrange(self.keys.batches, 0, -1)]

    def cancel(self, batch_id: str) -> int:
        """Cancel a batch; returns the number of unfinished tasks reported as cancelled."""
        args = [self.cfg.prefix, batch_id, time.time(), self.cfg.results_maxlen]
        n = int(self.scripts.cancel(args=args))
        if n < 0:
            raise UnknownBatchError(f"unknown batch {batch_id!r}")
        return n

    def forget(self, batch_id: str) -> int:
        """Delete a finished or cancelled batch and its tasks; returns the keys removed."""
        prog = self.progress(batch_id)
        if prog.state is BatchState.RUNNING:
            raise QueueError(f"batch {batch_id} is still running; cancel it first")
        tids = [as_text(t) for t in self.redis.lrange(self.keys.batch_tasks(batch_id), 0, -1)]
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

    # ------------------------------------------------------------------ results
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
            last = as_text(eid)
            result = self._parse_result(stream, last, fields)
            if result is not None:
                out.append(result)
        return last, out

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
            result = self._parse_result(stream, as_text(eid), fields, ack_group=group)
            if result is not None:
                out.append((as_text(eid), result))
        return out

    def ack_results(self, group: str, entry_ids: Sequence[str]) -> int:
        return int(self.redis.xack(self.keys.results, group, *entry_ids)) if entry_ids else 0

    def _parse_result(
        self, stream: str, entry: str, fields: dict[bytes, bytes], ack_group: str | None = None
    ) -> TaskResult | None:
        """The result an entry carries, or None after moving an invalid entry to dead letters
        (acknowledged first for ``ack_group``)."""
        text = entry_fields(fields)
        try:
            return TaskResult.model_validate_json(text.get("result", ""))
        except ValidationError as exc:
            if ack_group is not None:
                self.redis.xack(stream, ack_group, entry)
            self._move_to_dead(stream, entry, text, f"invalid result: {exc.errors()[0]['msg']}")
            return None

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

    # ------------------------------------------------------------------ cluster
    def pending_count(self) -> int:
        """Length of the pending list (may include stale ids of cancelled tasks)."""
        return int(self.redis.llen(self.keys.pending))

    def nodes(self) -> list[NodeStatus]:
        return self._nodes()

    def dead_letters(self, count: int = 100) -> list[DeadLetter]:
        out = []
        for eid, fields in self.redis.xrange(self.keys.dead, count=count):
            text = entry_fields(fields)
            out.append(
                DeadLetter(
                    entry_id=as_text(eid),
                    source=text.get("source", ""),
                    reason=text.get("reason", ""),
                    task_id=text.get("task_id", ""),
                    fields=text,
                )
            )
        return out
