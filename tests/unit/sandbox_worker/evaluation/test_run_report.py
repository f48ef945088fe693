"""The harness's run report and failure signatures, against swebench 5.0.2's own code on the
same files (``reporting.make_run_report``, ``infra_failure``; loaded as swebench_ref does)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from sandbox_worker.evaluation import run_report
from services.datasets.predictions import Prediction
from tests.support import swebench_ref

SWE = swebench_ref.load()
RUN = "r1"


def _theirs(module: str) -> object:
    return importlib.import_module(f"swebench.harness.{module}")


def test_signatures_are_the_harness_table() -> None:
    infra = _theirs("infra_failure")
    assert run_report.INFRA_FAILURE_SIGNATURES == infra.INFRA_FAILURE_SIGNATURES  # type: ignore[attr-defined]
    assert run_report.TIER_ENVIRONMENT == infra.TIER_ENVIRONMENT  # type: ignore[attr-defined]
    assert run_report.timeout_note(60).strip() == "Timeout error: 60 seconds exceeded."


@pytest.mark.parametrize(
    "text",
    ["", "Killed", "x\nCannot allocate memory\n", "collected 0 items", "ModuleNotFoundError: y",
     "Timeout error: 1800 seconds exceeded.", "Error response from daemon: no", "all fine"],
)  # fmt: skip
def test_classification_matches_the_harness(text: str) -> None:
    infra = _theirs("infra_failure")
    assert run_report.classify_text(text) == infra.classify_text(text)  # type: ignore[attr-defined]


def _layout(root: Path) -> tuple[dict[str, Prediction], list[str]]:
    """A run directory with every case make_run_report distinguishes."""
    preds = {
        iid: Prediction(instance_id=iid, model_name_or_path="org/m", model_patch=patch)
        for iid, patch in [
            ("a-1", "diff"), ("a-2", "diff"), ("a-3", "diff"), ("a-4", "diff"), ("a-5", ""),
            ("a-6", None), ("a-7", "diff"), ("a-8", "diff"), ("a-9", "diff"),
        ]
    }  # fmt: skip
    reports = {
        "a-1": json.dumps({"a-1": {"resolved": True}}),
        "a-2": json.dumps({"a-2": {"resolved": False}}),
        "a-3": "",  # empty report: an error
        "a-4": "{not json",
        "a-9": json.dumps({"other": {}}),  # missing key
    }
    logs = {
        "a-2": "collected 0 items",
        "a-7": "Killed",
        "a-8": "Timeout error: 5 seconds exceeded.",
    }
    for iid, pred in preds.items():
        log_dir = run_report.instance_log_dir(root, RUN, pred)
        log_dir.mkdir(parents=True)
        if iid in reports:
            (log_dir / run_report.LOG_REPORT).write_text(reports[iid])
        if iid in logs:
            (log_dir / run_report.LOG_TEST_OUTPUT).write_text(logs[iid])
    (run_report.instance_log_dir(root, RUN, preds["a-7"]) / run_report.LOG_INSTANCE).write_text(
        "sandbox: Cannot connect to the Docker daemon"
    )
    return preds, [*preds, "a-10"]  # a-10: in the dataset, no prediction


def test_run_report_matches_make_run_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    preds, dataset_ids = _layout(tmp_path)
    ours = run_report.make_run_report(preds, dataset_ids, tmp_path, RUN)
    monkeypatch.chdir(tmp_path)  # the harness's log directory is relative to the cwd
    path = _theirs("reporting").make_run_report(  # type: ignore[attr-defined]
        {iid: p.model_dump() for iid, p in preds.items()},
        [{"instance_id": iid} for iid in dataset_ids],
        RUN,
        report_dir=str(tmp_path / "theirs"),
    )
    assert ours == json.loads(Path(path).read_text())
    assert Path(path).name == run_report.run_report_path(tmp_path, RUN, preds).name
    # and the cases are what they say (not only "equal to swebench")
    assert ours["resolved_ids"] == ["a-1"] and ours["unresolved_ids"] == ["a-2"]
    assert ours["error_ids"] == ["a-3", "a-4", "a-7", "a-8", "a-9"]
    assert ours["empty_patch_ids"] == ["a-5", "a-6"] and ours["incomplete_ids"] == ["a-10"]
    assert ours["failure_reasons"] == {
        "a-2": "no_tests_collected", "a-7": "out_of_memory", "a-8": "tests_timed_out"
    }  # fmt: skip
    assert ours["infra_failure_ids"] == ["a-7"]


def test_completed_is_a_report_file(tmp_path: Path) -> None:
    preds, _ = _layout(tmp_path)
    done = {iid for iid, p in preds.items() if run_report.is_completed(tmp_path, RUN, p)}
    assert done == {"a-1", "a-2", "a-3", "a-4", "a-9"}
