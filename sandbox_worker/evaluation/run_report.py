"""The official harness's outputs for a run of predictions (swebench 5.0.2 ``run_evaluation``).

Layout (relative to a report directory, as the harness lays it out relative to its working
directory): ``logs/run_evaluation/<run_id>/<model>/<instance_id>/`` holds ``patch.diff``,
``eval.sh`` (when the harness's script is the one run), ``run_instance.log``,
``test_output.txt`` (the eval script's output) and ``report.json``
(``get_eval_report``'s shape); the run report is ``<model>.<run_id>.json``
(``reporting.make_run_report``'s keys, ``schema_version`` 2). ``<model>`` is
``model_name_or_path`` with ``/`` -> ``__``.

The harness's rules, kept here:

* ``report.json`` is written only when the eval script ran to its end; a patch that does not
  apply, a test run past the timeout and every infrastructure failure leave none, and the run
  report counts such an instance as an *error* (never unresolved).
* An empty patch (``""`` or ``null``) is never run: ``empty_patch``, not completed.
* ``failure_reasons``, ``infra_failure_ids`` and ``ambiguous_failure_ids`` classify the
  unresolved and error instances by signatures in ``test_output.txt`` + ``run_instance.log``
  (``infra_failure.py``; advisory: the ids stay unresolved / error).

``tests/integration/services/eval/`` checks both reports against swebench's own
``get_eval_report`` and ``make_run_report`` on the same files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sandbox_worker.evaluation.evaluate import EvalReport
from services.datasets.predictions import Prediction

RUN_EVALUATION_LOG_DIR = Path("logs") / "run_evaluation"
LOG_REPORT = "report.json"
LOG_INSTANCE = "run_instance.log"
LOG_TEST_OUTPUT = "test_output.txt"
LOG_PATCH = "patch.diff"
LOG_EVAL_SCRIPT = "eval.sh"  # the harness's eval script (only when it is the one run)
SCHEMA_VERSION = 2

# swebench.harness.infra_failure (5.0.2): (reason, tier, pattern), first hit wins.
TIER_ENVIRONMENT = "environment"
TIER_AMBIGUOUS = "ambiguous"
INFRA_FAILURE_SIGNATURES: tuple[tuple[str, str, str], ...] = (
    ("browser_launch_failed", TIER_ENVIRONMENT, r"Failed to launch|Failed to connect to the bus"),
    (
        "display_unavailable",
        TIER_ENVIRONMENT,
        r"cannot open display|Missing X server|unable to open X display",
    ),
    ("out_of_memory", TIER_ENVIRONMENT, r"Cannot allocate memory|OutOfMemoryError|^Killed$"),
    (
        "container_unavailable",
        TIER_ENVIRONMENT,
        r"Error response from daemon|Cannot connect to the Docker daemon",
    ),
    (
        "network_unreachable",
        TIER_ENVIRONMENT,
        r"Could not resolve host|Temporary failure in name resolution",
    ),
    ("missing_module", TIER_AMBIGUOUS, r"Cannot find module|MODULE_NOT_FOUND|ModuleNotFoundError"),
    ("no_tests_collected", TIER_AMBIGUOUS, r"no tests ran|collected 0 items"),
    ("tests_timed_out", TIER_AMBIGUOUS, r"Timeout error: \d+ seconds exceeded"),
)
_SIGNATURES = tuple((r, t, re.compile(p, re.MULTILINE)) for r, t, p in INFRA_FAILURE_SIGNATURES)


def timeout_note(timeout_s: int) -> str:
    """What the harness appends to ``test_output.txt`` when the eval script timed out."""
    return f"\n\nTimeout error: {timeout_s} seconds exceeded."


def classify_text(text: str) -> tuple[str, str] | None:
    """``(reason, tier)`` of the first matching signature, else None."""
    for reason, tier, pattern in _SIGNATURES:
        if text and pattern.search(text):
            return reason, tier
    return None


def classify_logs(*paths: Path) -> tuple[str, str] | None:
    """Classify the concatenated contents of whichever of ``paths`` exist."""
    chunks = [p.read_text(errors="replace") for p in paths if p.exists()]
    return classify_text("\n".join(chunks))


def instance_log_dir(root: Path, run_id: str, prediction: Prediction) -> Path:
    """``root/logs/run_evaluation/<run_id>/<model>/<instance_id>``."""
    return root / RUN_EVALUATION_LOG_DIR / run_id / prediction.model_dir / prediction.instance_id


def instance_report(report: EvalReport, test_output_path: Path) -> dict[str, Any]:
    """``report.json`` of an instance whose eval script ran (``get_eval_report`` with
    ``include_tests_status=True``); the verdict is the evaluation's own (``grading="swebench"``:
    the same log, the same parser)."""
    entry: dict[str, Any] = {
        "patch_is_None": False,
        "patch_exists": True,
        "patch_successfully_applied": report.log_valid,
        "resolved": report.resolved,
        "infra_failure": False,
    }
    if not report.log_valid:
        entry["resolved"] = False
        if classification := classify_logs(test_output_path):
            reason, tier = classification
            entry["infra_failure"] = tier == TIER_ENVIRONMENT
            entry["infra_failure_reason"] = reason
        return {report.instance_id: entry}
    entry["tests_status"] = {
        "FAIL_TO_PASS": {"success": report.f2p_success, "failure": report.f2p_failure},
        "PASS_TO_PASS": {"success": report.p2p_success, "failure": report.p2p_failure},
        "FAIL_TO_FAIL": {"success": [], "failure": []},
        "PASS_TO_FAIL": {"success": [], "failure": []},
    }
    return {report.instance_id: entry}


def is_completed(root: Path, run_id: str, prediction: Prediction) -> bool:
    """The harness's "already run": the instance's ``report.json`` exists."""
    return (instance_log_dir(root, run_id, prediction) / LOG_REPORT).exists()


def run_report_path(root: Path, run_id: str, predictions: Mapping[str, Prediction]) -> Path:
    """``<model of the first prediction>.<run_id>.json`` in ``root``."""
    return root / f"{next(iter(predictions.values())).model_dir}.{run_id}.json"


def make_run_report(
    predictions: Mapping[str, Prediction], dataset_ids: Sequence[str], root: Path, run_id: str
) -> dict[str, Any]:
    """The run report of ``reporting.make_run_report`` (without a Docker client) from the
    per-instance files under ``root``."""
    ids: dict[str, set[str]] = {
        k: set() for k in ("completed", "resolved", "error", "unresolved", "incomplete", "empty")
    }
    for iid in dataset_ids:
        prediction = predictions.get(iid)
        if prediction is None:
            ids["incomplete"].add(iid)
        elif prediction.is_empty:
            ids["empty"].add(iid)
        else:
            _sort_run(root, run_id, prediction, ids)
    reasons: dict[str, str] = {}
    infra: set[str] = set()
    ambiguous: set[str] = set()
    for iid in ids["unresolved"] | ids["error"]:
        log_dir = instance_log_dir(root, run_id, predictions[iid])
        if found := classify_logs(log_dir / LOG_TEST_OUTPUT, log_dir / LOG_INSTANCE):
            reasons[iid] = found[0]
            (infra if found[1] == TIER_ENVIRONMENT else ambiguous).add(iid)
    return {
        "total_instances": len(dataset_ids),
        "submitted_instances": len(predictions),
        "completed_instances": len(ids["completed"]),
        "resolved_instances": len(ids["resolved"]),
        "unresolved_instances": len(ids["unresolved"]),
        "infra_failure_instances": len(infra),
        "ambiguous_failure_instances": len(ambiguous),
        "empty_patch_instances": len(ids["empty"]),
        "error_instances": len(ids["error"]),
        "completed_ids": sorted(ids["completed"]),
        "incomplete_ids": sorted(ids["incomplete"]),
        "empty_patch_ids": sorted(ids["empty"]),
        "submitted_ids": sorted(predictions),
        "resolved_ids": sorted(ids["resolved"]),
        "unresolved_ids": sorted(ids["unresolved"]),
        "infra_failure_ids": sorted(infra),
        "ambiguous_failure_ids": sorted(ambiguous),
        "failure_reasons": dict(sorted(reasons.items())),
        "error_ids": sorted(ids["error"]),
        "schema_version": SCHEMA_VERSION,
    }


def _sort_run(root: Path, run_id: str, prediction: Prediction, ids: dict[str, set[str]]) -> None:
    iid = prediction.instance_id
    report_file = instance_log_dir(root, run_id, prediction) / LOG_REPORT
    if not report_file.exists():
        ids["error"].add(iid)
        return
    ids["completed"].add(iid)
    content = report_file.read_text().strip()
    try:
        resolved = json.loads(content)[iid]["resolved"] if content else None
    except (json.JSONDecodeError, KeyError, TypeError):
        content = ""  # not valid JSON or missing keys: an error, as the harness says
    if not content:
        ids["error"].add(iid)
    else:
        ids["resolved" if resolved else "unresolved"].add(iid)
