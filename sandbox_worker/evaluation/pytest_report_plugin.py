"""A pytest plugin that writes each test report as one JSON line (the structured report).

The evaluation copies this file's *source* into the evaluation sandbox, outside the repository,
under a per-run random directory and module name, and loads it with ``-p <module>`` through
``PYTEST_ADDOPTS``; the host reads ``report.jsonl`` next to it back after the run. It must run
on every Python and pytest a SWE-bench environment has (Python >= 3.6, pytest >= 3): no
f-strings, no walrus, only long-standing hooks.

It records what pytest reports, nothing more: every failed collection, every setup, call and
teardown report, and the session's exit status last. It adds no test of its own: a test the
plugin added would be told apart from the instance's tests by the code under test (its callable,
its module, its absence from the source). The canaries that expose forged reports are planted
in the test files' source instead (``canaries.py``), and the host checks them on this report
and on the log alike.
"""

import json
import os

_DIR = os.path.dirname(os.path.abspath(__file__))
_REPORT = os.path.join(_DIR, "report.jsonl")
_state = {"handle": None}


def _emit(record):
    handle = _state["handle"]
    if handle is not None:
        handle.write(json.dumps(record) + "\n")
        handle.flush()


def pytest_configure(config):
    # An xdist worker's reports reach the main process, which records them.
    if getattr(config, "workerinput", None) is None:
        _state["handle"] = open(_REPORT, "w")  # noqa: SIM115 (open for the whole session)


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
