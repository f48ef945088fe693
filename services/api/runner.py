"""The rollout job runner: claims rollout jobs from Redis and drives them through the rollout
manager (:class:`services.manager.client.RolloutManager`).

Where it runs: ``api.runner.concurrency`` threads of the API process (``python -m services.api``;
``--runner-only`` runs them without the HTTP server, e.g. on another host). Each thread claims
one job at a time (:mod:`services.api.claims`), turns it into a :class:`RolloutRequest` whose
batch id is the job id, follows the batch's results into the job's result list, heartbeats
progress and a metrics summary, and forwards a cancel to the batch. If a runner dies, its lease
expires and another runner takes the job over: re-submitting the same request is a no-op for
the manager, and the new holder re-reads every result of the batch from the start.

The tasks themselves are dispatched by the manager's dispatch loop (``python -m
services.manager``, or ``api.runner.dispatcher: true`` to run it in this process) onto the
sandbox workers.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections import Counter
from typing import Any

from services.api.claims import Claim, JobClaims
from services.api.config import ApiConfig
from services.api.schemas import JobKind, JobState, Progress, RolloutSpec, TrajectoryCounts
from services.api.store import JobStore
from services.manager.client import RolloutManager
from services.manager.config import ManagerConfig
from services.protocol.tasks import RolloutRequest, TaskResult
from services.queue.connection import TRANSIENT_ERRORS, backoff_sleep, connect
from services.queue.submitter import SubmitterQueue

log = logging.getLogger("swerl.api.runner")
GROUP = "default"  # rollout jobs form one group: any runner takes any job
ABORTED = "aborted"  # the one status without a reward: an infrastructure failure
REASONS_SHOWN = 2  # the most common abort reasons a job's final message quotes
REASON_CHARS = 300


def result_row(result: TaskResult, spec: RolloutSpec) -> dict[str, Any]:
    """One trajectory of a rollout job as the API returns it."""
    _, index, sample = result.task_id.rsplit(":", 2)
    out = result.outcome
    return {
        "task_id": result.task_id,
        "instance_id": spec.instance_ids[int(index)],
        "sample_index": int(sample),
        "trajectory_id": result.trajectory_id,
        "node": result.node,
        "attempt": result.attempt,
        "status": out.status.value,
        "reward": out.reward,
        "abort_reason": out.abort_reason,
        "n_turns": out.n_turns,
        "n_tokens": out.n_tokens,
        "patch": out.patch,
        "finished_at": result.finished_at,
    }


class Tally:
    """The metrics summary of a rollout job: counts by status, how the trajectories ended
    (:class:`TrajectoryCounts`), mean reward, resolved rate, and why trajectories aborted."""

    def __init__(self) -> None:
        self.statuses: Counter[str] = Counter()
        self.rewards: list[float] = []
        self.abort_reasons: Counter[str] = Counter()

    def add(self, row: dict[str, Any]) -> None:
        self.statuses[row["status"]] += 1
        if row["reward"] is not None:
            self.rewards.append(float(row["reward"]))
        elif row["status"] == ABORTED:
            self.abort_reasons[str(row.get("abort_reason") or "no reason given")] += 1

    def counts(self) -> TrajectoryCounts:
        """Graded (a reward, 0 included) versus aborted (infrastructure, no reward)."""
        return TrajectoryCounts(
            total=sum(self.statuses.values()),
            graded=len(self.rewards),
            resolved=sum(r > 0 for r in self.rewards),
            aborted=self.statuses[ABORTED],
        )

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {f"n_{k}": float(v) for k, v in sorted(self.statuses.items())}
        if self.rewards:
            out["mean_reward"] = sum(self.rewards) / len(self.rewards)
            out["resolved_rate"] = sum(r > 0 for r in self.rewards) / len(self.rewards)
        return out

    def reasons(self) -> str:
        """The most common abort reasons, with their counts."""
        top = self.abort_reasons.most_common(REASONS_SHOWN)
        shown = "; ".join(f"{n}x {reason[:REASON_CHARS]}" for reason, n in top)
        rest = len(self.abort_reasons) - len(top)
        return shown + (f"; {rest} other reason(s) in the results" if rest > 0 else "")


def final_state(tally: Tally, cancelled: bool) -> tuple[JobState, str]:
    """How a rollout job ends and the message that says why: cancelled when asked; failed
    when no trajectory was graded (every one aborted: an infrastructure failure, or nothing
    came back); otherwise succeeded, with the counts (a reward of 0 is a normal result)."""
    counts = tally.counts()
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(tally.statuses.items()))
    if cancelled:
        return JobState.CANCELLED, f"cancelled ({statuses or 'no results'})"
    if counts.total == 0:
        return JobState.FAILED, "no trajectory results came back"
    graded = f"{counts.graded} graded ({counts.resolved} resolved)"
    if counts.aborted == 0:
        return JobState.SUCCEEDED, f"{counts.total} trajectories: {graded}; {statuses}"
    aborted = f"{counts.aborted} aborted by infrastructure failures (not graded): {tally.reasons()}"
    if counts.graded == 0:
        return JobState.FAILED, f"all {counts.total} trajectories failed: {aborted}"
    return JobState.SUCCEEDED, f"{counts.total} trajectories: {graded}, {aborted}"


class RolloutJobRunner:
    def __init__(self, cfg: ApiConfig) -> None:
        self.cfg = cfg
        self.client = connect(cfg.redis_url, cfg.queue)
        self.store = JobStore(self.client, cfg.key_prefix, cfg.log_lines_kept)
        self.claims = JobClaims(self.client, cfg.key_prefix)
        manager_cfg = ManagerConfig(redis_url=cfg.redis_url, queue=cfg.queue)
        self.manager = RolloutManager(cfg=manager_cfg, queue=SubmitterQueue(self.client, cfg.queue))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def start(self) -> None:
        if self.cfg.runner.dispatcher:
            self.manager.start()
        for i in range(self.cfg.runner.concurrency):
            thread = threading.Thread(
                target=self._loop, args=(f"runner:{self.name}:{i}",), daemon=True,
                name=f"rollout-job-runner-{i}",
            )  # fmt: skip
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.cfg.runner.poll_interval_s + 10)
        self._threads.clear()
        self.manager.stop()
        self.client.close()

    def _loop(self, holder: str) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                job = self.claims.claim(
                    JobKind.ROLLOUT, GROUP, holder, self.cfg.runner.lease_ttl_s, max_active=10**6
                )
                failures = 0
                if job is None:
                    self._stop.wait(self.cfg.runner.poll_interval_s)
                    continue
                self._drive_or_fail(job, holder)
            except TRANSIENT_ERRORS as exc:
                failures += 1
                log.warning("%s: Redis unreachable (%s); retrying", holder, exc)
                backoff_sleep(failures, self._stop)

    def _drive_or_fail(self, job: Claim, holder: str) -> None:
        """:meth:`drive`; a bug or an unexpected answer fails the job (with the reason) instead
        of killing the runner thread. Redis outages propagate: the lease then runs out and the
        job is taken over once Redis is back."""
        try:
            self.drive(job, holder)
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:
            log.exception("%s: job %s failed", holder, job.job_id)
            reason = f"runner error: {type(exc).__name__}: {exc}"
            if self.claims.finish(job.job_id, holder, JobState.FAILED, reason):
                self.store.log(job.job_id, reason, "ERROR")

    def drive(self, job: Claim, holder: str) -> None:
        """Run one claimed job to its end (or until its lease is lost or the runner stops)."""
        try:
            spec = RolloutSpec.model_validate(self.claims.spec(job.job_id))
            request = RolloutRequest(
                batch_id=job.job_id,
                job_id=job.job_id,
                instance_ids=spec.instance_ids,
                n_samples=spec.n_samples,
                policy_version=spec.policy_version,
                limits=spec.limits,
                sampling=spec.sampling,
                max_attempts=spec.max_attempts,
            )
            self.manager.submit(request)
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:  # a job that cannot start fails with the reason
            self.claims.finish(job.job_id, holder, JobState.FAILED, f"cannot start: {exc}")
            self.store.log(job.job_id, f"cannot start: {exc}", "ERROR")
            return
        if not self.store.append_results(job.job_id, holder, [], reset=True):
            return
        total = len(spec.instance_ids) * spec.n_samples
        self.store.log(job.job_id, f"attempt {job.attempt}: {holder} submitted {total} tasks")
        self._follow(job.job_id, holder, spec)

    def _follow(self, job_id: str, holder: str, spec: RolloutSpec) -> None:
        tally, after, cancelled = Tally(), "0", False
        block_ms = max(1, int(self.cfg.runner.poll_interval_s * 1000))
        while True:
            after, got = self.manager.queue.read_batch_results(job_id, after, 500, block_ms)
            rows = [result_row(r, spec) for r in got]
            for row in rows:
                tally.add(row)
            if rows and not self.store.append_results(job_id, holder, rows):
                return  # lease lost: the new holder owns the results now
            prog = self.manager.progress(job_id)
            progress = Progress(done=prog.done, total=prog.total, phase="rollout")
            state = self.claims.heartbeat(
                job_id, holder, self.cfg.runner.lease_ttl_s, progress, tally.summary()
            )
            if state is None:
                log.warning("%s lost the lease of job %s", holder, job_id)
                return
            if state is JobState.CANCELLING and not cancelled:
                n = self.manager.cancel(job_id)
                cancelled = True
                self.store.log(job_id, f"cancelled: {n} unfinished tasks stopped")
            if prog.finished and not got:
                break
            if self._stop.is_set():  # give the job back; another runner picks it up
                self.claims.finish(job_id, holder, JobState.QUEUED, "runner stopped: queued")
                return
        self._end(job_id, holder, tally, cancelled)

    def _end(self, job_id: str, holder: str, tally: Tally, cancelled: bool) -> None:
        state, message = final_state(tally, cancelled)
        if self.claims.finish(job_id, holder, state, message):
            self.store.log(job_id, message, "ERROR" if state is JobState.FAILED else "INFO")
