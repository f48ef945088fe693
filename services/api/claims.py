"""The claim / lease / heartbeat protocol between the job API and whatever executes jobs.

Who uses it: the rollout job runner (:mod:`services.api.runner`, several jobs at once) and the
trainer service (one active train job per trainer group, ``max_active=1``). The protocol:

1. ``claim(kind, group, holder, ttl_s, max_active)`` takes the oldest queued job of
   ``<kind>/<group>`` unless the group already has ``max_active`` jobs under lease; the job
   becomes ``running`` with ``holder`` and a lease of ``ttl_s``; its ``attempt`` counts claims.
   Before claiming, every expired lease of the group goes back to the queue (state ``queued``,
   same place in line): a crashed holder's job is resumed by the next claimer (a trainer with
   ``resume`` from the job's checkpoint dir).
2. ``heartbeat(job, holder, ttl_s, progress, metrics)`` extends the lease (call it well inside
   ``ttl_s``) and publishes progress; it answers the job's state: ``cancelling`` means stop
   the work and ``finish(..., CANCELLED)``; ``None`` means the lease is lost (expired and
   taken by another holder, or the job was finished): stop at once, write nothing more.
3. ``finish(job, holder, state, message)`` ends the job (succeeded / failed / cancelled), or
   with ``QUEUED`` gives it back (a holder shutting down cleanly); a job being cancelled that
   is given back is cancelled.

All three are single Lua scripts (:mod:`services.api.lua`), so two claimers never get the same
job and a stale holder can never overwrite its successor.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

from services.api.lua import CLAIM, FINISH, HEARTBEAT
from services.api.schemas import JobKind, JobState, Progress


@dataclass(frozen=True)
class Claim:
    job_id: str
    attempt: int  # 1 on the first claim; more when a lost lease was taken over


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class JobClaims:
    def __init__(self, client: redis.Redis, prefix: str = "swerl:api:") -> None:
        self.redis = client
        self.prefix = prefix
        self._claim = client.register_script(CLAIM)
        self._heartbeat = client.register_script(HEARTBEAT)
        self._finish = client.register_script(FINISH)

    def claim(
        self, kind: JobKind, group: str, holder: str, ttl_s: float, max_active: int = 1
    ) -> Claim | None:
        if max_active < 1 or ttl_s <= 0:
            raise ValueError("max_active must be >= 1 and ttl_s > 0")
        now = time.time()
        args = [self.prefix, kind.value, group, holder, int(now * 1000), int(ttl_s * 1000)]
        got = self._claim(args=[*args, max_active, now])
        if not got:
            return None
        return Claim(_text(got[0]), int(got[1]))

    def heartbeat(
        self,
        job_id: str,
        holder: str,
        ttl_s: float,
        progress: Progress | None = None,
        metrics: dict[str, float] | None = None,
    ) -> JobState | None:
        now = time.time()
        prog = progress.model_dump_json() if progress is not None else ""
        mets = json.dumps(metrics) if metrics is not None else ""
        args = [self.prefix, job_id, holder, int(now * 1000), int(ttl_s * 1000), now, prog, mets]
        state = _text(self._heartbeat(args=args))
        return None if state == "lost" else JobState(state)

    def finish(self, job_id: str, holder: str, state: JobState, message: str = "") -> bool:
        """End (or with ``QUEUED`` give back) the job; False when ``holder`` lost it."""
        if state in (JobState.RUNNING, JobState.CANCELLING):
            raise ValueError(f"finish takes a final state or queued, not {state}")
        args = [self.prefix, job_id, holder, state.value, message, time.time()]
        return _text(self._finish(args=args)) == "ok"

    def spec(self, job_id: str) -> dict[str, Any]:
        raw = self.redis.hget(f"{self.prefix}job:{job_id}", "spec")
        if raw is None:
            raise KeyError(job_id)
        return json.loads(raw)
