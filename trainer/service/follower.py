"""The trainer service on a follower node (``trainer_service.node_rank > 0``): it never claims
a job; it joins the job the leader (node rank 0) of its group runs.

Loop: keep this node's presence key alive (:class:`~trainer.service.nodes.NodeDirectory`);
when an assignment appears that this node has not run yet, write its run config to
``<runs_dir>/<job id>/run.node<R>.yaml``, validate it as the driver will, and run the training
command on it (this node's torchrun, ``--node-rank=R`` in the command) with ``--resume`` when
the leader's attempt resumes, its output in ``attempt-<N>.node<R>.log``. The process is
stopped when the assignment ends or changes (the job finished, was cancelled, or its leader
died and the assignment ran out), and when the service stops. Its exit status goes to the
job's log and to the group's exit records, where the leader sees a failure and fails the job.
A rank already held by another live service is refused with an error (and retried).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

import redis

from services.api.job_process import spawn_process, terminate_process
from services.api.store import JobStore
from services.config import ConfigError
from services.queue.connection import TRANSIENT_ERRORS, backoff_sleep
from trainer.loop.cli import load_run_config
from trainer.service.config import TrainerServiceConfig
from trainer.service.nodes import Assignment, NodeDirectory, NodeError
from trainer.service.spec import training_env

ENDED = "the job's assignment ended"
EXIT_GRACE_S = 10.0  # how long a process may take to exit by itself once its job ended


class TrainerFollower:
    """One follower node's service (see the module docstring); ``serve()`` until stopped."""

    stop_signal = signal.SIGTERM

    def __init__(
        self,
        cfg: TrainerServiceConfig,
        client: redis.Redis,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if cfg.node_rank < 1:
            raise ValueError("a follower has node_rank >= 1 (rank 0 is the leader)")
        self.cfg = cfg
        self.rank = cfg.node_rank
        self.nodes = NodeDirectory(client, cfg.key_prefix, cfg.group)
        self.store = JobStore(client, cfg.key_prefix)
        self.environ = dict(os.environ if environ is None else environ)
        self.holder = f"trainer:{cfg.group}:node{self.rank}:{socket.gethostname()}:{os.getpid()}"
        self.command = cfg.command or [sys.executable, "-m", "trainer", "train"]
        self.stop_event = threading.Event()
        self.done: tuple[str, int] | None = None  # the last assignment this node ran
        self.log = logging.getLogger("swerl.trainer.follower")
        self.status: str | None = None  # the last waiting / refusal message (logged once)

    def _say(self, message: str, level: int = logging.INFO) -> None:
        if message != self.status:
            self.log.log(level, message)
            self.status = message

    # -- the loop ---------------------------------------------------------------------------
    def serve(self) -> None:
        failures = 0
        try:
            while not self.stop_event.is_set():
                try:
                    self.poll_once()
                    failures = 0
                except TRANSIENT_ERRORS as exc:
                    failures += 1
                    self.log.warning("Redis unreachable (%s); retrying", exc)
                    backoff_sleep(failures, self.stop_event)
                    continue
                self.stop_event.wait(self.cfg.poll_interval_s)
        finally:
            with contextlib.suppress(*TRANSIENT_ERRORS):  # else the key runs out by itself
                self.nodes.leave(self.rank, self.holder)

    def poll_once(self) -> None:
        """Announce this node; run the assignment if there is a new one (to its end)."""
        other = self.nodes.announce(self.rank, self.holder, self.cfg.lease_ttl_s)
        if other is not None:
            self._say(
                f"node rank {self.rank} of group {self.cfg.group!r} is held by {other}: two "
                "nodes with one NODE_RANK; waiting until it goes",
                logging.ERROR,
            )
            return
        try:
            assignment = self.nodes.assignment()
        except NodeError as exc:
            self._say(str(exc), logging.ERROR)
            return
        if assignment is None or assignment.key == self.done:
            self._say(f"node rank {self.rank} of group {self.cfg.group!r}: waiting for a job")
            return
        self.done = assignment.key
        self.status = None
        self.run(assignment)

    # -- one assignment ---------------------------------------------------------------------
    def run(self, assignment: Assignment) -> int | None:
        """Run this node's part of the job; its exit status (None: it could not start)."""
        job, attempt, rank = assignment.job_id, assignment.attempt, self.rank
        run_dir = Path(self.cfg.runs_dir).resolve() / job
        run_dir.mkdir(parents=True, exist_ok=True)
        config = run_dir / f"run.node{rank}.yaml"
        config.write_text(assignment.config)
        env = training_env(self.environ)
        try:
            load_run_config(str(config), environ=env)
        except ConfigError as exc:
            self._fail_to_start(assignment, f"the run config is invalid here: {exc}")
            return None
        argv = [
            *self.command,
            "--config",
            str(config),
            *(["--resume"] if assignment.resume else []),
        ]
        self.store.log(job, f"attempt {attempt}: node {rank} ({self.holder}) runs {' '.join(argv)}")
        with open(run_dir / f"attempt-{attempt}.node{rank}.log", "ab") as out:
            proc = spawn_process(argv, out, env, self.stop_signal)
        if isinstance(proc, str):
            self._fail_to_start(assignment, f"cannot start {argv[0]}: {proc}")
            return None
        try:
            why = self._watch(assignment, proc)
            if why == ENDED:  # a finished job's ranks exit by themselves: give them a moment
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=min(EXIT_GRACE_S, self.cfg.stop_grace_s))
        finally:
            code = terminate_process(proc, self.stop_signal, self.cfg.stop_grace_s)
        level = "INFO" if code == 0 or why else "ERROR"
        self.store.log(job, f"attempt {attempt}: node {rank}: training exited with {code}"
                       + (f" ({why})" if why else ""), level)  # fmt: skip
        if not why:  # it ended by itself: the leader judges a failure
            self.nodes.report_exit(assignment, rank, code)
        return code

    def _fail_to_start(self, assignment: Assignment, problem: str) -> None:
        message = f"attempt {assignment.attempt}: node {self.rank}: {problem}"
        self.log.error("job %s: %s", assignment.job_id, message)
        self.store.log(assignment.job_id, message, "ERROR")
        self.nodes.report_exit(assignment, self.rank, 127)

    def _watch(self, assignment: Assignment, proc: subprocess.Popen[bytes]) -> str | None:
        """Until the process ends (None) or must be stopped (why)."""
        while proc.poll() is None:
            if self.stop_event.wait(self.cfg.poll_interval_s):
                return "the service stopped"
            try:
                self.nodes.announce(self.rank, self.holder, self.cfg.lease_ttl_s)
                current = self.nodes.assignment()
            except TRANSIENT_ERRORS as exc:
                self.log.warning("Redis unreachable (%s); the process keeps running", exc)
                continue
            except NodeError:
                current = None
            if current is None or current.key != assignment.key:
                return ENDED
        return None
