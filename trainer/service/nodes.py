"""The nodes of a multi-node trainer group in Redis: who is present, what job they run, and
how each follower's process ended.

A train job with ``trainer_service.nnodes = N > 1`` runs one torchrun per node. The trainer
service on node rank 0 (the leader) claims the job; the services on ranks ``1 .. N-1`` (the
followers, :mod:`trainer.service.follower`) never claim, they join it. Keys, under the job
API's prefix:

* ``trainer:<group>:node:<rank>`` -- a follower's presence: its holder name, with a TTL it
  refreshes (``lease_ttl_s``). The leader claims only when every follower is present, and a
  rank held by another live holder is refused (two nodes with one ``NODE_RANK`` would break
  the rendezvous).
* ``trainer:<group>:assignment`` -- the running job (:class:`Assignment`: job id, attempt, the
  run config's text, ``resume``), with a TTL the leader refreshes at each heartbeat and
  deleted when its process ends (a dead leader's runs out). Followers run the assignment's
  job and stop their process when it changes or disappears.
* ``trainer:<group>:exits`` -- a hash ``<job>/<attempt>/<rank>`` -> exit status of each
  follower's process; a non-zero one makes the leader stop its own and fail the job at once
  (instead of waiting for the collective timeout).
"""

from __future__ import annotations

import json
import logging

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.protocol.ids import Ident

log = logging.getLogger("swerl.trainer.nodes")

EXITS_TTL_S = 7 * 24 * 3600
# Delete the key only while it still holds the value this holder wrote.
DELETE_IF_SAME = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# Extend the key's TTL only while it still holds the value this holder wrote.
EXPIRE_IF_SAME = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


class NodeError(ValueError):
    """A malformed record in the node keys."""


class Assignment(BaseModel):
    """The job the followers of a group run now (the leader's claim of it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: Ident
    attempt: int = Field(ge=1)
    config: str = Field(min_length=1, description="the run config's YAML text (run.yaml)")
    resume: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return self.job_id, self.attempt


class NodeDirectory:
    """The node keys of one trainer group (see the module docstring)."""

    def __init__(self, client: redis.Redis, prefix: str, group: str) -> None:
        self.redis = client
        self.base = f"{prefix}trainer:{group}:"
        self._delete_if_same = client.register_script(DELETE_IF_SAME)
        self._expire_if_same = client.register_script(EXPIRE_IF_SAME)

    def _node(self, rank: int) -> str:
        return f"{self.base}node:{rank}"

    @property
    def _assignment(self) -> str:
        return f"{self.base}assignment"

    @property
    def _exits(self) -> str:
        return f"{self.base}exits"

    # -- presence ---------------------------------------------------------------------------
    def announce(self, rank: int, holder: str, ttl_s: float) -> str | None:
        """Mark ``rank`` present as ``holder`` for ``ttl_s``; the other holder's name when a
        live one has it (nothing changes then)."""
        ttl_ms = int(ttl_s * 1000)
        if self.redis.set(self._node(rank), holder, nx=True, px=ttl_ms):
            return None
        if self._expire_if_same(keys=[self._node(rank)], args=[holder, ttl_ms]):
            return None
        other = self.redis.get(self._node(rank))
        if other is None:  # expired in between: take it
            return self.announce(rank, holder, ttl_s)
        return other.decode() if isinstance(other, bytes) else str(other)

    def leave(self, rank: int, holder: str) -> None:
        self._delete_if_same(keys=[self._node(rank)], args=[holder])

    def missing(self, nnodes: int) -> list[int]:
        """The follower ranks ``1 .. nnodes-1`` that are not present."""
        ranks = list(range(1, nnodes))
        if not ranks:
            return []
        present = self.redis.mget([self._node(r) for r in ranks])
        return [r for r, holder in zip(ranks, present, strict=True) if holder is None]

    # -- the assignment ---------------------------------------------------------------------
    def assign(self, assignment: Assignment, ttl_s: float) -> str:
        """Publish ``assignment`` (replacing any other); the stored value (for :meth:`refresh`
        and :meth:`clear`)."""
        value = assignment.model_dump_json()
        self.redis.set(self._assignment, value, px=int(ttl_s * 1000))
        return value

    def refresh(self, value: str, ttl_s: float) -> bool:
        """Extend the assignment's TTL while it is still ``value``."""
        return bool(self._expire_if_same(keys=[self._assignment], args=[value, int(ttl_s * 1000)]))

    def clear(self, value: str) -> None:
        """Withdraw the assignment if it is still ``value`` (the followers stop)."""
        self._delete_if_same(keys=[self._assignment], args=[value])

    def assignment(self) -> Assignment | None:
        """The current assignment (None: none); NodeError when the stored value is malformed."""
        raw = self.redis.get(self._assignment)
        if raw is None:
            return None
        try:
            return Assignment.model_validate_json(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '-'}: {e['msg']}"
                                 for e in exc.errors())  # fmt: skip
            raise NodeError(f"malformed assignment in {self._assignment}: {problems}") from None

    # -- follower exits ---------------------------------------------------------------------
    def report_exit(self, assignment: Assignment, rank: int, code: int) -> None:
        field = f"{assignment.job_id}/{assignment.attempt}/{rank}"  # "/" is in no id
        pipe = self.redis.pipeline()
        pipe.hset(self._exits, field, json.dumps(code))
        pipe.expire(self._exits, EXITS_TTL_S)
        pipe.execute()

    def failed_followers(self, job_id: str, attempt: int) -> dict[int, int]:
        """``rank -> exit status`` of the followers whose process of that attempt failed."""
        failed: dict[int, int] = {}
        prefix = f"{job_id}/{attempt}/"
        for field, value in self.redis.hscan_iter(self._exits, match=f"{prefix}*"):
            name = field.decode() if isinstance(field, bytes) else str(field)
            try:
                rank, code = int(name[len(prefix) :]), int(json.loads(value))
            except (ValueError, TypeError):
                log.warning("ignoring a malformed exit record %r = %r", name, value)
                continue
            if code != 0:
                failed[rank] = code
        return failed
