"""Grading with the semantics of ``swebench.harness.grading`` (swebench 5.0.2), re-implemented.

Given the evaluation log and an instance's FAIL_TO_PASS / PASS_TO_PASS lists:

1. :func:`get_logs_eval` validates the log and parses it. A log carrying a harness failure
   marker (patch apply failed, reset failed, tests errored or timed out), missing the start/end
   markers, with no parsed result and no sign that a suite ran, or whose recorded test exit
   status is non-zero while no test failed, is *invalid*: nothing passes.
2. :func:`get_eval_tests_report` sorts every listed test into success/failure. PASSED and
   XFAIL pass. For FAIL_TO_PASS a SKIPPED test fails (a skipped test is not a fix); for
   PASS_TO_PASS a SKIPPED test is maintained. A test missing from the log fails. An expected id
   truncated inside its ``[params]`` matches by prefix when all candidates agree.
3. :func:`resolution_status`: resolved (FULL) only if both lists pass entirely.

Only the ``PASS_AND_FAIL`` evaluation type exists here (``FAIL_ONLY`` is used by a few
JavaScript repositories whose parsers record failures only).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from sandbox_worker.evaluation.constants import (
    APPLY_PATCH_FAIL,
    END_TEST_OUTPUT,
    RESET_FAILED,
    START_TEST_OUTPUT,
    TEST_EXIT_CODE,
    TESTS_ERROR,
    TESTS_TIMEOUT,
    ResolvedStatus,
    TestStatus,
)
from sandbox_worker.evaluation.log_parser import LogParser, parse_log_pytest

# Evidence that a test runner executed, for telling "ran, no parsed results" from "never
# ran" (swebench's SUITE_RAN; the non-pytest alternatives are kept for fidelity).
SUITE_RAN = re.compile(
    r"Executed [1-9]\d* of \d+"
    r"|TOTAL: [1-9]\d* (?:SUCCESS|FAILED)"
    r"|[1-9]\d* passing"
    r"|Tests:\s+[1-9]\d*"
    r"|Test Suites:\s+(?:\d+ \w+, )*[1-9]\d* total"
    r"|^# tests [1-9]\d*"
    r"|[1-9]\d* specs?, \d+ failures?"
    r"|': ok$",
    re.M,
)
_TEST_EXIT_CODE_RE = re.compile(rf"{re.escape(TEST_EXIT_CODE)}:\s*(-?\d+)")
_BAD_CODES = (APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT)
_PASSING = (TestStatus.PASSED.value, TestStatus.XFAIL.value)
_FAILING = (TestStatus.FAILED.value, TestStatus.ERROR.value, TestStatus.SKIPPED.value)


class TestsReport(BaseModel):
    """Which FAIL_TO_PASS / PASS_TO_PASS tests succeeded and which failed."""

    __test__ = False  # not a pytest test class
    model_config = ConfigDict(frozen=True)

    f2p_success: list[str]
    f2p_failure: list[str]
    p2p_success: list[str]
    p2p_failure: list[str]


def parse_test_exit_code(content: str) -> int | None:
    """The test command's exit status recorded by the eval script, or None if absent."""
    match = _TEST_EXIT_CODE_RE.search(content)
    return int(match.group(1)) if match else None


def resolve_case(case: str, status_map: dict[str, str]) -> str | None:
    """The status-map key for ``case``, tolerating ids truncated inside ``[params]``."""
    if case in status_map:
        return case
    if case.count("[") > case.count("]"):
        matches = [key for key in status_map if key.startswith(case)]
        if matches and len({status_map[key] in _PASSING for key in matches}) == 1:
            return matches[0]
    return None


def case_passed(case: str, status_map: dict[str, str]) -> bool:
    key = resolve_case(case, status_map)
    return key is not None and status_map[key] in _PASSING


def case_maintained(case: str, status_map: dict[str, str]) -> bool:
    """PASS_TO_PASS semantics: a skipped test is not a regression."""
    key = resolve_case(case, status_map)
    return case_passed(case, status_map) or (
        key is not None and status_map[key] == TestStatus.SKIPPED.value
    )


def case_failed(case: str, status_map: dict[str, str]) -> bool:
    key = resolve_case(case, status_map)
    return key is None or status_map[key] in _FAILING


def get_logs_eval(
    content: str, parser: LogParser = parse_log_pytest
) -> tuple[dict[str, str], bool]:
    """``(status map, log is valid)`` for an evaluation log."""
    if any(code in content for code in _BAD_CODES):
        return {}, False
    if not (START_TEST_OUTPUT in content and END_TEST_OUTPUT in content):
        return {}, False
    sliced = content.split(START_TEST_OUTPUT)[1].split(END_TEST_OUTPUT)[0]
    status_map = parser(sliced)
    if not status_map:
        # Some runners print results outside the markers: fall back to the whole log.
        status_map = parser(content)
    if not status_map and not SUITE_RAN.search(content):
        return {}, False
    exit_code = parse_test_exit_code(content)
    if (
        exit_code not in (None, 0)
        and status_map
        and not any(
            status in (TestStatus.FAILED.value, TestStatus.ERROR.value)
            for status in status_map.values()
        )
    ):
        # Non-zero exit with no failure in the log: the log does not describe the real run
        # (e.g. a patch printing its own "PASSED" lines).
        return {}, False
    return status_map, True


def get_eval_tests_report(
    status_map: dict[str, str], fail_to_pass: list[str], pass_to_pass: list[str]
) -> TestsReport:
    f2p_success, f2p_failure, p2p_success, p2p_failure = [], [], [], []
    for case in fail_to_pass:
        if case_passed(case, status_map):
            f2p_success.append(case)
        elif case_failed(case, status_map):
            f2p_failure.append(case)
    for case in pass_to_pass:
        if case_maintained(case, status_map):
            p2p_success.append(case)
        elif case_failed(case, status_map):
            p2p_failure.append(case)
    return TestsReport(
        f2p_success=f2p_success,
        f2p_failure=f2p_failure,
        p2p_success=p2p_success,
        p2p_failure=p2p_failure,
    )


def _rate(success: list[str], failure: list[str]) -> float:
    total = len(success) + len(failure)
    return 1.0 if total == 0 else len(success) / total


def resolution_status(report: TestsReport) -> ResolvedStatus:
    f2p = _rate(report.f2p_success, report.f2p_failure)
    p2p = _rate(report.p2p_success, report.p2p_failure)
    if f2p == 1 and p2p == 1:
        return ResolvedStatus.FULL
    if 0 < f2p < 1 and p2p == 1:
        return ResolvedStatus.PARTIAL
    return ResolvedStatus.NO
