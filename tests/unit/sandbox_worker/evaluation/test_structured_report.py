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
    # A canary that could not be planted (unusual collector) is reported, not a failure.
    unavailable = _lines({"event": "canary_unavailable", "reason": "x"}) + finished
    assert parse_structured_report(unavailable, 1, "test_c").problem is None
    honest = _lines({"event": "canary", "made": "failed", "logged": "skipped"}) + finished
    assert parse_structured_report(honest, 1, "test_c").problem is None
    for made, logged in (("passed", "passed"), ("failed", "passed"), (None, "skipped")):
        forged = _lines({"event": "canary", "made": made, "logged": logged}) + finished
        assert "forged" in (parse_structured_report(forged, 1, "test_c").problem or "")


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


def _run_suite(
    tmp_path: Path, files: dict[str, str], canary: str | None, plugin: bool = True
) -> tuple[subprocess.CompletedProcess[str], Path]:
    suite, plugin_dir = tmp_path / "suite", tmp_path / "secret"
    for rel, text in files.items():
        (suite / rel).parent.mkdir(parents=True, exist_ok=True)
        (suite / rel).write_text(text)
    plugin_dir.mkdir(exist_ok=True)
    (plugin_dir / "swerl_report_abc.py").write_bytes(PLUGIN.read_bytes())
    if canary is not None:
        (plugin_dir / "canary").write_text(canary)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    if plugin:
        env.update(PYTHONPATH=str(plugin_dir), PYTEST_ADDOPTS="-p swerl_report_abc")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "."],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return run, plugin_dir / "report.jsonl"


PASSING = "def test_a():\n    pass\n\n\ndef test_b():\n    assert 1\n"


@pytest.mark.slow  # runs pytest in a subprocess
def test_canary_leaves_an_honest_run_unchanged(tmp_path: Path) -> None:
    files = {"test_suite.py": SUITE}
    plain, _ = _run_suite(tmp_path / "plain", files, None, plugin=False)
    run, report_path = _run_suite(tmp_path / "canary", files, "test_c4n4ry")
    assert run.returncode == plain.returncode == 1
    report = parse_structured_report(report_path.read_text(), run.returncode, "test_c4n4ry")
    assert report.problem is None, report_path.read_text()
    assert report.status_map == parse_log_pytest(run.stdout) == parse_log_pytest(plain.stdout)
    assert "test_c4n4ry" not in str(report.status_map)
    # All passing: the canary does not turn exit status 0 into 1.
    ok, ok_path = _run_suite(tmp_path / "ok", {"test_ok.py": PASSING}, "test_c4n4ry")
    assert ok.returncode == 0, ok.stdout
    ok_report = parse_structured_report(ok_path.read_text(), 0, "test_c4n4ry")
    assert ok_report.problem is None
    assert ok_report.status_map == {"test_ok.py::test_a": "PASSED", "test_ok.py::test_b": "PASSED"}


@pytest.mark.slow  # runs pytest in a subprocess
def test_canary_exposes_forged_reports(tmp_path: Path) -> None:
    forging_conftest = (
        "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    report = outcome.get_result()\n"
        "    if report.failed:\n        report.outcome = 'passed'\n        report.longrepr = None\n"
    )
    files = {"test_suite.py": "def test_x():\n    assert False\n", "conftest.py": forging_conftest}
    run, report_path = _run_suite(tmp_path, files, "test_c4n4ry")
    assert run.returncode == 0  # the forgery works on pytest's own accounting...
    report = parse_structured_report(report_path.read_text(), 0, "test_c4n4ry")
    assert report.problem is not None and "canary" in report.problem  # ...not on the canary
    assert "forged" in report.problem
    # Without a canary record at all (tests removed in-process), the report is not trusted.
    lines = [line for line in report_path.read_text().splitlines() if '"canary"' not in line]
    stripped = parse_structured_report("\n".join(lines), 0, "test_c4n4ry")
    assert stripped.problem is not None and "never reported" in stripped.problem
    # No canary planted (unusual collectors): nothing to check.
    assert parse_structured_report("\n".join(lines), 0, None).problem is None
