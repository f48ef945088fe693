"""The jobs in Redis: submit (idempotent), read, list (paginated), cancel, results, logs.

The claim/lease/heartbeat side (runners and trainers) is :mod:`services.api.claims`; both use
the scripts of :mod:`services.api.lua`, so every state change is atomic.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from services.api.lua import APPEND_RESULTS, CANCEL, SUBMIT
from services.api.schemas import Job, JobKind, JobState, LogLine, Progress, TrajectoryCounts

# What a queued job waits for, by kind.
WAITING_FOR = {
    JobKind.TRAIN: "waiting for a trainer of group {group}",
    JobKind.ROLLOUT: "waiting for a rollout job runner",
    JobKind.EVAL: "waiting for an evaluator service (python -m services.eval serve)",
}
# A service that claims jobs of a kind and group announces itself at least this often
# (:meth:`JobStore.announce`); one not heard from for SERVING_WINDOW_S is taken as gone.
ANNOUNCE_INTERVAL_S = 10.0
SERVING_WINDOW_S = 60.0
SERVING_FORGET_S = 7 * 86_400.0  # entries older than this are dropped at the next announce


class IdempotencyConflict(ValueError):
    """The idempotency key was used before for another request."""


class QuotaExceeded(Exception):
    """The submitter already has ``in_flight`` unfinished jobs, its limit ``limit``."""

    def __init__(self, in_flight: int, limit: int) -> None:
        super().__init__(f"{in_flight} jobs in flight (limit {limit})")
        self.in_flight, self.limit = in_flight, limit


@dataclass(frozen=True)
class Submitted:
    job_id: str
    created: bool  # False: the idempotency key returned an earlier job


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _float(value: str | None) -> float | None:
    return float(value) if value not in (None, "") else None


def job_from_hash(h: dict[str, str]) -> Job:
    progress = json.loads(h.get("progress") or "{}")
    metrics = json.loads(h.get("metrics") or "{}")
    rollout = h["kind"] == JobKind.ROLLOUT
    return Job(
        id=h["id"],
        kind=JobKind(h["kind"]),
        state=JobState(h["state"]),
        spec=json.loads(h["spec"]),
        submitted_by=h["submitted_by"],
        created_at=float(h["created_at"]),
        updated_at=float(h["updated_at"]),
        started_at=_float(h.get("started_at")),
        finished_at=_float(h.get("finished_at")),
        attempt=int(h.get("attempt") or 0),
        progress=Progress.model_validate(progress),
        metrics=metrics,
        message=h.get("message", ""),
        trajectories=TrajectoryCounts.from_metrics(metrics) if rollout else None,
    )


class JobStore:
    def __init__(
        self, client: redis.Redis, prefix: str = "swerl:api:", log_lines_kept: int = 10_000
    ) -> None:
        self.redis = client
        self.prefix = prefix
        self.log_lines_kept = log_lines_kept
        self._submit = client.register_script(SUBMIT)
        self._cancel = client.register_script(CANCEL)
        self._append = client.register_script(APPEND_RESULTS)

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    # -- submit, read, list, cancel ---------------------------------------------------------
    def submit(
        self,
        kind: JobKind,
        spec: dict[str, Any],
        submitted_by: str,
        *,
        group: str = "default",
        idempotency_key: str | None = None,
        ttl_s: int = 86_400,
        max_in_flight: int = 0,
    ) -> Submitted:
        """Queue a job; with ``idempotency_key`` the same submitter gets the first job back for
        the same request, and :class:`IdempotencyConflict` for a different one. With
        ``max_in_flight`` > 0, :class:`QuotaExceeded` when the submitter already has that many
        unfinished jobs (checked and counted in one script: exact under concurrency; a retry
        with a known idempotency key is answered before the quota is checked)."""
        spec_json = json.dumps(spec, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(f"{kind}\n{spec_json}".encode()).hexdigest()
        job_id = f"{kind.value}-{time.strftime('%Y%m%d')}-{uuid.uuid4().hex[:10]}"
        idem = ""
        if idempotency_key is not None:
            key_digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]
            idem = self.key("idem", submitted_by, key_digest)
        message = WAITING_FOR[kind].format(group=group)
        args = [self.prefix, job_id, kind.value, group, spec_json, submitted_by, time.time()]
        args += [message, idem, f"{job_id} {digest}", ttl_s, max_in_flight]
        status, value = (_text(v) for v in self._submit(args=args))
        if status == "new":
            return Submitted(job_id, True)
        if status == "quota":
            raise QuotaExceeded(int(value or 0), max_in_flight)
        old_id, _, old_digest = (value or "").partition(" ")
        if old_digest != digest:
            raise IdempotencyConflict(
                f"Idempotency-Key was already used for job {old_id} with a different request"
            )
        return Submitted(old_id, False)

    def get(self, job_id: str) -> Job | None:
        raw = self.redis.hgetall(self.key("job", job_id))
        if not raw:
            return None
        return job_from_hash({_text(k): _text(v) for k, v in raw.items()})  # type: ignore[misc]

    def list_jobs(
        self,
        kind: JobKind | None = None,
        state: JobState | None = None,
        limit: int = 50,
        cursor: int | None = None,
    ) -> tuple[list[Job], int | None]:
        """Newest first; returns the page and the cursor of the next (older) page or None."""
        index = self.key("idx", kind.value if kind else "*", state.value if state else "*")
        top = f"({cursor}" if cursor is not None else "+inf"
        rows = self.redis.zrevrangebyscore(
            index, top, "-inf", start=0, num=limit + 1, withscores=True
        )
        page = rows[:limit]
        pipe = self.redis.pipeline(transaction=False)
        for member, _ in page:
            pipe.hgetall(self.key("job", _text(member) or ""))
        jobs = [
            job_from_hash({_text(k): _text(v) for k, v in raw.items()})  # type: ignore[misc]
            for raw in pipe.execute()
            if raw
        ]
        next_cursor = int(page[-1][1]) if len(rows) > limit else None
        return jobs, next_cursor

    def cancel(self, job_id: str, by: str) -> JobState | None:
        """Cancel: a queued job at once, a running one through its holder (``cancelling``).
        Returns the state after the call (unchanged for a finished job), None if unknown."""
        state = _text(self._cancel(args=[self.prefix, job_id, time.time(), by]))
        return JobState(state) if state else None

    def in_flight(self, submitted_by: str) -> int:
        """How many of the submitter's jobs count against its quota (unfinished ones)."""
        return int(self.redis.scard(self.key("inflight", submitted_by)))

    def count(self, kind: JobKind | None = None, state: JobState | None = None) -> int:
        index = self.key("idx", kind.value if kind else "*", state.value if state else "*")
        return int(self.redis.zcard(index))

    # -- who serves a kind and group (train: trainer groups) --------------------------------
    def announce(self, kind: JobKind, group: str, holder: str, now: float | None = None) -> None:
        """``holder`` (a trainer, evaluator or rollout job runner) claims jobs of ``kind`` and
        ``group``: call it at least every :data:`ANNOUNCE_INTERVAL_S`, busy or idle."""
        now = time.time() if now is None else now
        key = self.key("serving", kind.value, group)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(key, {holder: now})
        pipe.zremrangebyscore(key, "-inf", now - SERVING_FORGET_S)
        pipe.execute()

    def serving(self, kind: JobKind, group: str, within_s: float = SERVING_WINDOW_S) -> list[str]:
        """The holders that announced ``kind`` and ``group`` in the last ``within_s``."""
        key = self.key("serving", kind.value, group)
        rows = self.redis.zrangebyscore(key, time.time() - within_s, "+inf")
        return [_text(r) or "" for r in rows]

    # -- results ----------------------------------------------------------------------------
    def append_results(
        self, job_id: str, holder: str, results: Iterable[dict[str, Any]], *, reset: bool = False
    ) -> bool:
        """Append result rows as the job's holder (``reset`` empties them first: a new
        holder re-reads everything). False when ``holder`` no longer holds the job."""
        items = [json.dumps(r, separators=(",", ":")) for r in results]
        n = self._append(args=[self.prefix, job_id, holder, "1" if reset else "0", *items])
        return int(n) >= 0

    def results(self, job_id: str, offset: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        key = self.key("job", job_id, "results")
        pipe = self.redis.pipeline(transaction=False)
        pipe.lrange(key, offset, offset + limit - 1)
        pipe.llen(key)
        rows, total = pipe.execute()
        return [json.loads(r) for r in rows], int(total)

    # -- logs -------------------------------------------------------------------------------
    def log(self, job_id: str, message: str, level: str = "INFO") -> None:
        """Append a log line; only the newest ``log_lines_kept`` lines are kept (offsets of
        a followed log then jump ahead: trimmed lines are gone)."""
        line = LogLine(ts=time.time(), level=level, message=message).model_dump_json()
        key = self.key("job", job_id, "logs")
        pipe = self.redis.pipeline(transaction=False)
        pipe.rpush(key, line)
        pipe.ltrim(key, -self.log_lines_kept, -1)
        pipe.execute()

    def logs(self, job_id: str, offset: int, limit: int) -> tuple[list[LogLine], int]:
        rows = self.redis.lrange(self.key("job", job_id, "logs"), offset, offset + limit - 1)
        lines = [LogLine.model_validate_json(r) for r in rows]
        return lines, offset + len(lines)
