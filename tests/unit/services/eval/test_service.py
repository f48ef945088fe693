"""The evaluator service's pure parts: progress from the script's output, the job's result rows
and metrics from a run report, the script's command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.api.schemas import EvalSpec
from services.eval.service import command_for, infra_ids, metrics_of, progress_of, result_rows
from services.eval.service_config import EvalServiceConfig


def test_progress_counts_ungraded_instances_as_done() -> None:
    assert progress_of("", generating=True).phase == "generating"
    assert progress_of("noise\n", generating=False).phase == "starting"
    out = (
        "run j1: 5 instance(s), 3 to grade (0 already graded) with the bwrap backend, 2 worker(s)\n"
        "[1/3] a: resolved (1.0 s)\n[2/3] b: error: the tests timed out (9.0 s)\n"
    )
    got = progress_of(out, generating=False)
    assert (got.done, got.total, got.phase) == (4, 5, "grading")  # 2 empty + 2 graded


def test_rows_and_metrics_keep_infrastructure_failures_apart() -> None:
    report = {
        "total_instances": 4, "submitted_instances": 4, "completed_instances": 2,
        "resolved_instances": 1, "unresolved_instances": 1, "empty_patch_instances": 0,
        "error_instances": 1, "infra_failure_instances": 0,
        "resolved_ids": ["a"], "unresolved_ids": ["b"], "error_ids": ["c"],
        "empty_patch_ids": [], "incomplete_ids": ["d"], "failure_reasons": {"b": "sig"},
    }  # fmt: skip
    rows = result_rows(report, infra=["c"])
    assert [(r["instance_id"], r["status"], r["infra_failure"]) for r in rows] == [
        ("a", "resolved", False), ("b", "unresolved", False), ("c", "error", True),
        ("d", "incomplete", False),
    ]  # fmt: skip
    assert rows[1]["failure_reason"] == "sig"
    metrics = metrics_of(report, infra=["c"])
    assert metrics["resolved_rate"] == 0.25
    assert (metrics["infra_error_instances"], metrics["incomplete_instances"]) == (1.0, 1.0)


def test_command_line_of_a_checkpoint_job() -> None:
    spec = EvalSpec(checkpoint="/ckpt/s200", dataset="v.parquet", instance_ids=["x", "y"])
    cfg = EvalServiceConfig(engine_url=["http://e0:1", "http://e1:1"], image_namespace="swebench")
    argv = command_for(spec, cfg, Path("/r/j1"), "j1")
    joined = " ".join(argv[1:])
    assert joined.startswith("-m services.eval --dataset v.parquet --model /ckpt/s200 ")
    parts = ["--engine-url http://e0:1,http://e1:1", "--run-id j1 --resume", "--instances x,y",
             "--image-namespace swebench", "--report-dir /r/j1"]  # fmt: skip
    for part in parts:
        assert part in joined, joined
    assert "--predictions" not in argv and "--max-instances" not in argv


def test_the_sandbox_state_root_reaches_the_script_only_when_set() -> None:
    spec = EvalSpec(predictions="/p.jsonl", dataset="v.jsonl")
    plain = command_for(spec, EvalServiceConfig(), Path("/r/j2"), "j2")
    assert "--state-root" not in plain
    cfg = EvalServiceConfig(state_root="/var/lib/other/sandboxes")
    argv = command_for(spec, cfg, Path("/r/j2"), "j2")
    assert argv[argv.index("--state-root") + 1] == "/var/lib/other/sandboxes"
    with pytest.raises(ValueError, match="state_root"):
        EvalServiceConfig(state_root="relative/dir")


def test_rows_and_metrics_carry_the_hardened_verdict_and_the_tamper_flags() -> None:
    report = {
        "total_instances": 4, "resolved_instances": 2, "resolved_ids": ["a", "b"],
        "unresolved_ids": ["c"], "error_ids": [], "empty_patch_ids": ["d"],
        "incomplete_ids": [], "hardened_evaluation": True, "hardened_resolved_instances": 1,
        "hardened_infra_failure_ids": [], "tampered_ids": ["b", "c"],
        "tamper_counts": {"test_infra_touched": 1, "git_touched": 1,
                          "resolved_only_official": 1},
        "verdicts": {
            "a": {"hardened_resolved": True, "tamper": []},
            "b": {"hardened_resolved": False,
                  "tamper": ["resolved_only_official", "test_infra_touched"]},
            "c": {"hardened_resolved": False, "tamper": ["git_touched"]},
        },
    }  # fmt: skip
    rows = {r["instance_id"]: r for r in result_rows(report, infra=[])}
    assert rows["b"]["hardened_resolved"] is False and rows["a"]["hardened_resolved"] is True
    assert rows["b"]["tamper"] == ["resolved_only_official", "test_infra_touched"]
    assert (rows["d"]["hardened_resolved"], rows["d"]["tamper"]) == (None, [])  # never graded
    metrics = metrics_of(report, infra=[])
    assert (metrics["resolved_rate"], metrics["hardened_resolved_rate"]) == (0.5, 0.25)
    assert metrics["tampered_instances"] == 2.0
    assert metrics["tamper_resolved_only_official_instances"] == 1.0
    off = metrics_of({**report, "hardened_evaluation": False}, infra=[])
    assert "hardened_resolved_rate" not in off  # --no-hardened: no rate of a pass not run


def test_a_hardened_infrastructure_failure_counts_as_one(tmp_path: Path) -> None:
    report = {"infra_failure_ids": ["a"], "hardened_infra_failure_ids": ["b"], "error_ids": []}
    assert infra_ids(report, tmp_path, "j1") == ["a", "b"]


def test_the_service_passes_no_hardened_only_when_configured_off() -> None:
    spec = EvalSpec(predictions="/p.jsonl", dataset="v.jsonl")
    assert "--no-hardened" not in command_for(spec, EvalServiceConfig(), Path("/r/j"), "j")
    off = command_for(spec, EvalServiceConfig(hardened=False), Path("/r/j"), "j")
    assert "--no-hardened" in off
