"""The trainer service: claims the train jobs of its group, one at a time, and runs each as a
training process (``python -m trainer train --config FILE``, or the configured command).

Per job: the spec becomes ``<runs_dir>/<job id>/run.yaml`` (:mod:`trainer.service.spec`; a
spec that cannot map fails the job with the reason); the process runs with its output in
``attempt-<N>.log`` next to it; a :class:`LeaseKeeper` heartbeats the lease with the progress
read from the run's ``metrics.jsonl`` (step, phase, ``reward/*``). A cancel terminates the
process (job cancelled); a lost lease terminates it and writes nothing more; the exit status
decides succeeded / failed. A job claimed again after its holder died (``attempt`` > 1), or
submitted with ``resume``, starts with ``--resume`` against the same checkpoint dir (unless the
dead attempt left no complete checkpoint: then it starts over). The training process gets
SIGTERM when the service dies (``PR_SET_PDEATHSIG``), so a SIGKILLed service leaves no trainer
writing into the checkpoint dir its successor resumes from.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import redis

from services.api.claims import Claim, JobClaims, LeaseKeeper
from services.api.schemas import JobKind, JobState, Progress
from services.api.store import JobStore
from services.queue.connection import TRANSIENT_ERRORS, backoff_sleep
from trainer.checkpoint import latest_checkpoint
from trainer.loop.metrics import METRICS_FILE
from trainer.service.config import TrainerServiceConfig
from trainer.service.spec import SpecError, load_base, training_env, write_run_config

log = logging.getLogger("swerl.trainer.service")
TAIL_BYTES = 65536  # metrics.jsonl is read from its end: its last complete line
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def last_metrics(run_dir: Path) -> dict[str, object] | None:
    """The newest complete line of ``run_dir/metrics.jsonl`` (None before the first step)."""
    path = run_dir / METRICS_FILE
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - TAIL_BYTES))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last line of a running or killed writer
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            return row
    return None


def progress_of(row: dict[str, object] | None, steps: int) -> tuple[Progress, dict[str, float]]:
    """Progress and the metrics summary (``reward/*``, ``version``) of a metrics row."""
    if row is None:
        return Progress(done=0, total=steps, phase="starting"), {}
    step = int(row["step"])  # type: ignore[arg-type]
    phase = row.get("phase")
    keep = {k: float(v) for k, v in row.items()
            if (k.startswith("reward/") or k == "version")
            and isinstance(v, (int, float)) and not isinstance(v, bool)}  # fmt: skip
    return Progress(done=step, total=steps, current_step=step, phase=str(phase or "")), keep


class TrainerService:
    def __init__(
        self,
        cfg: TrainerServiceConfig,
        client: redis.Redis,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.claims = JobClaims(client, cfg.key_prefix)
        self.store = JobStore(client, cfg.key_prefix)
        self.environ = dict(os.environ if environ is None else environ)
        self.base = load_base(cfg.base_config)
        self.holder = f"trainer:{cfg.group}:{socket.gethostname()}:{os.getpid()}"
        self.command = cfg.command or [sys.executable, "-m", "trainer", "train"]
        self.stop_event = threading.Event()

    def serve(self) -> None:
        """Claim and run jobs until :attr:`stop_event` is set (a running job is given back)."""
        failures = 0
        while not self.stop_event.is_set():
            try:
                job = self.claims.claim(
                    JobKind.TRAIN, self.cfg.group, self.holder, self.cfg.lease_ttl_s, 1
                )
                failures = 0
                if job is None:
                    self.stop_event.wait(self.cfg.poll_interval_s)
                    continue
                self._run_or_fail(job)
            except TRANSIENT_ERRORS as exc:
                failures += 1
                log.warning("Redis unreachable (%s); retrying", exc)
                backoff_sleep(failures, self.stop_event)

    def _run_or_fail(self, job: Claim) -> None:
        """:meth:`run_job`; anything but a Redis outage fails the job with the reason instead of
        stopping the service (an outage propagates: the lease runs out, the job is resumed)."""
        try:
            self.run_job(job)
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:
            log.exception("job %s failed in the trainer service", job.job_id)
            self._finish(job.job_id, JobState.FAILED, f"trainer service error: {exc}")

    def _finish(self, job_id: str, state: JobState, message: str) -> None:
        if self.claims.finish(job_id, self.holder, state, message):
            self.store.log(job_id, message, "ERROR" if state is JobState.FAILED else "INFO")
        log.info("job %s: %s (%s)", job_id, state.value, message)

    def run_job(self, job: Claim) -> None:
        """Run one claimed job until it ends, its lease is lost or the service stops."""
        raw = self.claims.spec(job.job_id)
        run_dir = Path(self.cfg.runs_dir).resolve() / job.job_id
        try:
            config = write_run_config(raw, job.job_id, run_dir, self.base, self.environ)
        except SpecError as exc:
            self._finish(job.job_id, JobState.FAILED, f"cannot start: {exc}")
            return
        argv = [*self.command, "--config", str(config)]
        if self._resumes(job, raw):
            argv.append("--resume")
        log_path = run_dir / f"attempt-{job.attempt}.log"
        self.store.log(job.job_id, f"attempt {job.attempt}: {self.holder} runs {' '.join(argv)}")
        with open(log_path, "ab") as out:
            proc = self._spawn(argv, out)
        if isinstance(proc, str):
            self._finish(job.job_id, JobState.FAILED, f"cannot start {argv[0]}: {proc}")
            return
        steps = int(raw["steps"])
        report = lambda: progress_of(last_metrics(run_dir), steps)  # noqa: E731
        try:
            with LeaseKeeper(
                self.claims, job.job_id, self.holder, self.cfg.lease_ttl_s, report=report
            ) as lease:
                self._watch(job.job_id, proc, lease, log_path)
        finally:
            self._terminate(proc)

    def _spawn(self, argv: list[str], out: BinaryIO) -> subprocess.Popen[bytes] | str:
        """The training process (its own process group, SIGTERM when the service dies), or
        why the command cannot be executed (missing, not executable)."""
        try:
            return subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=training_env(self.environ), start_new_session=True,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        except OSError as exc:
            return exc.strerror or str(exc)

    def _resumes(self, job: Claim, raw: Mapping[str, object]) -> bool:
        if raw.get("resume"):
            return True  # asked for: the driver fails clearly if there is nothing to resume
        if job.attempt <= 1:
            return False
        if latest_checkpoint(str(raw["checkpoint_dir"])) is None:
            self.store.log(job.job_id, "the previous attempt left no checkpoint: starting over")
            return False
        return True

    def _watch(
        self, job_id: str, proc: subprocess.Popen[bytes], lease: LeaseKeeper, log_path: Path
    ) -> None:
        while proc.poll() is None:
            if lease.lost.is_set():
                log.warning("lost the lease of job %s: stopping its process", job_id)
                return
            if lease.cancel_requested.is_set():
                code = self._terminate(proc)
                self._finish(job_id, JobState.CANCELLED, f"cancelled (process exit {code})")
                return
            if self.stop_event.wait(0.2):
                self._terminate(proc)
                self._finish(job_id, JobState.QUEUED, "trainer service stopped: queued again")
                return
        lease.stop()
        progress, metrics = lease.report() if lease.report else (None, None)
        state = self.claims.heartbeat(job_id, self.holder, lease.ttl_s, progress, metrics)
        if state is None:  # the final progress is published before the job ends
            return
        if proc.returncode == 0:
            self._finish(job_id, JobState.SUCCEEDED, "training finished")
            return
        tail = log_path.read_text(errors="replace")[-1500:].strip()
        self._finish(job_id, JobState.FAILED, f"training exited with {proc.returncode}: {tail}")

    def _terminate(self, proc: subprocess.Popen[bytes]) -> int:
        """SIGTERM the process group, SIGKILL it after ``stop_grace_s``."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.cfg.stop_grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return proc.returncode
