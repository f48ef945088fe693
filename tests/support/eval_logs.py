"""Hand-written evaluation logs, shaped like the eval script's output (xtrace markers)."""

from __future__ import annotations

START = "+ : '>>>>> Start Test Output'"
END = "+ : '>>>>> End Test Output'"


def eval_log(summary: str, exit_code: int | None = 0, before: str = "", after: str = "") -> str:
    """A full log: preamble, markers around a pytest run whose -rA summary is ``summary``."""
    lines = [
        "+ cd /testbed",
        "+ git apply -v /tmp/swerl-test.diff",
        "Applied patch tests/test_a.py cleanly.",
        before,
        START,
        "+ timeout -k 10 1800 bash -c 'python3 -m pytest -rA -p no:cacheprovider tests/test_a.py'",
        "============================= test session starts ==============================",
        "collected 4 items",
        "",
        "=========================== short test summary info ============================",
        summary,
        "============================== 4 passed in 0.05s ===============================",
    ]
    if exit_code is not None:
        lines += [f"+ SWEBENCH_TEST_EXIT_CODE={exit_code}", END]
        lines.append(f">>>>> Test Exit Code: {exit_code}")
    else:
        lines.append(END)
    lines.append(after)
    return "\n".join(lines) + "\n"


ALL_PASS = eval_log(
    "PASSED tests/test_a.py::test_one\n"
    "PASSED tests/test_a.py::test_two\n"
    "PASSED tests/test_a.py::test_param[x-1]\n"
    "PASSED tests/test_a.py::TestK::test_method"
)
ONE_FAILS = eval_log(
    "PASSED tests/test_a.py::test_one\n"
    "FAILED tests/test_a.py::test_two - AssertionError: assert 'a - b' == 'c'\n"
    "PASSED tests/test_a.py::test_param[x-1]\n"
    "PASSED tests/test_a.py::TestK::test_method",
    exit_code=1,
)
F2P_SKIPPED_VERBOSE = eval_log(
    "PASSED tests/test_a.py::test_one\n"
    "tests/test_a.py::test_two SKIPPED (not today)\n"
    "SKIPPED tests/test_a.py::test_two\n"
    "PASSED tests/test_a.py::TestK::test_method"
)
SKIP_SUMMARY_ONLY = eval_log(
    "PASSED tests/test_a.py::test_one\n"
    "SKIPPED [1] tests/test_a.py:12: not today\n"
    "PASSED tests/test_a.py::TestK::test_method"
)
XFAIL = eval_log(
    "PASSED tests/test_a.py::test_one\n"
    "XFAIL tests/test_a.py::test_two - known bug\n"
    "XPASS tests/test_a.py::TestK::test_method - unexpectedly passing"
)
ERRORS = eval_log(
    "PASSED tests/test_a.py::test_one\n"
    "ERROR tests/test_a.py::test_two - fixture 'db' not found\n"
    "ERROR tests/test_b.py - ImportError: cannot import name 'x'",
    exit_code=1,
)
NO_MARKERS = ALL_PASS.replace(START, "+ : 'start'")
TIMED_OUT = eval_log(
    "PASSED tests/test_a.py::test_one", exit_code=124, after=">>>>> Tests Timed Out"
)
FAKE_PASS_EXIT_1 = eval_log(
    "PASSED tests/test_a.py::test_one\nPASSED tests/test_a.py::test_two", exit_code=1
)
OUTSIDE_MARKERS = eval_log("", before="PASSED tests/test_a.py::test_one")
NOTHING_RAN = eval_log("no tests ran in 0.01s", exit_code=5)
TRUNCATED_IDS = eval_log(
    "PASSED tests/test_a.py::test_param[log(photon]\n"
    "PASSED tests/test_a.py::test_param[log(photon-2]\n"
    "PASSED tests/test_a.py::test_mixed[a]\n"
    "FAILED tests/test_a.py::test_mixed[b] - boom",
    exit_code=1,
)

ALL_LOGS = {
    "all_pass": ALL_PASS,
    "one_fails": ONE_FAILS,
    "f2p_skipped_verbose": F2P_SKIPPED_VERBOSE,
    "skip_summary_only": SKIP_SUMMARY_ONLY,
    "xfail": XFAIL,
    "errors": ERRORS,
    "no_markers": NO_MARKERS,
    "timed_out": TIMED_OUT,
    "fake_pass_exit_1": FAKE_PASS_EXIT_1,
    "outside_markers": OUTSIDE_MARKERS,
    "nothing_ran": NOTHING_RAN,
    "truncated_ids": TRUNCATED_IDS,
}
