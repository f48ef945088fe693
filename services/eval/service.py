"""The evaluator service: claims the eval jobs of the job API, one at a time, and runs each as
the evaluation script (``python -m services.eval``, the same code as ``swerl eval``).

Why a service of its own, not the rollout job runner in the API process: grading needs a
sandbox backend on the host (the docker socket or bwrap and the image trees) and generation
starts a whole local stack, neither of which the API process has; and a cancel must stop
sandboxes mid-grade, which a child process in its own process group allows (SIGINT: the
script's KeyboardInterrupt path removes its sandboxes; also sent when the service dies) and a
thread does not. The claim / lease / child-process loop is shared with the trainer service
(:class:`services.api.job_process.ProcessJobService`).

Per job: ``<runs_dir>/<job id>/`` is the report dir and the job id the run id; the child's
output goes to ``attempt-<N>.log`` there, and its per-instance progress lines give the job's
progress (instances done / total). Every attempt runs with ``--resume``, so a job claimed
again after its evaluator died grades only what is missing. At the end the run report (the
harness's shape) becomes the job's result rows (one per instance: the official status, the
hardened verdict, the tamper flags) and metrics (counts, ``resolved_rate``,
``hardened_resolved_rate``, instances per tamper flag). Exit 0 -> succeeded; exit 1 (an
infrastructure failure on some instance, in either pass: counted as an error, never as
unresolved) -> failed, with the ids, the partial counts published; exit 2 (bad input:
dataset, predictions, checkpoint) -> failed with the message.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import redis

from services.api.claims import Claim, LeaseKeeper
from services.api.job_process import ProcessJobService
from services.api.schemas import EvalSpec, JobKind, JobState, Progress
from services.eval.metrics import EvalMetrics
from services.eval.service_config import EvalServiceConfig
from services.swerl_cli.eval_options import EVAL_MODULE

TAIL_BYTES = 65536
EXIT_OK, EXIT_INFRA, EXIT_USAGE = 0, 1, 2
# The script's lines (services/eval/main.py): the plan, then one per graded instance.
PLAN_LINE = re.compile(r"^run \S+: (\d+) instance\(s\), (\d+) to grade \((\d+) already graded\)")
GRADED_LINE = re.compile(r"^\[(\d+)/(\d+)\] ")
REPORT_KEYS = (  # the run report's counts, published as the job's metrics
    "total_instances", "submitted_instances", "completed_instances", "resolved_instances",
    "unresolved_instances", "empty_patch_instances", "error_instances",
    "infra_failure_instances",
)  # fmt: skip
STATUS_LISTS = (  # the run report's id lists, in the order a row takes its status from
    ("resolved_ids", "resolved"), ("unresolved_ids", "unresolved"), ("error_ids", "error"),
    ("empty_patch_ids", "empty_patch"), ("incomplete_ids", "incomplete"),
)  # fmt: skip


def command_for(spec: EvalSpec, cfg: EvalServiceConfig, run_dir: Path, run_id: str) -> list[str]:
    """The evaluation script's command line for one job."""
    argv = [sys.executable, "-m", EVAL_MODULE, "--dataset", spec.dataset]
    if spec.predictions is not None:
        argv += ["--predictions", spec.predictions]
    else:
        argv += ["--model", str(spec.checkpoint)]
        if cfg.engine_url:
            argv += ["--engine-url", ",".join(cfg.engine_url)]
    argv += ["--report-dir", str(run_dir), "--run-id", run_id, "--resume"]
    argv += ["--backend", cfg.backend, "--workers", str(cfg.workers)]
    if cfg.state_root:
        argv += ["--state-root", cfg.state_root]
    argv += ["--timeout", str(cfg.timeout_s), "--image-tag", cfg.image_tag]
    if not cfg.hardened:
        argv += ["--no-hardened"]
    if cfg.image_namespace:
        argv += ["--image-namespace", cfg.image_namespace]
    if spec.instance_ids:
        argv += ["--instances", ",".join(spec.instance_ids)]
    if spec.max_instances is not None:
        argv += ["--max-instances", str(spec.max_instances)]
    return argv


def progress_of(text: str, generating: bool) -> Progress:
    """Instances done / total from the script's output so far."""
    total = base = done = 0
    planned = False
    for line in text.splitlines():
        if m := PLAN_LINE.match(line):
            planned = True
            total, to_grade = int(m[1]), int(m[2])
            base, done = total - to_grade, 0  # empty / missing predictions are never graded
        elif planned and (m := GRADED_LINE.match(line)):
            done = max(done, int(m[1]))
    if not planned:
        return Progress(phase="generating" if generating else "starting")
    return Progress(done=base + done, total=total, phase="grading")


def read_tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def find_report(run_dir: Path, run_id: str) -> tuple[Path, dict[str, Any]] | None:
    """The run report ``<run_dir>/<model>.<run_id>.json`` the script wrote, if any."""
    found = sorted(run_dir.glob(f"*.{run_id}.json"))
    return (found[0], json.loads(found[0].read_text())) if found else None


def infra_ids(report: dict[str, Any], run_dir: Path, run_id: str) -> list[str]:
    """Instances that hit an infrastructure failure: the grader's verdict in each instance's
    ``run_instance.log``, the harness's advisory ``infra_failure_ids``, and the hardened pass's
    ``hardened_infra_failure_ids``."""
    ids = {*report.get("infra_failure_ids", []), *report.get("hardened_infra_failure_ids", [])}
    for iid in report.get("error_ids", []):
        for log_file in run_dir.glob(f"logs/run_evaluation/{run_id}/*/{iid}/run_instance.log"):
            tail = log_file.read_text(errors="replace")[-4000:]
            if "infrastructure failure:" in tail.rsplit("result:", 1)[-1]:
                ids.add(iid)
    return sorted(ids)


def result_rows(report: dict[str, Any], infra: list[str]) -> list[dict[str, Any]]:
    """One row per selected instance: its status in the run report, whether it hit an
    infrastructure failure, its hardened verdict (None: none) and tamper flags."""
    rows: dict[str, dict[str, Any]] = {}
    reasons = report.get("failure_reasons", {})
    verdicts = report.get("verdicts", {})
    for key, status in STATUS_LISTS:
        for iid in report.get(key, []):
            found = verdicts.get(iid, {})
            rows.setdefault(iid, {"instance_id": iid, "status": status,
                                  "infra_failure": iid in infra,
                                  "failure_reason": reasons.get(iid),
                                  "hardened_resolved": found.get("hardened_resolved"),
                                  "tamper": found.get("tamper", [])})  # fmt: skip
    return [rows[iid] for iid in sorted(rows)]


def metrics_of(report: dict[str, Any], infra: list[str]) -> dict[str, float]:
    out = {k: float(report[k]) for k in REPORT_KEYS if isinstance(report.get(k), int)}
    out["incomplete_instances"] = float(len(report.get("incomplete_ids", [])))
    out["infra_error_instances"] = float(len(infra))
    total = report.get("total_instances") or 0
    if total:
        out["resolved_rate"] = float(report["resolved_instances"]) / total
    if report.get("hardened_evaluation"):  # the hardened pass ran: its rate next to the official
        hardened = report.get("hardened_resolved_instances", 0)
        out["hardened_resolved_instances"] = float(hardened)
        if total:
            out["hardened_resolved_rate"] = float(hardened) / total
    if isinstance(report.get("tampered_ids"), list):
        out["tampered_instances"] = float(len(report["tampered_ids"]))
        for flag, count in report.get("tamper_counts", {}).items():
            out[f"tamper_{flag}_instances"] = float(count)
    return out


class EvalService(ProcessJobService):
    kind = JobKind.EVAL
    name = "evaluator service"
    process_noun = "evaluation"
    stop_signal = signal.SIGINT  # the script's KeyboardInterrupt path removes its sandboxes
    claim_limit = 10**6  # eval jobs of a group do not wait for each other's slot
    log_name = "swerl.eval.service"

    def __init__(
        self,
        cfg: EvalServiceConfig,
        client: redis.Redis,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        holder = f"evaluator:{cfg.group}:{socket.gethostname()}:{os.getpid()}"
        super().__init__(cfg, client, holder, environ)
        self.cfg: EvalServiceConfig = cfg
        self.metrics = EvalMetrics()

    def finish(self, job_id: str, state: JobState, message: str) -> None:
        super().finish(job_id, state, message)
        self.metrics.finished(state.value)

    def run_job(self, job: Claim) -> None:
        """Run one claimed job until it ends, its lease is lost or the service stops."""
        self.metrics.claimed()
        started = time.monotonic()
        try:
            self._run_job(job)
        finally:
            self.metrics.job_ended(time.monotonic() - started)

    def _run_job(self, job: Claim) -> None:
        spec = EvalSpec.model_validate(self.claims.spec(job.job_id))
        run_dir = Path(self.cfg.runs_dir).resolve() / job.job_id
        run_dir.mkdir(parents=True, exist_ok=True)
        argv = command_for(spec, self.cfg, run_dir, job.job_id)
        log_path = run_dir / f"attempt-{job.attempt}.log"
        generating = spec.checkpoint is not None
        report = lambda: (progress_of(read_tail(log_path), generating), None)  # noqa: E731
        self.run_process(job, argv, log_path, self.environ, report)

    def on_exit(self, job_id: str, code: int, log_path: Path, lease: LeaseKeeper) -> None:
        self._end(job_id, code, log_path, log_path.parent, lease.ttl_s)

    def _end(self, job_id: str, code: int, log_path: Path, run_dir: Path, ttl_s: float) -> None:
        tail = read_tail(log_path)
        found = find_report(run_dir, job_id) if code in (EXIT_OK, EXIT_INFRA) else None
        if found is None:
            why = "bad input" if code == EXIT_USAGE else f"evaluation exited with {code}"
            self.finish(job_id, JobState.FAILED, f"{why}: {tail[-1500:].strip()}")
            return
        path, report = found
        infra = infra_ids(report, run_dir, job_id)
        rows = result_rows(report, infra)
        if not self.store.append_results(job_id, self.holder, rows, reset=True):
            return  # the lease is lost: the new holder owns the job
        self.metrics.graded(row["status"] for row in rows)
        metrics = metrics_of(report, infra)
        total = int(report["total_instances"])
        progress = Progress(done=total, total=total, phase="graded")
        if self.claims.heartbeat(job_id, self.holder, ttl_s, progress, metrics) is None:
            return
        resolved = int(report["resolved_instances"])
        rate = f"{resolved}/{total} ({100.0 * resolved / total if total else 0.0:.1f}%)"
        if report.get("hardened_evaluation"):
            hardened = int(report.get("hardened_resolved_instances", 0))
            rate += f", hardened {hardened}/{total}"
        if flagged := report.get("tampered_ids"):
            rate += f", {len(flagged)} with tamper flags"
        where = f"report {path}"
        if code == EXIT_OK:
            self.finish(job_id, JobState.SUCCEEDED, f"resolved {rate}; {where}")
            return
        incomplete = report.get("incomplete_ids", [])
        bad = ", ".join(infra + [i for i in incomplete if i not in infra]) or "see the log"
        self.finish(job_id, JobState.FAILED,
                     f"infrastructure failure (not graded as wrong answers): {bad}; resolved "
                     f"{rate} is a lower bound; {where}")  # fmt: skip
