"""Trajectory records in Redis: written through by the adapter, read by every other service.

Keys, all under one prefix (default ``swerl:``), for trajectory ``ID``:

* ``{prefix}traj:{ID}:info`` -- hash: ``meta`` (TrajectoryMeta JSON), ``status`` (``open`` or
  ``closed``), ``outcome`` (Outcome JSON, once known), ``closed_at``, ``token_sha256`` (digest
  of the trajectory's bearer token, see :mod:`adapter.auth`; absent when none was issued);
* ``{prefix}traj:{ID}:entries`` -- list of binary record entries (a segment header, then that
  segment's turns, ...; see :meth:`TrajectoryRecord.to_entries`), appended as turns complete;
* ``{prefix}traj:{ID}:counters`` -- hash of integer counters (turns, segments,
  history_mismatch, prefix_mismatch, generated/observation/prompt tokens, infra_failures, ...);
* ``{prefix}traj:index`` -- sorted set of trajectory ids by creation time.

Each append is one MULTI/EXEC transaction (entries and counters move together), so a reader never
sees a turn without its counters. Token data stays binary (packed int32/float32) end to end.

The async store uses a *blocking*, sized connection pool: when every connection is busy a call
waits for one to be released (up to ``pool_timeout_s``) instead of failing at once, as redis-py's
default pool does past 100 connections; only a wait that times out raises
:class:`StoreBusyError` (a ``redis.exceptions.ConnectionError``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

from services.protocol import Outcome, OutcomeStatus, TrajectoryMeta, TrajectoryRecord

DEFAULT_PREFIX = "swerl:"
DEFAULT_MAX_CONNECTIONS = 128
DEFAULT_POOL_TIMEOUT_S = 300.0
# redis-py's 5 s socket (and connect) timeout is too short for an adapter loop busy with
# a thousand requests; an unreachable Redis is still detected at once (connection refused).
SOCKET_TIMEOUT_S = 30.0


class TrajectoryNotFoundError(KeyError):
    """No trajectory with that id was ever opened."""


class TrajectoryExistsError(ValueError):
    """A trajectory with that id is already open or recorded."""


class StoreBusyError(redis.exceptions.ConnectionError):
    """No pooled Redis connection became free within the pool timeout."""


class WaitingConnectionPool(aioredis.BlockingConnectionPool):
    """A blocking pool whose timeout says what happened (:class:`StoreBusyError`)."""

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().get_connection(*args, **kwargs)
        except redis.exceptions.ConnectionError as exc:
            if not isinstance(exc.__cause__, asyncio.TimeoutError):
                raise
            raise StoreBusyError(
                f"no Redis connection became free within {self.timeout:g} s: all "
                f"{self.max_connections} pooled connections stayed busy "
                "(adapter.redis_max_connections / redis_pool_timeout_s)"
            ) from exc


@dataclass(frozen=True)
class TrajectoryKeys:
    prefix: str
    trajectory_id: str

    @property
    def info(self) -> str:
        return f"{self.prefix}traj:{self.trajectory_id}:info"

    @property
    def entries(self) -> str:
        return f"{self.prefix}traj:{self.trajectory_id}:entries"

    @property
    def counters(self) -> str:
        return f"{self.prefix}traj:{self.trajectory_id}:counters"

    @staticmethod
    def index(prefix: str) -> str:
        return f"{prefix}traj:index"


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else value


def _counters(raw: dict[Any, Any]) -> dict[str, int]:
    return {str(_text(k)): int(v) for k, v in raw.items()}


def _build(
    info: dict[Any, Any], entries: list[bytes], counters: dict[Any, Any]
) -> TrajectoryRecord:
    fields = {_text(k): v for k, v in info.items()}
    meta = TrajectoryMeta.model_validate_json(fields["meta"])
    raw_outcome = fields.get("outcome")
    outcome = Outcome.model_validate_json(raw_outcome) if raw_outcome else None
    return TrajectoryRecord.from_entries(meta, list(entries), outcome, _counters(counters))


class TrajectoryStore:
    """Async access to trajectory records (used by the adapter)."""

    def __init__(self, client: aioredis.Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self.client = client
        self.prefix = prefix

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S,
    ) -> TrajectoryStore:
        """A store on a blocking pool of at most ``max_connections`` connections; a call waits
        up to ``pool_timeout_s`` for a free one, then raises :class:`StoreBusyError`."""
        if max_connections < 1 or pool_timeout_s <= 0:
            raise ValueError("max_connections must be >= 1 and pool_timeout_s > 0")
        pool = WaitingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=pool_timeout_s,
            decode_responses=False,
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=SOCKET_TIMEOUT_S,
        )
        return cls(aioredis.Redis.from_pool(pool), prefix)

    def keys(self, trajectory_id: str) -> TrajectoryKeys:
        return TrajectoryKeys(self.prefix, trajectory_id)

    async def close_connection(self) -> None:
        await self.client.aclose()

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def open(self, meta: TrajectoryMeta, token_digest: str | None = None) -> None:
        """Create the record; :class:`TrajectoryExistsError` if the id is already taken."""
        keys = self.keys(meta.trajectory_id)
        created = await self.client.hsetnx(keys.info, "meta", meta.model_dump_json())
        if not created:
            raise TrajectoryExistsError(f"trajectory {meta.trajectory_id!r} already exists")
        fields = {"status": "open"}
        if token_digest is not None:
            fields["token_sha256"] = token_digest
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(keys.info, mapping=fields)
            pipe.zadd(TrajectoryKeys.index(self.prefix), {meta.trajectory_id: meta.created_at})
            await pipe.execute()

    async def status(self, trajectory_id: str) -> str | None:
        """``open``, ``closed``, or None for an unknown id."""
        return _text(await self.client.hget(self.keys(trajectory_id).info, "status"))

    async def token_digest(self, trajectory_id: str) -> str | None:
        """The stored digest of the trajectory's bearer token (None: none was issued)."""
        return _text(await self.client.hget(self.keys(trajectory_id).info, "token_sha256"))

    async def append(
        self, trajectory_id: str, entries: list[bytes], counters: dict[str, int]
    ) -> None:
        """Append binary entries and add to counters, atomically."""
        keys = self.keys(trajectory_id)
        async with self.client.pipeline(transaction=True) as pipe:
            if entries:
                pipe.rpush(keys.entries, *entries)
            for name, delta in counters.items():
                pipe.hincrby(keys.counters, name, delta)
            await pipe.execute()

    async def counters(self, trajectory_id: str) -> dict[str, int]:
        return _counters(await self.client.hgetall(self.keys(trajectory_id).counters))

    async def outcome(self, trajectory_id: str) -> Outcome | None:
        raw = await self.client.hget(self.keys(trajectory_id).info, "outcome")
        return Outcome.model_validate_json(raw) if raw else None

    async def mark_infra_failure(self, trajectory_id: str, reason: str) -> None:
        """Record an infrastructure failure: outcome ``aborted`` (excluded from training)."""
        keys = self.keys(trajectory_id)
        outcome = Outcome(status=OutcomeStatus.ABORTED, abort_reason=reason)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(keys.info, "outcome", outcome.model_dump_json())
            pipe.hincrby(keys.counters, "infra_failures", 1)
            await pipe.execute()

    async def close(self, trajectory_id: str, outcome: Outcome | None) -> Outcome | None:
        """Mark closed and store ``outcome``, unless an infrastructure abort is already recorded
        (an aborted trajectory stays aborted: it must never be scored). Returns the outcome kept.
        """
        keys = self.keys(trajectory_id)
        current = await self.outcome(trajectory_id)
        kept = current if current is not None and not current.trainable else outcome or current
        mapping: dict[str, Any] = {"status": "closed", "closed_at": str(time.time())}
        if kept is not None:
            mapping["outcome"] = kept.model_dump_json()
        await self.client.hset(keys.info, mapping=mapping)
        return kept

    async def raw_entries(self, trajectory_id: str) -> list[bytes]:
        entries: list[bytes] = await self.client.lrange(self.keys(trajectory_id).entries, 0, -1)
        return entries

    async def load(self, trajectory_id: str) -> TrajectoryRecord:
        keys = self.keys(trajectory_id)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.info)
            pipe.lrange(keys.entries, 0, -1)
            pipe.hgetall(keys.counters)
            info, entries, counters = await pipe.execute()
        if not info or b"meta" not in info:
            raise TrajectoryNotFoundError(trajectory_id)
        return _build(info, entries, counters)

    async def memory_usage(self, trajectory_id: str) -> int:
        """Bytes Redis uses for the record's keys (``MEMORY USAGE``, all samples)."""
        keys = self.keys(trajectory_id)
        total = 0
        for key in (keys.info, keys.entries, keys.counters):
            used = await self.client.memory_usage(key, samples=0)
            total += int(used or 0)
        return total


def load_trajectory(
    client: redis.Redis, trajectory_id: str, prefix: str = DEFAULT_PREFIX
) -> TrajectoryRecord:
    """Synchronous loader for other services (trainer, rollout manager).

    ``client`` must be created with ``decode_responses=False`` (token data is binary).
    """
    keys = TrajectoryKeys(prefix, trajectory_id)
    pipe = client.pipeline(transaction=True)
    pipe.hgetall(keys.info)
    pipe.lrange(keys.entries, 0, -1)
    pipe.hgetall(keys.counters)
    info, entries, counters = pipe.execute()
    if not info or b"meta" not in info:
        raise TrajectoryNotFoundError(trajectory_id)
    return _build(info, entries, counters)


# KEYS: info hash, counters hash. ARGV: aborted Outcome JSON, now.
# Closes a record whose worker is gone: the outcome becomes the given abort unless one is
# already recorded (a worker's outcome, or the adapter's own infrastructure abort, is kept).
# Returns 'closed' (this call wrote the abort), 'kept' (an outcome was there: only the status
# is closed) or 'missing' (no record: the attempt never opened one).
_ABORT_LOST = r"""
if redis.call('HEXISTS', KEYS[1], 'meta') == 0 then return 'missing' end
local h = redis.call('HMGET', KEYS[1], 'status', 'outcome', 'closed_at')
if h[2] and h[2] ~= '' then
  if h[1] ~= 'closed' then
    redis.call('HSET', KEYS[1], 'status', 'closed', 'closed_at', h[3] or ARGV[2])
  end
  return 'kept'
end
redis.call('HSET', KEYS[1], 'status', 'closed', 'outcome', ARGV[1], 'closed_at', h[3] or ARGV[2])
redis.call('HINCRBY', KEYS[2], 'worker_lost', 1)
return 'closed'
"""

WORKER_LOST = "worker lost"


def abort_lost_trajectory(
    client: redis.Redis, trajectory_id: str, detail: str, prefix: str = DEFAULT_PREFIX
) -> str:
    """Close the record of an attempt whose worker is gone as ``aborted`` ("worker lost").

    Called when the attempt is re-queued (its worker died or was stopped), so no record stays
    ``open`` forever. Atomic and idempotent; an outcome already recorded (by the worker, or the
    adapter's infrastructure abort) is never overwritten. Returns ``closed``, ``kept`` or
    ``missing`` (see :data:`_ABORT_LOST`).
    """
    keys = TrajectoryKeys(prefix, trajectory_id)
    reason = f"{WORKER_LOST}: {detail}" if detail else WORKER_LOST
    outcome = Outcome(status=OutcomeStatus.ABORTED, abort_reason=reason[:2000])
    script = client.register_script(_ABORT_LOST)  # EVALSHA, loading the script when missing
    result = script(
        keys=[keys.info, keys.counters], args=[outcome.model_dump_json(), str(time.time())]
    )
    return str(_text(result))


def list_trajectories(client: redis.Redis, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Ids of all recorded trajectories, oldest first."""
    ids = client.zrange(TrajectoryKeys.index(prefix), 0, -1)
    return [str(_text(i)) for i in ids]
