"""The structured report: the plugin's records -> the status map the log parser would read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_worker.evaluation.log_parser import parse_log_pytest
from sandbox_worker.evaluation.structured_report import parse_structured_report
from tests.support.paths import REPO_ROOT

PLUGIN = REPO_ROOT / "sandbox_worker/evaluation/pytest_report_plugin.py"


def _lines(*records: dict[str, object]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _rep(nodeid: str, when: str, outcome: str, xfail: bool = False) -> dict[str, object]:
    return {"nodeid": nodeid, "when": when, "outcome": outcome, "xfail": xfail}


KEEP_GOING = ("--continue-on-collection-errors",)
FINISH_1 = {"event": "sessionfinish", "exitstatus": 1}


def test_statuses_follow_the_short_summary() -> None:
    text = _lines(
        _rep("t.py::ok", "setup", "passed"),
        _rep("t.py::ok", "call", "passed"),
        _rep("t.py::ok", "teardown", "passed"),
        _rep("t.py::bad", "call", "failed"),
        _rep("t.py::bad_setup", "setup", "failed"),
        _rep("t.py::bad_teardown", "call", "passed"),
        _rep("t.py::bad_teardown", "teardown", "failed"),  # PASSED then ERROR: ERROR is later
        _rep("t.py::xf", "call", "skipped", xfail=True),
        _rep("t.py::xp", "call", "passed", xfail=True),  # XPASS: the log parser reads none
        _rep("t.py::sk", "setup", "skipped"),  # skips are summarised by location only
        {"nodeid": "broken.py", "when": "collect", "outcome": "failed", "xfail": False},
        FINISH_1,
    )
    report = parse_structured_report(text, 1)
    assert report.problem is None and report.exitstatus == 1
    assert report.status_map == {
        "t.py::ok": "PASSED",
        "t.py::bad": "FAILED",
        "t.py::bad_setup": "ERROR",
        "t.py::bad_teardown": "ERROR",
        "t.py::xf": "XFAIL",
        "broken.py": "ERROR",
    }


def test_untrustworthy_reports() -> None:
    passing = _lines(_rep("t.py::a", "call", "passed"))
    assert "no session-finish" in (parse_structured_report(passing, 0).problem or "")
    finished = passing + _lines({"event": "sessionfinish", "exitstatus": 1})
    # pytest said 1, the process exited 0 (os._exit at exit): not trusted.
    assert "exited with 0" in (parse_structured_report(finished, 0).problem or "")
    assert "exited with None" in (parse_structured_report(finished, None).problem or "")
    late = finished + _lines(_rep("t.py::b", "call", "passed"))
    assert "after the session finished" in (parse_structured_report(late, 1).problem or "")
    assert "not JSON" in (parse_structured_report("{oops\n", 0).problem or "")
    assert "not an object" in (parse_structured_report("[1]\n", 0).problem or "")
    untrusted = parse_structured_report(finished, 0)
    assert untrusted.status_map == {"t.py::a": "PASSED"}  # the caller discards it


SUITE = """import pytest


@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown")


@pytest.fixture
def broken_setup():
    raise RuntimeError("setup")


def test_pass():
    print("PASSED test_suite.py::test_fail")


def test_fail():
    assert False


def test_setup_error(broken_setup):
    pass


def test_teardown_error(broken_teardown):
    pass


@pytest.mark.xfail
def test_xfail():
    assert False


@pytest.mark.xfail
def test_xpass():
    pass


@pytest.mark.xfail(strict=True)
def test_xpass_strict():
    pass


@pytest.mark.skip
def test_skip():
    pass


@pytest.mark.parametrize("x", [1, "a-b", "a::b"])
def test_param(x):
    assert x != 1
"""


@pytest.mark.slow  # runs pytest in a subprocess
def test_plugin_on_a_real_pytest_run_matches_the_log_parser(tmp_path: Path) -> None:
    """Run the plugin in pytest (host venv) on a suite with every kind of outcome."""
    suite, plugin_dir = tmp_path / "suite", tmp_path / "secret"
    suite.mkdir()
    plugin_dir.mkdir()
    (suite / "test_suite.py").write_text(SUITE)
    (suite / "test_broken.py").write_text("import no_such_module_here\n")
    (plugin_dir / "swerl_report_abc.py").write_bytes(PLUGIN.read_bytes())
    env = {
        **os.environ,
        "PYTHONPATH": str(plugin_dir),
        "PYTEST_ADDOPTS": "-p swerl_report_abc",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *KEEP_GOING, "."],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout
    report = parse_structured_report((plugin_dir / "report.jsonl").read_text(), run.returncode)
    assert report.problem is None
    log_map = parse_log_pytest(run.stdout)
    assert report.status_map == log_map, run.stdout
    # The fake line the test printed is in the log but does not change either map.
    assert "PASSED test_suite.py::test_fail" in run.stdout
    assert report.status_map["test_suite.py::test_fail"] == "FAILED"
    assert report.status_map["test_suite.py::test_teardown_error"] == "ERROR"
    assert report.status_map["test_broken.py"] == "ERROR"


PASSING = "def test_a():\n    pass\n\n\ndef test_b():\n    assert 1\n"


@pytest.mark.slow  # runs pytest in a subprocess
def test_the_plugin_adds_no_test_of_its_own(tmp_path: Path) -> None:
    """An appended test is one the code under test can tell apart (canaries.py plants them in
    the source instead): the report holds exactly the suite's tests, even with a ``canary``
    file next to the plugin (the old plugin appended a test named by it)."""
    suite, plugin_dir = tmp_path / "suite", tmp_path / "secret"
    suite.mkdir()
    plugin_dir.mkdir()
    (suite / "test_ok.py").write_text(PASSING)
    (plugin_dir / "swerl_report_abc.py").write_bytes(PLUGIN.read_bytes())
    (plugin_dir / "canary").write_text("test_c4n4ry")
    env = {
        **os.environ,
        "PYTHONPATH": str(plugin_dir),
        "PYTEST_ADDOPTS": "-p swerl_report_abc",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "."],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout
    text = (plugin_dir / "report.jsonl").read_text()
    records = [json.loads(line) for line in text.splitlines()]
    assert {r["nodeid"] for r in records if "nodeid" in r} == {
        "test_ok.py::test_a",
        "test_ok.py::test_b",
    }
    assert [r for r in records if "event" in r] == [{"event": "sessionfinish", "exitstatus": 0}]
    assert parse_structured_report(text, 0).status_map == parse_log_pytest(run.stdout)
