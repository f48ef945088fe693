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
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from services.api.lua import CLAIM, FINISH, HEARTBEAT
from services.api.schemas import JobKind, JobState, Progress
from services.queue.connection import TRANSIENT_ERRORS

log = logging.getLogger("swerl.api.claims")


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


class LeaseKeeper:
    """Heartbeats one claimed job from a background thread, for holders whose work runs
    elsewhere (a trainer waiting on its torchrun):

        with LeaseKeeper(claims, job.job_id, holder, ttl_s=30, report=read_progress) as lease:
            while proc.poll() is None and not lease.cancel_requested.is_set():
                if lease.lost.is_set():
                    ...  # another trainer holds the job now: stop the work, report nothing
                time.sleep(1)

    Every ``interval_s`` (default ``ttl_s / 3``) it calls :meth:`JobClaims.heartbeat` with what
    ``report()`` returns (progress, metrics; either may be None to keep the last). It sets
    ``cancel_requested`` when the job is being cancelled and ``lost`` (then stops) when the
    lease is gone. A Redis error is retried at the next beat: the lease outlives short outages.
    """

    def __init__(
        self,
        claims: JobClaims,
        job_id: str,
        holder: str,
        ttl_s: float,
        *,
        interval_s: float | None = None,
        report: Callable[[], tuple[Progress | None, dict[str, float] | None]] | None = None,
    ) -> None:
        self.claims, self.job_id, self.holder, self.ttl_s = claims, job_id, holder, ttl_s
        self.interval_s = interval_s if interval_s is not None else ttl_s / 3
        if not 0 < self.interval_s < ttl_s:
            raise ValueError("interval_s must be > 0 and shorter than ttl_s")
        self.report = report
        self.cancel_requested = threading.Event()
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{job_id}", daemon=True)

    def _beat(self) -> None:
        progress, metrics = self.report() if self.report else (None, None)
        state = self.claims.heartbeat(self.job_id, self.holder, self.ttl_s, progress, metrics)
        if state is None:
            self.lost.set()
        elif state is JobState.CANCELLING:
            self.cancel_requested.set()

    def _run(self) -> None:
        while not self._stop.is_set() and not self.lost.is_set():
            try:
                self._beat()
            except TRANSIENT_ERRORS as exc:
                log.warning("heartbeat of job %s failed (%s); retrying", self.job_id, exc)
            self._stop.wait(self.interval_s)

    def start(self) -> LeaseKeeper:
        self._beat()  # the first beat at once: a lost or cancelled job is known before work
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 10)

    def __enter__(self) -> LeaseKeeper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
