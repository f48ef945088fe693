"""Facts of the SWE-bench evaluation harness that swerl's reward evaluation reproduces.

Taken from ``swebench`` 5.0.2 (``swebench.harness.constants``, ``run_evaluation.py``); the
comparison tests in ``tests/unit/evaluation`` run swebench's own functions on the same logs.
"""

from __future__ import annotations

from enum import StrEnum

SWEBENCH_VERSION = "5.0.2"

# Log markers written by the harness (and by our eval script) and read by the grader.
APPLY_PATCH_FAIL = ">>>>> Patch Apply Failed"
APPLY_PATCH_PASS = ">>>>> Applied Patch"
RESET_FAILED = ">>>>> Reset Failed"
TESTS_ERROR = ">>>>> Tests Errored"
TESTS_TIMEOUT = ">>>>> Tests Timed Out"
START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
TEST_EXIT_CODE = ">>>>> Test Exit Code"
TEST_EXIT_CODE_VAR = "SWEBENCH_TEST_EXIT_CODE"

# The harness tries these in order, restoring a pristine tree between attempts, and finally
# accepts a patch that `git apply --check --reverse` finds already applied.
GIT_APPLY_CMDS = (
    "git apply --verbose",
    "git apply --verbose --3way",
    "git apply --verbose --reject",
    "patch --batch --forward --fuzz=5 -p1 -i",
)
# The strict policy (training rewards): git's own parser and nothing else (no GNU patch, which
# also reads context diffs, ``Index:`` lines and normal diffs and writes into .git).
STRICT_APPLY_CMDS = tuple(cmd for cmd in GIT_APPLY_CMDS if cmd.startswith("git apply"))
RESTORE_TREE_CMD = "git checkout -- . ; git clean -fd"
REVERSE_CHECK_CMD = "git apply --check --reverse"

# Files of a test patch with these endings are data, not test modules to run.
NON_TEST_EXTS = (
    ".json",
    ".png",
    "csv",
    ".txt",
    ".md",
    ".jpg",
    ".jpeg",
    ".pkl",
    ".yml",
    ".yaml",
    ".toml",
)


class TestStatus(StrEnum):
    """Per-test outcomes the pytest log parser reports."""

    __test__ = False  # not a pytest test class

    FAILED = "FAILED"
    PASSED = "PASSED"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"
    XFAIL = "XFAIL"


class ResolvedStatus(StrEnum):
    NO = "RESOLVED_NO"
    PARTIAL = "RESOLVED_PARTIAL"
    FULL = "RESOLVED_FULL"
