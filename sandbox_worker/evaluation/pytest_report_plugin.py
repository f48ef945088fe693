"""A pytest plugin that writes each test report as one JSON line (the structured report).

The evaluation copies this file's *source* into the evaluation sandbox, outside the repository,
under a per-run random directory and module name, and loads it with ``-p <module>`` through
``PYTEST_ADDOPTS``; the host reads ``report.jsonl`` next to it back after the run. It only
observes (no hook changes an outcome), so the tests run exactly as without it. It must run on
every Python and pytest a SWE-bench environment has (Python >= 3.6, pytest >= 3): no f-strings,
no walrus, only long-standing hooks.
"""

import json
import os

_REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.jsonl")
# Opened at plugin load, before any conftest or test module; open for the whole session.
_handle = open(_REPORT, "w")  # noqa: SIM115


def _emit(record):
    _handle.write(json.dumps(record) + "\n")
    _handle.flush()


def pytest_collectreport(report):
    if report.failed:
        _emit({"nodeid": report.nodeid, "when": "collect", "outcome": "failed", "xfail": False})


def pytest_runtest_logreport(report):
    _emit(
        {
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "xfail": hasattr(report, "wasxfail"),
        }
    )


def pytest_sessionfinish(session, exitstatus):
    _emit({"event": "sessionfinish", "exitstatus": int(exitstatus)})
