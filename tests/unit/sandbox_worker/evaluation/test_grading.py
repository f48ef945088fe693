"""Grading on hand-written logs: SWE-bench's rules, case by case."""

from __future__ import annotations

import pytest

from sandbox_worker.evaluation import grading
from sandbox_worker.evaluation.constants import ResolvedStatus
from sandbox_worker.evaluation.log_parser import parse_log_pytest
from tests.support import eval_logs as logs

A = "tests/test_a.py::"


def grade(log: str, f2p: list[str], p2p: list[str]) -> tuple[grading.TestsReport, str, bool]:
    status_map, valid = grading.get_logs_eval(log)
    report = grading.get_eval_tests_report(status_map, f2p, p2p)
    return report, grading.resolution_status(report).value, valid


def test_all_pass_resolves() -> None:
    report, status, valid = grade(
        logs.ALL_PASS, [A + "test_two"], [A + "test_one", A + "test_param[x-1]"]
    )
    assert valid and status == "RESOLVED_FULL"
    assert report.f2p_success == [A + "test_two"]
    assert report.p2p_success == [A + "test_one", A + "test_param[x-1]"]
    assert report.f2p_failure == [] and report.p2p_failure == []


def test_failed_f2p_is_not_resolved_and_partial_when_some_pass() -> None:
    report, status, valid = grade(logs.ONE_FAILS, [A + "test_two"], [A + "test_one"])
    assert valid and status == "RESOLVED_NO"
    assert report.f2p_failure == [A + "test_two"]
    _, status, _ = grade(logs.ONE_FAILS, [A + "test_one", A + "test_two"], [])
    assert status == "RESOLVED_PARTIAL"


def test_failed_p2p_breaks_resolution() -> None:
    report, status, _ = grade(logs.ONE_FAILS, [A + "test_one"], [A + "test_two"])
    assert status == "RESOLVED_NO" and report.p2p_failure == [A + "test_two"]


def test_skipped_fails_f2p_but_maintains_p2p() -> None:
    report, status, _ = grade(logs.F2P_SKIPPED_VERBOSE, [A + "test_two"], [])
    assert status == "RESOLVED_NO" and report.f2p_failure == [A + "test_two"]
    report, status, _ = grade(logs.F2P_SKIPPED_VERBOSE, [A + "test_one"], [A + "test_two"])
    assert status == "RESOLVED_FULL" and report.p2p_success == [A + "test_two"]


def test_skip_summary_names_no_test_so_the_test_is_missing() -> None:
    status_map, _ = grading.get_logs_eval(logs.SKIP_SUMMARY_ONLY)
    assert "[1]" not in status_map and A + "test_two" not in status_map
    report, status, _ = grade(logs.SKIP_SUMMARY_ONLY, [A + "test_one"], [A + "test_two"])
    assert status == "RESOLVED_NO" and report.p2p_failure == [A + "test_two"]


def test_xfail_passes_and_xpass_is_missing() -> None:
    report, status, _ = grade(logs.XFAIL, [A + "test_two"], [A + "test_one"])
    assert status == "RESOLVED_FULL" and report.f2p_success == [A + "test_two"]
    report, status, _ = grade(logs.XFAIL, [A + "test_two"], [A + "TestK::test_method"])
    assert status == "RESOLVED_NO" and report.p2p_failure == [A + "TestK::test_method"]


def test_missing_test_fails() -> None:
    report, status, _ = grade(logs.ALL_PASS, [A + "test_does_not_exist"], [A + "test_one"])
    assert status == "RESOLVED_NO" and report.f2p_failure == [A + "test_does_not_exist"]


def test_errors_fail() -> None:
    status_map, valid = grading.get_logs_eval(logs.ERRORS)
    assert valid and status_map["tests/test_b.py"] == "ERROR"
    report, status, _ = grade(logs.ERRORS, [A + "test_two"], [A + "test_one"])
    assert status == "RESOLVED_NO" and report.f2p_failure == [A + "test_two"]


@pytest.mark.parametrize(
    "log",
    [logs.NO_MARKERS, logs.TIMED_OUT, logs.FAKE_PASS_EXIT_1, logs.NOTHING_RAN],
    ids=["no-markers", "timed-out", "passes-but-exit-1", "nothing-ran"],
)
def test_invalid_logs_grade_nothing(log: str) -> None:
    status_map, valid = grading.get_logs_eval(log)
    assert (status_map, valid) == ({}, False)
    report, status, _ = grade(log, [A + "test_one"], [])
    assert status == "RESOLVED_NO" and report.f2p_failure == [A + "test_one"]


def test_results_outside_the_markers_are_used_when_none_inside() -> None:
    status_map, valid = grading.get_logs_eval(logs.OUTSIDE_MARKERS)
    assert valid and status_map == {A + "test_one": "PASSED"}


def test_truncated_parametrized_ids_match_when_unambiguous() -> None:
    _, status, _ = grade(logs.TRUNCATED_IDS, [A + "test_param[log(photon"], [])
    assert status == "RESOLVED_FULL"
    # Candidates disagree (one passed, one failed): no match, so the test fails.
    _, status, _ = grade(logs.TRUNCATED_IDS, [A + "test_mixed["], [])
    assert status == "RESOLVED_NO"
    # Ids that are not truncated never prefix-match.
    _, status, _ = grade(logs.TRUNCATED_IDS, [A + "test_param"], [])
    assert status == "RESOLVED_NO"


def test_empty_lists_resolve_like_swebench() -> None:
    assert grading.resolution_status(grading.get_eval_tests_report({}, [], [])) == (
        ResolvedStatus.FULL
    )


def test_exit_code_is_read_from_the_marker_line() -> None:
    assert grading.parse_test_exit_code(logs.ONE_FAILS) == 1
    assert grading.parse_test_exit_code(logs.eval_log("", exit_code=None)) is None


def test_parser_reads_pytest_summary_lines() -> None:
    status_map = parse_log_pytest(logs.ONE_FAILS)
    assert status_map == {
        A + "test_one": "PASSED",
        A + "test_two": "FAILED",
        A + "test_param[x-1]": "PASSED",
        A + "TestK::test_method": "PASSED",
    }


def test_parser_last_line_wins_and_ignores_indented_or_bare_statuses() -> None:
    log = "FAILED t.py::a - x\nPASSED t.py::a\n  PASSED t.py::b\nPASSED\nERROR t.py::c"
    assert parse_log_pytest(log) == {"t.py::a": "PASSED", "t.py::c": "ERROR"}
