"""What the three sides of the queue share: one Redis client, the key layout, the scripts.

The queue has one side per caller, each a small class over this base:

* :class:`~services.queue.submitter.SubmitterQueue`: the rollout manager's client (submit a
  batch, read its progress and results, cancel, forget);
* :class:`~services.queue.worker.WorkerQueue`: a sandbox worker (register its node, claim
  tasks, start, finish, hand back, heartbeat, take over its own pending entries);
* :class:`~services.queue.dispatcher.DispatcherQueue`: the manager's dispatch loop (dispatch,
  reclaim a dead node's work, rebalance queued entries).

Sides built over one Redis client share its connection pool (thread-safe). The transitions and
reads that more than one side makes (hand a task back, dead-letter an entry, read node status)
live here once. Key layout: :mod:`services.queue.keys`; transitions:
:mod:`services.queue.scripts`; the design and its guarantees: ``docs/execution.md``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Literal

import redis

from services.queue.config import QueueConfig
from services.queue.connection import connect
from services.queue.entries import entry_fields
from services.queue.keys import Keys
from services.queue.models import NodeStatus
from services.queue.scripts import Scripts
from services.store.trajectories import abort_lost_trajectory

log = logging.getLogger("swerl.queue")

#: Why a task is handed back: its worker was lost (counts towards max_deliveries), its worker
#: shut down, or a queued entry is moved to a node with a free slot.
RequeueKind = Literal["lost", "handback", "rebalance"]


def as_text(value: bytes | str | None) -> str:
    """A Redis reply as text (``None`` is the empty string)."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def as_int(value: bytes | str | None, default: int = 0) -> int:
    return int(value) if value not in (None, b"", "") else default


def as_float(value: bytes | str | None) -> float | None:
    return float(value) if value not in (None, b"", "") else None


class QueueSide:
    """One Redis client with the queue's config, keys and scripts (the base of every side)."""

    def __init__(self, url_or_client: str | redis.Redis, cfg: QueueConfig | None = None) -> None:
        self.cfg = cfg or QueueConfig()
        self.redis = (
            connect(url_or_client, self.cfg) if isinstance(url_or_client, str) else url_or_client
        )
        self.keys = Keys(self.cfg.prefix)
        self.scripts = Scripts(self.redis)

    def close(self) -> None:
        self.redis.close()

    # ------------------------------------------------------------------ shared transitions
    def _requeue(self, task_id: str, entry: str, node: str, reason: str, kind: RequeueKind) -> str:
        """Hand a task back (front of the pending list). See the REQUEUE script.

        The attempt that held ``entry`` is over: its trajectory record, if it is still open,
        is closed as ``aborted`` ("worker lost") so that no record stays open forever
        (:func:`services.store.trajectories.abort_lost_trajectory`; an outcome its worker
        recorded is kept). Trajectory records share the queue's key prefix.
        """
        if kind == "rebalance":  # an entry no worker has read: no attempt ran, no record
            return self._run_requeue(task_id, entry, node, reason, kind)
        before = self.redis.hmget(self.keys.task(task_id), "entry", "attempt")
        status = self._run_requeue(task_id, entry, node, reason, kind)
        if status in ("requeued", "dead") and as_text(before[0]) == entry:
            attempt = as_text(before[1])
            if attempt.isdigit():  # RolloutTask.trajectory_id: one trajectory per attempt
                self._close_lost_record(f"{task_id}.a{attempt}", reason)
        return status

    def _run_requeue(
        self, task_id: str, entry: str, node: str, reason: str, kind: RequeueKind
    ) -> str:
        cfg = self.cfg
        args = [cfg.prefix, task_id, entry, node, reason, kind, cfg.max_deliveries, time.time()]
        return as_text(self.scripts.requeue(args=[*args, cfg.dead_maxlen, cfg.results_maxlen]))

    def _close_lost_record(self, trajectory_id: str, reason: str) -> None:
        try:
            closed = abort_lost_trajectory(self.redis, trajectory_id, reason, self.cfg.prefix)
        except redis.RedisError as exc:
            log.warning("could not close the record of %s (%s)", trajectory_id, exc)
        else:
            if closed == "closed":
                log.info("closed the open record of %s as aborted (worker lost)", trajectory_id)

    def _dead_letter(
        self, node: str, entry: str, fields: dict[bytes, bytes] | dict[str, str], reason: str
    ) -> str:
        """Move an unusable entry to the dead-letter stream, with the reason and its fields."""
        text = entry_fields(fields)
        return as_text(
            self.scripts.dead_letter(
                args=[
                    self.cfg.prefix,
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

    # ------------------------------------------------------------------ shared reads
    def _node_names(self) -> list[str]:
        return sorted(as_text(n) for n in self.redis.smembers(self.keys.nodes))

    def _cluster_state(self, names: Sequence[str]) -> tuple[int, list[NodeStatus], int]:
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
            hb = {as_text(k): as_text(v) for k, v in replies[2 + 2 * i].items()}
            out.append(
                NodeStatus(
                    name=name,
                    alive=bool(hb),
                    slots=as_int(hb.get("slots")),
                    busy=as_int(hb.get("busy")),
                    outstanding=int(replies[3 + 2 * i]),
                    draining=hb.get("draining") == "1",
                    pid=as_int(hb.get("pid")),
                    host=hb.get("host", ""),
                    instance=hb.get("instance", ""),
                    last_seen=as_float(hb.get("ts")) or 0.0,
                )
            )
        return int(replies[0]), out, int(replies[1])

    def _nodes(self) -> list[NodeStatus]:
        return self._cluster_state(self._node_names())[1]
