"""A service that claims the job API's jobs of one kind and runs each as a child process.

The trainer service (:mod:`trainer.service.service`, train jobs) and the evaluator service
(:mod:`services.eval.service`, eval jobs) share this loop: claim a job (:class:`JobClaims`),
start its process in its own process group (it gets :attr:`ProcessJobService.stop_signal` when
the service dies, ``PR_SET_PDEATHSIG``, so a SIGKILLed service leaves no orphan writing into
the job's directory), heartbeat the lease with the job's progress (:class:`LeaseKeeper`), and
end the job: a cancel stops the process (cancelled), a lost lease stops it and writes nothing
more (the new holder owns the job), a stopping service stops it and queues the job again, and
the process's exit decides the rest (:meth:`ProcessJobService.on_exit`). A Redis outage never
fails a job: the loop retries with backoff, and an outage during a job propagates so that the
lease runs out and the job is taken over. Any other error fails the job with the reason
instead of stopping the service.

Subclasses say what a job runs: :meth:`ProcessJobService.run_job` prepares the command and
calls :meth:`ProcessJobService.run_process`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO, Protocol

import redis

from services.api.claims import Claim, JobClaims, LeaseKeeper
from services.api.schemas import JobKind, JobState, Progress
from services.api.store import ANNOUNCE_INTERVAL_S, JobStore
from services.queue.connection import TRANSIENT_ERRORS, backoff_sleep

PR_SET_PDEATHSIG = 1
Report = Callable[[], tuple[Progress, dict[str, float] | None]]


class ServiceSettings(Protocol):
    """The settings every job-process service has (its pydantic config provides them)."""

    key_prefix: str
    group: str
    lease_ttl_s: float
    poll_interval_s: float
    stop_grace_s: float


class ProcessJobService:
    """Claims jobs of :attr:`kind` and runs each as a child process (see the module doc)."""

    kind: JobKind
    name = "job service"  # in messages: "<name> stopped: queued again", "<name> error: ..."
    process_noun = "process"  # "cancelled (<noun> exit N)"
    stop_signal = signal.SIGTERM  # what stops the process group (and is sent if we die)
    claim_limit = 1  # jobs of the group that may run at once
    log_name = "swerl.jobs"

    def __init__(
        self,
        cfg: ServiceSettings,
        client: redis.Redis,
        holder: str,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.claims = JobClaims(client, cfg.key_prefix)
        self.store = JobStore(client, cfg.key_prefix)
        self.environ = dict(os.environ if environ is None else environ)
        self.holder = holder
        self.stop_event = threading.Event()
        self.log = logging.getLogger(self.log_name)
        self._announced = -float("inf")  # time.monotonic() of the last announce

    # -- the loop ---------------------------------------------------------------------------

    def serve(self) -> None:
        """Claim and run jobs until :attr:`stop_event` is set (a running job is given back)."""
        failures = 0
        while not self.stop_event.is_set():
            try:
                self.announce()
                if not self.ready_to_claim():
                    self.stop_event.wait(self.cfg.poll_interval_s)
                    continue
                job = self.claims.claim(
                    self.kind, self.cfg.group, self.holder, self.cfg.lease_ttl_s, self.claim_limit
                )
                failures = 0
                if job is None:
                    self.stop_event.wait(self.cfg.poll_interval_s)
                    continue
                self._run_or_fail(job)
            except TRANSIENT_ERRORS as exc:
                failures += 1
                self.log.warning("Redis unreachable (%s); retrying", exc)
                backoff_sleep(failures, self.stop_event)

    def _run_or_fail(self, job: Claim) -> None:
        """:meth:`run_job`; anything but a Redis outage fails the job with the reason instead of
        stopping the service (an outage propagates: the lease runs out, the job is resumed)."""
        try:
            self.run_job(job)
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:
            self.log.exception("job %s failed in the %s", job.job_id, self.name)
            self.finish(job.job_id, JobState.FAILED, f"{self.name} error: {exc}")

    def announce(self) -> None:
        """Tell the job API that this service serves its kind and group (at most every
        ``ANNOUNCE_INTERVAL_S``): a train job for a group no trainer announced is accepted
        with a warning (:meth:`JobStore.serving`)."""
        now = time.monotonic()
        if now - self._announced < ANNOUNCE_INTERVAL_S:
            return
        self.store.announce(self.kind, self.cfg.group, self.holder)
        self._announced = now

    def _announce_while_busy(self) -> None:
        """:meth:`announce` while a job runs (busy still serves the group); a Redis outage
        here must not stop the job's process (the lease decides that)."""
        try:
            self.announce()
        except redis.RedisError as exc:
            self.log.debug("cannot announce the service (%s)", exc)

    def finish(self, job_id: str, state: JobState, message: str) -> None:
        """End the job (if this service still holds it) and log why."""
        if self.claims.finish(job_id, self.holder, state, message):
            self.store.log(job_id, message, "ERROR" if state is JobState.FAILED else "INFO")
        self.log.info("job %s: %s (%s)", job_id, state.value, message)

    # -- one job ----------------------------------------------------------------------------

    def ready_to_claim(self) -> bool:
        """Whether to claim now (subclasses: a multi-node leader waits for its followers)."""
        return True

    def job_problem(self, job_id: str) -> tuple[JobState, str] | None:
        """Why the running job must stop although its process runs, and how it ends
        (``FAILED``, or ``QUEUED`` to run it again; subclasses: a follower node failed or was
        lost), checked while it runs; None: keep going."""
        return None

    def run_job(self, job: Claim) -> None:
        """Prepare the job's command and :meth:`run_process` it (subclasses)."""
        raise NotImplementedError

    def on_exit(self, job_id: str, code: int, log_path: Path, lease: LeaseKeeper) -> None:
        """The process ended by itself with ``code``: end the job (subclasses)."""
        raise NotImplementedError

    def run_process(
        self, job: Claim, argv: list[str], log_path: Path, env: Mapping[str, str], report: Report
    ) -> None:
        """Run ``argv`` (output to ``log_path``) under the job's lease until it ends, the
        lease is lost, the job is cancelled or the service stops."""
        self.store.log(job.job_id, f"attempt {job.attempt}: {self.holder} runs {' '.join(argv)}")
        with open(log_path, "ab") as out:
            proc = self._spawn(argv, out, env)
        if isinstance(proc, str):
            self.finish(job.job_id, JobState.FAILED, f"cannot start {argv[0]}: {proc}")
            return
        try:
            with LeaseKeeper(
                self.claims, job.job_id, self.holder, self.cfg.lease_ttl_s, report=report
            ) as lease:
                self._watch(job.job_id, proc, lease, log_path)
        finally:
            self.terminate(proc)

    def _spawn(
        self, argv: list[str], out: BinaryIO, env: Mapping[str, str]
    ) -> subprocess.Popen[bytes] | str:
        return spawn_process(argv, out, env, self.stop_signal)

    def _watch(
        self, job_id: str, proc: subprocess.Popen[bytes], lease: LeaseKeeper, log_path: Path
    ) -> None:
        while proc.poll() is None:
            self._announce_while_busy()
            if lease.lost.is_set():
                self.log.warning("lost the lease of job %s: stopping its %s", job_id,
                                 self.process_noun)  # fmt: skip
                return
            if lease.cancel_requested.is_set():
                code = self.terminate(proc)
                self.finish(
                    job_id, JobState.CANCELLED, f"cancelled ({self.process_noun} exit {code})"
                )
                return
            problem = self.job_problem(job_id)
            if problem is not None:
                state, why = problem
                code = self.terminate(proc)
                self.finish(job_id, state, f"{why} ({self.process_noun} exit {code})")
                return
            if self.stop_event.wait(0.2):
                self.terminate(proc)
                self.finish(job_id, JobState.QUEUED, f"{self.name} stopped: queued again")
                return
        lease.stop()
        self.on_exit(job_id, proc.returncode, log_path, lease)

    def terminate(self, proc: subprocess.Popen[bytes]) -> int:
        """:attr:`stop_signal` to the process group, SIGKILL after ``stop_grace_s``."""
        return terminate_process(proc, self.stop_signal, self.cfg.stop_grace_s)


def spawn_process(
    argv: list[str], out: BinaryIO, env: Mapping[str, str], stop: signal.Signals
) -> subprocess.Popen[bytes] | str:
    """``argv`` in its own process group, output to ``out``, ``stop`` sent to it when this
    process dies (``PR_SET_PDEATHSIG``); or why it cannot be executed (missing, not
    executable)."""

    def die_with_parent() -> None:  # in the child between fork and exec
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, stop)

    try:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env=dict(env), start_new_session=True, preexec_fn=die_with_parent,
        )  # fmt: skip
    except OSError as exc:
        return exc.strerror or str(exc)


def terminate_process(proc: subprocess.Popen[bytes], stop: signal.Signals, grace_s: float) -> int:
    """``stop`` to the process group, SIGKILL after ``grace_s``; the exit status."""
    if proc.poll() is None:
        os.killpg(proc.pid, stop)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode
