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
writing into the checkpoint dir its successor resumes from. The claim / lease / child-process
loop is :class:`services.api.job_process.ProcessJobService`'s.

A multi-node group (``nnodes > 1``): this service is node rank 0, the leader. It claims only
while every follower node is present, publishes the claimed job as the group's assignment
(the run config's text, ``resume``) for the followers (:mod:`trainer.service.follower`) to
run their torchrun on, withdraws it when its own process ends, and fails the job as soon as
a follower's process fails (:mod:`trainer.service.nodes`).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import redis

from services.api.claims import Claim, LeaseKeeper
from services.api.job_process import ProcessJobService
from services.api.schemas import JobKind, JobState, Progress
from trainer.checkpoint import latest_checkpoint
from trainer.loop.metrics import METRICS_FILE
from trainer.service.config import TrainerServiceConfig
from trainer.service.metrics import TrainerServiceMetrics
from trainer.service.nodes import Assignment, NodeDirectory
from trainer.service.spec import SpecError, load_base, training_env, write_run_config

TAIL_BYTES = 65536  # metrics.jsonl is read from its end: its last complete line


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


class TrainerService(ProcessJobService):
    kind = JobKind.TRAIN
    name = "trainer service"
    log_name = "swerl.trainer.service"

    def __init__(
        self,
        cfg: TrainerServiceConfig,
        client: redis.Redis,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        holder = f"trainer:{cfg.group}:{socket.gethostname()}:{os.getpid()}"
        super().__init__(cfg, client, holder, environ)
        self.cfg: TrainerServiceConfig = cfg
        self.base = load_base(cfg.base_config)
        self.command = cfg.command or [sys.executable, "-m", "trainer", "train"]
        self.nodes = NodeDirectory(client, cfg.key_prefix, cfg.group)
        self._waiting_for: list[int] = []
        self._running: Assignment | None = None
        self._checked = 0.0
        self.metrics = TrainerServiceMetrics()

    def finish(self, job_id: str, state: JobState, message: str) -> None:
        super().finish(job_id, state, message)
        self.metrics.finished(state.value)

    def _progress(self, run_dir: Path, steps: int) -> tuple[Progress, dict[str, float]]:
        """The run's progress for the lease heartbeat (and the step for the metrics)."""
        progress, summary = progress_of(last_metrics(run_dir), steps)
        self.metrics.heartbeat(progress.done)
        return progress, summary

    # -- a multi-node group: the leader's side (trainer.service.nodes) ------------------------
    @property
    def multi_node(self) -> bool:
        return self.cfg.nnodes > 1

    def ready_to_claim(self) -> bool:
        """A multi-node leader claims only while every follower node is present."""
        if not self.multi_node:
            return True
        missing = self.nodes.missing(self.cfg.nnodes)
        if missing != self._waiting_for:
            if missing:
                self.log.info("group %r: waiting for follower nodes %s before claiming",
                              self.cfg.group, missing)  # fmt: skip
            else:
                self.log.info("group %r: all %d nodes present", self.cfg.group, self.cfg.nnodes)
            self._waiting_for = missing
        return not missing

    def job_problem(self, job_id: str) -> tuple[JobState, str] | None:
        """Checked once per poll: a follower's process of this attempt failed (the job fails),
        or a follower's service is gone, its presence expired (a lost node: the job is queued
        again and resumes from its checkpoint once every node is back)."""
        running = self._running
        now = time.monotonic()
        if running is None or now - self._checked < self.cfg.poll_interval_s:
            return None
        self._checked = now
        failed = self.nodes.failed_followers(running.job_id, running.attempt)
        if failed:
            ranks = ", ".join(f"node {r} exited with {c}" for r, c in sorted(failed.items()))
            log = f"attempt-{running.attempt}.node<R>.log"
            return JobState.FAILED, f"a follower node failed: {ranks} (see {log})"
        lost = self.nodes.missing(self.cfg.nnodes)
        if lost:
            return JobState.QUEUED, (
                f"follower node(s) {lost} lost (presence expired): queued again, to resume "
                "from the checkpoint when every node is back"
            )
        return None

    def run_job(self, job: Claim) -> None:
        """Run one claimed job until it ends, its lease is lost or the service stops."""
        self.metrics.claimed()
        try:
            self._run_job(job)
        finally:
            self.metrics.job_ended()

    def _run_job(self, job: Claim) -> None:
        raw = self.claims.spec(job.job_id)
        run_dir = Path(self.cfg.runs_dir).resolve() / job.job_id
        try:
            config = write_run_config(raw, job.job_id, run_dir, self.base, self.environ)
        except SpecError as exc:
            self.finish(job.job_id, JobState.FAILED, f"cannot start: {exc}")
            return
        resume = self._resumes(job, raw)
        argv = [*self.command, "--config", str(config), *(["--resume"] if resume else [])]
        steps = int(raw["steps"])
        log_path = run_dir / f"attempt-{job.attempt}.log"
        if not self.multi_node:
            report = lambda: self._progress(run_dir, steps)  # noqa: E731
            self.run_process(job, argv, log_path, training_env(self.environ), report)
            return
        # the followers run the same file: the assignment lives while the lease does
        assignment = Assignment(
            job_id=job.job_id, attempt=job.attempt, config=config.read_text(), resume=resume
        )
        value = self.nodes.assign(assignment, self.cfg.lease_ttl_s)
        self.store.log(job.job_id, f"attempt {job.attempt}: assigned to the group's "
                       f"{self.cfg.nnodes} nodes")  # fmt: skip

        def report() -> tuple[Progress, dict[str, float]]:
            self.nodes.refresh(value, self.cfg.lease_ttl_s)  # at each heartbeat of the lease
            return self._progress(run_dir, steps)

        self._running = assignment
        try:
            self.run_process(job, argv, log_path, training_env(self.environ), report)
        finally:
            self._running = None
            self.nodes.clear(value)  # the followers stop their processes

    def _resumes(self, job: Claim, raw: Mapping[str, object]) -> bool:
        if raw.get("resume"):
            return True  # asked for: the driver fails clearly if there is nothing to resume
        if job.attempt <= 1:
            return False
        if latest_checkpoint(str(raw["checkpoint_dir"])) is None:
            self.store.log(job.job_id, "the previous attempt left no checkpoint: starting over")
            return False
        return True

    def on_exit(self, job_id: str, code: int, log_path: Path, lease: LeaseKeeper) -> None:
        progress, metrics = lease.report() if lease.report else (None, None)
        state = self.claims.heartbeat(job_id, self.holder, lease.ttl_s, progress, metrics)
        if state is None:  # the final progress is published before the job ends
            return
        if code == 0:
            self.finish(job_id, JobState.SUCCEEDED, "training finished")
            return
        tail = log_path.read_text(errors="replace")[-1500:].strip()
        self.finish(job_id, JobState.FAILED, f"training exited with {code}: {tail}")
