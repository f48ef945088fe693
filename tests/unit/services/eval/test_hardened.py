"""The hardened verdict of one prediction and the run report's summary of them, without
sandboxes: which flags a prediction gets, when the verdicts count as disagreeing, how the file
round-trips and what the run report and the printed summary say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox_worker.evaluation import EvalReport
from services.eval.hardened import (
    HARDENED_FILE,
    KNOWN_FLAGS,
    RESOLVED_ONLY_OFFICIAL,
    Verdict,
    combine,
    is_hardened,
    read_verdict,
    summary_keys,
    summary_lines,
    write_verdict,
)

RESOLVED = ("resolved", "", False)
UNRESOLVED = ("unresolved", "failing: t::x", False)


def _report(**fields: object) -> EvalReport:
    return EvalReport(instance_id="a__b-1", **fields)  # type: ignore[arg-type]


def test_gold_resolved_by_both_passes_has_no_flag() -> None:
    official = _report(applied=True, resolved=True, grading="swebench")
    hardened = _report(applied=True, resolved=True)
    got = combine(official, True, hardened, RESOLVED)
    assert (got.resolved, got.hardened_resolved, got.tamper) == (True, True, [])


def test_a_verdict_only_the_official_grading_gives_is_flagged() -> None:
    """A forged conftest: the official pass grades the tree as the patch left it (resolved),
    the hardened one restores it (unresolved); both saw the test infrastructure touched."""
    touched = {"conftest.py": "pytest hook file"}
    official = _report(
        applied=True, resolved=True, tamper=["test_infra_touched"], infra_touched=touched
    )
    hardened = _report(
        applied=True, tamper=["test_infra_touched"], infra_touched=touched,
        protected_restored=touched,
    )  # fmt: skip
    got = combine(official, True, hardened, UNRESOLVED)
    assert got.hardened_resolved is False
    assert got.tamper == sorted([RESOLVED_ONLY_OFFICIAL, "test_infra_touched"])
    assert got.infra_touched == touched and got.hardened_detail == "failing: t::x"


def test_flags_of_both_passes_are_united_and_the_strict_reason_kept() -> None:
    """A context diff into .git/config: GNU patch applies it in the official pass (git_touched),
    the strict parser refuses it in both."""
    refusal = "not a git-format diff: *** a/.git/config"
    official = _report(
        applied=True, tamper=["git_touched", "patch_refused_strict"], strict_refusal=refusal
    )
    hardened = _report(
        patch_rejected=refusal, tamper=["patch_refused_strict"], strict_refusal=refusal
    )
    got = combine(official, False, hardened, ("error", f"patch refused: {refusal}", False))
    assert got.tamper == ["git_touched", "patch_refused_strict"]
    assert got.strict_refusal == refusal and got.hardened_status == "error"
    assert got.hardened_resolved is False  # a refusal is a verdict: not resolved


def test_without_the_hardened_pass_the_official_flags_remain_and_nothing_disagrees() -> None:
    official = _report(applied=True, resolved=True, tamper=["test_infra_touched"])
    got = combine(official, True, None, None)
    assert got.hardened_status == "not_run" and got.hardened_resolved is None
    assert got.tamper == ["test_infra_touched"]  # no resolved_only_official: nothing to compare
    assert not is_hardened(got)


def test_an_infrastructure_failure_of_the_hardened_pass_is_unknown_not_unresolved() -> None:
    official = _report(applied=True, resolved=True)
    hardened = _report(infra_error="sandbox creation failed: boom")
    got = combine(official, True, hardened, ("error", "infrastructure failure: boom", True))
    assert got.hardened_resolved is None and got.hardened_infra
    assert RESOLVED_ONLY_OFFICIAL not in got.tamper and not is_hardened(got)


def test_an_official_infrastructure_failure_skips_the_hardened_pass_with_the_reason() -> None:
    got = combine(_report(infra_error="image missing"), False, None, None)
    assert got.hardened_status == "not_run" and "infrastructure failure" in got.hardened_detail


def test_the_verdict_file_round_trips_and_a_damaged_one_is_none(tmp_path: Path) -> None:
    verdict = Verdict(
        "a__b-1", True, "unresolved", "failing: t::x", False, ("test_infra_touched",),
        {"conftest.py": "hook"}, None,
    )  # fmt: skip
    write_verdict(tmp_path, verdict)
    assert read_verdict(tmp_path) == verdict
    written = json.loads((tmp_path / HARDENED_FILE).read_text())
    assert written["hardened_resolved"] is False
    assert written["tamper"] == [RESOLVED_ONLY_OFFICIAL, "test_infra_touched"]
    for damaged in ("{", "[]", '{"instance_id": "x"}', json.dumps({**written, "flags": 3}),
                    json.dumps({**written, "hardened_status": "great"})):  # fmt: skip
        (tmp_path / HARDENED_FILE).write_text(damaged)
        assert read_verdict(tmp_path) is None, damaged
    assert read_verdict(tmp_path / "missing") is None


def _verdict(iid: str, resolved: bool, status: str, *flags: str, infra: bool = False) -> Verdict:
    return Verdict(iid, resolved, status, "", infra, flags)  # type: ignore[arg-type]


def test_the_summary_counts_each_verdict_and_flag() -> None:
    verdicts = {
        "gold-1": _verdict("gold-1", True, "resolved"),
        "forge-1": _verdict("forge-1", True, "unresolved", "test_infra_touched"),
        "git-1": _verdict("git-1", False, "error", "git_touched", "patch_refused_strict"),
        "flaky-1": _verdict("flaky-1", True, "error", infra=True),
        "old-1": None,  # graded before hardened verdicts existed
        "off-1": _verdict("off-1", False, "not_run"),
    }
    keys = summary_keys(verdicts, ["gold-1", "forge-1", "flaky-1"], enabled=True)
    assert keys["hardened_evaluation"] is True
    assert keys["hardened_resolved_instances"] == 1 and keys["hardened_resolved_ids"] == ["gold-1"]
    assert keys["hardened_unresolved_ids"] == ["forge-1"]
    assert keys["hardened_error_ids"] == ["flaky-1", "git-1"]
    assert keys["hardened_infra_failure_ids"] == ["flaky-1"]
    assert keys["hardened_missing_ids"] == ["off-1", "old-1"]
    assert keys["tamper_ids"][RESOLVED_ONLY_OFFICIAL] == ["forge-1"]  # flaky-1: unknown, not it
    assert keys["tamper_ids"]["git_touched"] == keys["tamper_ids"]["patch_refused_strict"] == [
        "git-1"
    ]  # fmt: skip
    assert keys["tamper_counts"] == {flag: len(keys["tamper_ids"][flag]) for flag in KNOWN_FLAGS}
    assert keys["tamper_counts"]["canary_forged"] == 0  # every known flag is counted
    assert keys["tampered_ids"] == ["forge-1", "git-1"]
    assert set(keys["verdicts"]) == {"gold-1", "forge-1", "git-1", "flaky-1", "off-1"}
    per = keys["verdicts"]["forge-1"]
    assert (per["resolved"], per["hardened_resolved"]) == (True, False)
    assert per["tamper"] == [RESOLVED_ONLY_OFFICIAL, "test_infra_touched"]


def test_the_official_verdict_is_the_run_reports() -> None:
    """The harness's files decide the official verdict: a hardened.json saying otherwise (an
    older grading) does not make an instance resolved only officially."""
    verdicts = {"x-1": _verdict("x-1", True, "unresolved")}
    keys = summary_keys(verdicts, [], enabled=True)
    assert keys["verdicts"]["x-1"]["resolved"] is False and keys["tampered_ids"] == []
    keys = summary_keys({"x-1": _verdict("x-1", False, "unresolved")}, ["x-1"], enabled=True)
    assert keys["tamper_ids"][RESOLVED_ONLY_OFFICIAL] == ["x-1"]


def _run_report(total: int, resolved: int, keys: dict[str, object]) -> dict[str, object]:
    return {"total_instances": total, "resolved_instances": resolved, **keys}


def test_the_printed_summary_gives_the_hardened_rate_and_the_flagged_ids() -> None:
    verdicts = {
        "gold-1": _verdict("gold-1", True, "resolved"),
        "forge-1": _verdict("forge-1", True, "unresolved", "test_infra_touched"),
    }
    keys = summary_keys(verdicts, ["gold-1", "forge-1"], enabled=True)
    lines = summary_lines(_run_report(4, 2, keys))
    assert lines[0] == "Hardened verdict: resolved 1/4 (25.0%), official 2"
    assert "Predictions with tamper flags: 1" in lines
    assert "  test_infra_touched: 1 (forge-1)" in lines
    assert f"  {RESOLVED_ONLY_OFFICIAL}: 1 (forge-1)" in lines
    assert not any(line.startswith("  git_touched") for line in lines)  # zero counts: no line


@pytest.mark.parametrize("count", [3, 12])
def test_long_id_lists_are_cut_in_the_printed_summary(count: int) -> None:
    ids = [f"i-{n:02d}" for n in range(count)]
    verdicts = {i: _verdict(i, False, "unresolved", "git_touched") for i in ids}
    lines = summary_lines(_run_report(count, 0, summary_keys(verdicts, [], enabled=False)))
    assert lines[0].startswith("Hardened verdict: not run (--no-hardened)")
    flagged = next(line for line in lines if line.startswith("  git_touched"))
    assert flagged.startswith(f"  git_touched: {count} (i-00")
    assert ("more)" in flagged) == (count > 10)
