"""Progress events of running trajectories in Redis (:mod:`services.protocol.progress`).

Keys, under the queue's prefix (default ``swerl:``), for batch ``B`` (a rollout job's batch id
is its job id):

* ``{prefix}batch:{B}:progress`` -- STREAM of events, one field ``event`` (TrajectoryProgress
  JSON), trimmed to about :data:`PROGRESS_MAXLEN` entries (``XADD MAXLEN ~``): the history
  ``swerl logs`` prints;
* ``{prefix}batch:{B}:progress:latest`` -- HASH trajectory id -> its latest event: what
  ``GET /v1/jobs/{id}/progress`` and ``swerl status --watch`` show, exact however long the
  stream has been trimmed.

Both expire :data:`PROGRESS_TTL_S` after the batch's last event (every write renews the TTL).

The turn and token counts come from the adapter's record counters
(``{prefix}traj:{ID}:counters``, :mod:`services.store.trajectories`): the adapter updates them
atomically with every recorded turn, whatever agent or runner made the call, so the worker reads
them (one pipelined round trip per emission, never per turn) instead of counting on its own.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import redis
from pydantic import ValidationError

from services.protocol.progress import TrajectoryProgress
from services.store.trajectories import DEFAULT_PREFIX, TrajectoryKeys

log = logging.getLogger("swerl.store.progress")

#: Approximate cap of a batch's event stream (about 400 bytes an event: ~1 MB a batch).
PROGRESS_MAXLEN = 2_000
#: A batch's progress keys are deleted this long after its last event.
PROGRESS_TTL_S = 86_400
#: A stream position: ``0`` (from the start) or an entry id ``<ms>-<seq>``.
STREAM_ID_PATTERN = r"^\d{1,19}(-\d{1,19})?$"  # below 2**64: a valid id
TOKEN_COUNTERS = ("prompt_tokens", "observation_tokens", "generated_tokens")


def progress_stream_key(batch_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    return f"{prefix}batch:{batch_id}:progress"


def progress_latest_key(batch_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    return f"{prefix}batch:{batch_id}:progress:latest"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _parse(raw: bytes | str | None) -> TrajectoryProgress | None:
    """An event, or None for one that does not validate (logged, skipped: events are advisory)."""
    if raw is None:
        return None
    try:
        return TrajectoryProgress.model_validate_json(raw)
    except ValidationError as exc:
        log.warning("skipping an invalid progress event: %s", exc.errors()[0]["msg"])
        return None


def _event_field(fields: dict[bytes, bytes] | dict[str, str]) -> bytes | str | None:
    """A stream entry's ``event`` field (a client with or without decode_responses)."""
    text = {_text(k): v for k, v in fields.items()}
    return text.get("event")


class ProgressStore:
    """Write and read progress events (thread-safe: redis-py pools connections)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = DEFAULT_PREFIX,
        maxlen: int = PROGRESS_MAXLEN,
        ttl_s: int = PROGRESS_TTL_S,
    ) -> None:
        if maxlen < 1 or ttl_s < 1:
            raise ValueError("maxlen and ttl_s must be >= 1")
        self.redis, self.prefix, self.maxlen, self.ttl_s = client, prefix, maxlen, ttl_s

    def emit(self, *events: TrajectoryProgress) -> None:
        """Append each event to its batch's stream and make it its trajectory's latest (one
        round trip for all)."""
        if not events:
            return
        pipe = self.redis.pipeline(transaction=False)
        for event in events:
            stream = progress_stream_key(event.batch_id, self.prefix)
            latest = progress_latest_key(event.batch_id, self.prefix)
            data = event.model_dump_json()
            pipe.xadd(stream, {"event": data}, maxlen=self.maxlen, approximate=True)
            pipe.hset(latest, event.trajectory_id, data)
            pipe.expire(stream, self.ttl_s)
            pipe.expire(latest, self.ttl_s)
        pipe.execute()

    def latest(self, batch_id: str) -> list[TrajectoryProgress]:
        """The latest event of every trajectory of the batch, oldest start first."""
        raw = self.redis.hvals(progress_latest_key(batch_id, self.prefix))
        events = [e for e in map(_parse, raw) if e is not None]
        return sorted(events, key=lambda e: (e.started_at, e.trajectory_id))

    def events(
        self, batch_id: str, after: str = "0", count: int = 500
    ) -> tuple[str, list[TrajectoryProgress]]:
        """Up to ``count`` events after stream id ``after`` (``0``: from the oldest kept);
        returns (the id to pass as ``after`` next, the events)."""
        if not re.match(STREAM_ID_PATTERN, after):
            raise ValueError(f"after must be 0 or a stream id <ms>-<seq>, got {after!r}")
        start = f"({after}" if after != "0" else "-"
        rows = self.redis.xrange(progress_stream_key(batch_id, self.prefix), start, "+", count)
        last = _text(rows[-1][0]) if rows else after
        out = [e for _, fields in rows if (e := _parse(_event_field(fields))) is not None]
        return last, out

    def record_counts(self, trajectory_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """(turns, tokens) of each trajectory's record so far, in one round trip; a trajectory
        without a record yet counts (0, 0)."""
        if not trajectory_ids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for tid in trajectory_ids:
            pipe.hmget(TrajectoryKeys(self.prefix, tid).counters, "turns", *TOKEN_COUNTERS)
        out = {}
        for tid, values in zip(trajectory_ids, pipe.execute(), strict=True):
            turns, *tokens = (int(v) if v else 0 for v in values)
            out[tid] = (turns, sum(tokens))
        return out
