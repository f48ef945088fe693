"""The structured test report: per-test statuses from the report plugin's JSON lines.

:mod:`sandbox_worker.evaluation.pytest_report_plugin` records every collection failure and
every setup/call/teardown report; this module turns them into the status map the official log
parser would read from pytest's ``-rA`` short summary, so both can grade the same run:

* call passed -> ``PASSED`` (an unexpected pass of an xfail test is ``XPASS``, which the log
  parser does not read: absent); call failed -> ``FAILED``; setup or teardown failed and a
  failed collection -> ``ERROR``; an xfail -> ``XFAIL``; a skip -> absent (pytest's summary
  names skips by location, not node id, and the log parser drops them).
* One test can appear in several summary sections; the summary prints them in the order
  ``PASSED, SKIPPED, XFAIL, XPASS, ERROR, FAILED`` and the log parser keeps the last, so the
  latest of these wins here too.

The report is valid only if it ends with the session's finish record and that record's exit
status is the exit status the shell saw (a run killed early, or a process that replaced its exit
status after pytest finished with ``os._exit(0)`` at exit, has no trustworthy report), with no
test report after it. Forged outcomes inside the test process are the canaries' business
(``canaries.py``: tests planted in the source, checked on this status map and on the log's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sandbox_worker.evaluation.constants import TestStatus

XPASS = "XPASS"
_ORDER = (
    TestStatus.PASSED.value,
    TestStatus.SKIPPED.value,
    TestStatus.XFAIL.value,
    XPASS,
    TestStatus.ERROR.value,
    TestStatus.FAILED.value,
)
_DROPPED = (TestStatus.SKIPPED.value, XPASS)
MAX_REPORT_BYTES = 64 * 1024 * 1024


@dataclass
class StructuredReport:
    status_map: dict[str, str] = field(default_factory=dict)
    exitstatus: int | None = None  # from the session-finish record; None if it is missing
    problem: str | None = None  # why the report cannot be trusted (None: it can)


def _status(record: dict[str, object]) -> str | None:
    when, outcome, xfail = record.get("when"), record.get("outcome"), bool(record.get("xfail"))
    if outcome == "failed":
        return TestStatus.FAILED.value if when == "call" else TestStatus.ERROR.value
    if outcome == "skipped":
        return TestStatus.XFAIL.value if xfail else TestStatus.SKIPPED.value
    if outcome == "passed" and when == "call":
        return XPASS if xfail else TestStatus.PASSED.value
    return None


def parse_structured_report(text: str, test_exit_code: int | None) -> StructuredReport:
    """Status map and validity of a report (``text``: the plugin's JSON lines;
    ``test_exit_code``: the exit status of the test command as the shell saw it)."""
    report = StructuredReport()
    seen: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            report.problem = f"line {number} is not JSON"
            return report
        if not isinstance(record, dict):
            report.problem = f"line {number} is not an object"
            return report
        if record.get("event") == "sessionfinish":
            status = record.get("exitstatus")
            report.exitstatus = status if isinstance(status, int) else None
            continue
        if report.exitstatus is not None:
            report.problem = "test reports after the session finished"
            return report
        nodeid, status = record.get("nodeid"), _status(record)
        if not isinstance(nodeid, str) or status is None:
            continue
        if nodeid not in seen or _ORDER.index(status) > _ORDER.index(seen[nodeid]):
            seen[nodeid] = status
    if report.exitstatus is None:
        report.problem = "no session-finish record (the test run did not end normally)"
    elif test_exit_code is None or report.exitstatus != test_exit_code:
        report.problem = (
            f"pytest finished with exit status {report.exitstatus} but the test command "
            f"exited with {test_exit_code}"
        )
    report.status_map = {k: v for k, v in seen.items() if v not in _DROPPED}
    return report
