"""The pytest log parser of the SWE-bench harness (``parse_log_pytest``), re-implemented.

It reads the short test summary that ``pytest -rA`` prints, one ``STATUS node_id`` line per
test (``FAILED node_id - message`` for failures), and maps each node id to its status. Lines
that do not start with a status are ignored, so a test that never reports (crashed collection,
killed run) is simply *missing*, which grading counts as a failure. pytest's skip summary
(``SKIPPED [2] path:line: reason``) names no test and is dropped, as swebench 5.0.2 does.
Re-implemented rather than imported because the ``swebench`` package drags in an unreasonable
dependency tree (modal, datasets, docker...); ``tests/unit/evaluation`` compares this parser
with swebench's on the same logs.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sandbox_worker.evaluation.constants import TestStatus

LogParser = Callable[[str], dict[str, str]]

_STATUSES = tuple(status.value for status in TestStatus)
_SKIP_SUMMARY_COUNT = re.compile(r"^\[\d+\]$")


def parse_log_pytest(log: str) -> dict[str, str]:
    """Map each test node id in ``log`` to its status (the last line for a test wins)."""
    status_map: dict[str, str] = {}
    for line in log.split("\n"):
        if not line.startswith(_STATUSES):
            continue
        if line.startswith(TestStatus.FAILED.value):
            line = line.replace(" - ", " ")
        fields = line.split()
        if len(fields) <= 1:
            continue
        status, test = fields[0], fields[1]
        if status == TestStatus.SKIPPED.value and _SKIP_SUMMARY_COUNT.match(test):
            continue
        status_map[test] = status
    return status_map


LOG_PARSERS: dict[str, LogParser] = {"pytest": parse_log_pytest}
