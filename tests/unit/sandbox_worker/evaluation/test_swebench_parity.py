"""Our re-implementation against ``swebench``'s own functions, on the same logs and patches.

Requires ``swebench==5.0.2`` installed with ``--no-deps`` (its full dependency tree — modal,
datasets, docker... — is not needed by the modules compared here) plus ``unidiff``; loaded by
``tests/support/swebench_ref.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_worker.evaluation import grading
from sandbox_worker.evaluation.log_parser import parse_log_pytest
from sandbox_worker.evaluation.patches import modified_files
from services.protocol.instance import SWEInstance
from tests.support import eval_logs as logs
from tests.support import swebench_ref
from tests.support.paths import TEST_DATA

A = "tests/test_a.py::"


SWE = swebench_ref.load()

# (F2P, P2P) pairs graded on every log.
CASES = [
    ([A + "test_two"], [A + "test_one", A + "test_param[x-1]"]),
    ([A + "test_one", A + "test_two"], [A + "TestK::test_method"]),
    ([A + "test_two"], [A + "test_missing"]),
    ([A + "test_param[log(photon", A + "test_mixed["], [A + "test_one"]),
    ([], []),
]


def _spec(f2p: list[str], p2p: list[str]) -> object:
    return SWE["types"].TestSpec(
        instance_id="x__y-1",
        image="img",
        eval_script_list=[],
        repo="x/y",
        version="1.0",
        FAIL_TO_PASS=f2p,
        PASS_TO_PASS=p2p,
        log_parser="parse_log_pytest",
        eval_type="pass_and_fail",
    )


def _real_pytest_log(tmp_path: Path) -> str:
    """A genuine pytest -rA run (pass, fail, skip, xfail, xpass, error) wrapped like our log."""
    (tmp_path / "test_real.py").write_text(
        "import pytest\n\n"
        "def test_ok():\n    assert 1\n\n"
        "def test_bad():\n    assert 'a - b' == 'c'\n\n"
        "@pytest.mark.skip(reason='later')\ndef test_skip():\n    pass\n\n"
        "@pytest.mark.xfail(reason='bug')\ndef test_xfail():\n    assert 0\n\n"
        "@pytest.mark.xfail(reason='fixed?')\ndef test_xpass():\n    assert 1\n\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('fixture - broke')\n\n"
        "def test_error(broken):\n    pass\n\n"
        "@pytest.mark.parametrize('v', [1, 2], ids=['one', 'two'])\n"
        "def test_param(v):\n    assert v == 1\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "test_real.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": "/usr/bin:/bin"},
    )
    return logs.eval_log(proc.stdout, exit_code=proc.returncode)


@pytest.fixture(
    params=[*sorted(logs.ALL_LOGS), pytest.param("real_pytest_run", marks=pytest.mark.slow)]
)
def log_text(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "real_pytest_run":
        return _real_pytest_log(tmp_path)
    return logs.ALL_LOGS[request.param]


def test_parser_matches_swebench(log_text: str) -> None:
    ours = parse_log_pytest(log_text)
    theirs = SWE["parsers"].parse_log_pytest(log_text, None)
    assert ours == theirs


def test_log_validation_matches_swebench(log_text: str, tmp_path: Path) -> None:
    path = tmp_path / "test_output.txt"
    path.write_text(log_text)
    theirs = SWE["grading"].get_logs_eval(_spec([], []), str(path))
    assert grading.get_logs_eval(log_text) == theirs


def test_reports_and_resolution_match_swebench(log_text: str, tmp_path: Path) -> None:
    path = tmp_path / "test_output.txt"
    path.write_text(log_text)
    for f2p, p2p in CASES:
        spec = _spec(f2p, p2p)
        theirs = SWE["grading"].get_eval_report(
            spec,
            {"instance_id": "x__y-1", "model_patch": "diff", "model_name_or_path": "m"},
            str(path),
            include_tests_status=True,
        )["x__y-1"]
        status_map, valid = grading.get_logs_eval(log_text)
        assert valid == theirs["patch_successfully_applied"]
        if not valid:
            assert theirs["resolved"] is False
            continue
        ours = grading.get_eval_tests_report(status_map, f2p, p2p)
        tests_status = theirs["tests_status"]
        assert ours.f2p_success == tests_status["FAIL_TO_PASS"]["success"]
        assert ours.f2p_failure == tests_status["FAIL_TO_PASS"]["failure"]
        assert ours.p2p_success == tests_status["PASS_TO_PASS"]["success"]
        assert ours.p2p_failure == tests_status["PASS_TO_PASS"]["failure"]
        resolved = grading.resolution_status(ours).value
        assert resolved == SWE["grading"].get_resolution_status(tests_status)
        assert (resolved == "RESOLVED_FULL") == theirs["resolved"]


@pytest.mark.parametrize(
    "status_map",
    [
        {},
        {"t::a": "PASSED", "t::b": "FAILED", "t::c": "SKIPPED", "t::d": "XFAIL", "t::e": "ERROR"},
        {"t::p[x-1]": "PASSED", "t::p[x-2]": "XFAIL", "t::q[a]": "PASSED", "t::q[b]": "SKIPPED"},
    ],
    ids=["empty", "each-status", "params"],
)
def test_case_predicates_match_swebench(status_map: dict[str, str]) -> None:
    cases = ["t::a", "t::b", "t::c", "t::d", "t::e", "t::zz", "t::p[x", "t::q[", "t::p"]
    for case in cases:
        assert grading.case_passed(case, status_map) == SWE["grading"].test_passed(case, status_map)
        assert grading.case_failed(case, status_map) == SWE["grading"].test_failed(case, status_map)
        assert grading.case_maintained(case, status_map) == SWE["grading"].test_maintained(
            case, status_map
        )


PATCHES = {
    "modify-new-delete-rename": (
        "diff --git a/src/m.py b/src/m.py\nindex 1..2 100644\n--- a/src/m.py\n+++ b/src/m.py\n"
        "@@ -1,2 +1,2 @@\n-a\n+b\n c\n"
        "diff --git a/tests/new.py b/tests/new.py\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/tests/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
        "diff --git a/old.py b/old.py\ndeleted file mode 100644\n--- a/old.py\n+++ /dev/null\n"
        "@@ -1 +0,0 @@\n-gone\n"
        "diff --git a/r1.py b/r2.py\nsimilarity index 90%\nrename from r1.py\nrename to r2.py\n"
        "--- a/r1.py\n+++ b/r2.py\n@@ -1 +1 @@\n-p\n+q\n"
    ),
    "dashes-inside-a-hunk": (
        "diff --git a/q.sql b/q.sql\n--- a/q.sql\n+++ b/q.sql\n@@ -1,3 +1,3 @@\n"
        "--- a/comment\n+-- b/comment\n select 1;\n \n"
        "diff --git a/z.py b/z.py\n--- a/z.py\n+++ b/z.py\n@@ -1 +1 @@\n-1\n+2\n"
        "\\ No newline at end of file\n"
    ),
}


def _mini_test_patches() -> dict[str, str]:
    path = TEST_DATA / "instances.jsonl"
    return {
        json.loads(line)["instance_id"]: SWEInstance.model_validate_json(line).test_patch
        for line in path.read_text().splitlines()
    }


ALL_PATCHES = {**PATCHES, **_mini_test_patches()}


@pytest.mark.parametrize("name", sorted(ALL_PATCHES))
def test_modified_files_match_swebench(name: str) -> None:
    patch = ALL_PATCHES[name]
    assert modified_files(patch) == SWE["utils"].get_modified_files(patch)
