"""Grade one prediction in a fresh sandbox and write its files in the harness's layout.

The evaluation is the sandbox plane's ``evaluate_patch`` with the official harness's semantics
(``grading="swebench"``, the harness's log parser, test infrastructure graded as the patch left
it, the harness's eval script where it has a spec, the harness's apply cascade with GNU
``patch`` as its last fallback). The files and the error rules are the harness's
(``sandbox_worker/evaluation/run_report.py``): ``report.json`` only when the tests ran; a patch
that does not apply, a timed-out test run and an infrastructure failure are errors.

Unless ``--no-hardened``, the prediction is then graded a second time, in another fresh sandbox,
as training rewards are graded (:func:`hardened_config`); both verdicts and the tamper flags go
to ``hardened.json`` (``hardened.py``). It is written before ``report.json``, so an instance
the harness counts as completed always has its hardened verdict.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sandbox_worker.backends.base import SandboxBackend
from sandbox_worker.evaluation import EvalConfig, EvalReport, evaluate_patch
from sandbox_worker.evaluation.run_report import (
    LOG_EVAL_SCRIPT,
    LOG_INSTANCE,
    LOG_PATCH,
    LOG_REPORT,
    LOG_TEST_OUTPUT,
    instance_log_dir,
    instance_report,
    timeout_note,
)
from sandbox_worker.evaluation.specs import UnknownSpecError, harness_eval_script
from services.datasets.predictions import Prediction
from services.eval.hardened import HARDENED_FILE, HARDENED_LOG, Verdict, combine, write_verdict
from services.protocol.instance import SWEInstance

Status = Literal["resolved", "unresolved", "error"]
CONFIG_FLAGS = (
    "(swerl eval: evaluation.eval_script is --eval-script, the parser and grading follow it; "
    "an image's key is --image-namespace / --image-tag)"
)
LOG_TAIL_CHARS = 2_000_000  # run_instance.log keeps the whole transcript of a normal run


@dataclass(frozen=True)
class Outcome:
    """How one instance ended in this run."""

    instance_id: str
    status: Status
    detail: str  # why (an error's reason, the failing tests), "" when resolved
    infra: bool  # an infrastructure failure (not the patch's fault), in either pass
    duration_s: float
    hardened: Verdict | None = None  # both verdicts and the tamper flags


def eval_script_for(instance: SWEInstance, choice: str) -> Literal["harness", "swerl"]:
    """``auto``: the harness's script when the row has one or its repo/version has a spec."""
    if choice in ("harness", "swerl"):
        return choice  # type: ignore[return-value]
    try:
        harness_eval_script(instance)
    except (UnknownSpecError, ValueError):
        return "swerl"
    return "harness"


def eval_config(
    instance: SWEInstance,
    script_choice: str,
    timeout_s: int,
    timeout_by_repo: Mapping[str, int] | None = None,
) -> EvalConfig:
    """The official harness's grading for one instance; its test timeout is its repository's
    entry of ``timeout_by_repo`` (``--repo-timeout``), else ``timeout_s``."""
    return EvalConfig(
        grading="swebench",
        eval_script=eval_script_for(instance, script_choice),
        log_parser="auto",
        patch_policy="harness",  # the harness's apply cascade, GNU patch included
        restore_test_infra=False,  # the harness grades the tree the patch left
        keep_test_output=True,
        test_timeout_s=timeout_s,
        test_timeout_by_repo=dict(timeout_by_repo or {}),
        log_tail_chars=LOG_TAIL_CHARS,
    ).for_repo(instance.repo)


def hardened_config(
    instance: SWEInstance,
    script_choice: str,
    timeout_s: int,
    timeout_by_repo: Mapping[str, int] | None = None,
) -> EvalConfig:
    """The grading of training rewards for one instance: git-format diffs only, applied by
    ``git apply`` alone; test infrastructure the patch touched restored; the structured
    report and its canaries where swerl's script runs, the harness's parser where only the
    harness's script can grade the row (``row_grading.py``). The same script choice (auto
    unless ``--eval-script``) and test timeouts as the official pass, so the verdicts differ
    only by what the hardening catches."""
    return EvalConfig(
        grading="auto",
        eval_script=script_choice,  # type: ignore[arg-type]
        log_parser="auto",
        patch_policy="strict",
        restore_test_infra=True,
        test_timeout_s=timeout_s,
        test_timeout_by_repo=dict(timeout_by_repo or {}),
        log_tail_chars=LOG_TAIL_CHARS,
    ).for_repo(instance.repo)


@dataclass(frozen=True)
class Grader:
    """Grades predictions of one run into ``root``'s harness layout."""

    backend: SandboxBackend
    root: Path
    run_id: str
    node: str
    script_choice: str = "auto"
    timeout_s: int = 1800
    timeout_by_repo: Mapping[str, int] = field(default_factory=dict)  # owner/name -> seconds
    hardened: bool = True  # grade a second time as training rewards are graded

    def grade(self, instance: SWEInstance, prediction: Prediction, image: str) -> Outcome:
        started = time.monotonic()
        log_dir = instance_log_dir(self.root, self.run_id, prediction)
        log_dir.mkdir(parents=True, exist_ok=True)
        for stale in (LOG_REPORT, LOG_TEST_OUTPUT, HARDENED_FILE, HARDENED_LOG):
            (log_dir / stale).unlink(missing_ok=True)  # a resumed error is graded afresh
        (log_dir / LOG_PATCH).write_text(prediction.model_patch or "")
        config = eval_config(instance, self.script_choice, self.timeout_s, self.timeout_by_repo)
        if config.eval_script == "harness":  # the script the harness writes next to its logs
            (log_dir / LOG_EVAL_SCRIPT).write_text(harness_eval_script(instance))
        report = evaluate_patch(
            self.backend, instance, prediction.model_patch, image, node=self.node, config=config
        )
        if report.test_output is not None:
            output = report.test_output
            if report.tests_timed_out:
                output += timeout_note(config.test_timeout_s)
            (log_dir / LOG_TEST_OUTPUT).write_text(output)
        status, detail, infra = verdict(report)
        second = self._grade_hardened(instance, prediction, image, (report, status), log_dir)
        write_verdict(log_dir, second)  # before report.json: completed -> has its verdict
        if status != "error":
            report_json = instance_report(report, log_dir / LOG_TEST_OUTPUT)
            (log_dir / LOG_REPORT).write_text(json.dumps(report_json, indent=4))
        _write_instance_log(log_dir / LOG_INSTANCE, instance, image, config, report, detail)
        infra = infra or second.hardened_infra
        elapsed = time.monotonic() - started
        return Outcome(instance.instance_id, status, detail, infra, elapsed, second)

    def _grade_hardened(
        self,
        instance: SWEInstance,
        prediction: Prediction,
        image: str,
        official_graded: tuple[EvalReport, Status],
        log_dir: Path,
    ) -> Verdict:
        """The hardened pass (skipped with ``--no-hardened`` and after an infrastructure
        failure of the official pass, which is graded again on ``--resume``) and the verdict
        of both passes."""
        official, status = official_graded
        resolved = status == "resolved"
        if not self.hardened or official.infra_error is not None:
            return combine(official, resolved, None, None)
        config = hardened_config(instance, self.script_choice, self.timeout_s, self.timeout_by_repo)
        report = evaluate_patch(
            self.backend, instance, prediction.model_patch, image, node=self.node, config=config
        )
        grade = verdict(report)
        (log_dir / HARDENED_LOG).write_text(
            f"hardened pass: grading {report.grading}, patch policy {config.patch_policy}, test "
            f"infrastructure restored\n\n{report.log_tail}\n\n"
            f"result: {grade[0]} {grade[1]}".rstrip()
            + "\n"
        )
        return combine(official, resolved, report, grade)


def verdict(report: EvalReport) -> tuple[Status, str, bool]:
    """``(status, why, infrastructure failure)`` by the harness's rules (run_report.py)."""
    if report.infra_error is not None and report.config_error:
        # the evaluation's messages name the worker's keys; here they are swerl eval's flags
        return "error", f"configuration error: {report.infra_error} {CONFIG_FLAGS}", True
    if report.infra_error is not None:
        return "error", f"infrastructure failure: {report.infra_error}", True
    if report.patch_rejected is not None:
        return "error", f"patch refused: {report.patch_rejected}", False
    if not report.applied:
        return "error", "the patch does not apply (>>>>> Patch Apply Failed)", False
    if report.tests_timed_out:
        return "error", "the tests timed out", False
    if report.resolved:
        return "resolved", "", False
    if not report.log_valid:
        return "unresolved", "the test log is not valid (no parseable test output)", False
    failing = [*report.f2p_failure, *report.p2p_failure]
    shown = ", ".join(failing[:5]) + (f" and {len(failing) - 5} more" if len(failing) > 5 else "")
    return "unresolved", f"failing: {shown}", False


def _write_instance_log(
    path: Path,
    instance: SWEInstance,
    image: str,
    config: EvalConfig,
    report: EvalReport,
    detail: str,
) -> None:
    head = [
        f"instance: {instance.instance_id}",
        f"image: {image}",
        f"eval script: {config.eval_script}; log parser: {config.log_parser}; "
        f"test timeout: {config.test_timeout_s}s",
        f"patch applied: {report.apply_method or 'no'}",
        "",
        report.log_tail,
        "",
        f"result: resolved={report.resolved} log_valid={report.log_valid} "
        f"({report.duration_s:.1f} s) {detail}".rstrip(),
    ]
    path.write_text("\n".join(head) + "\n")
