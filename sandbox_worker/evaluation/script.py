"""Shell scripts the reward evaluation runs inside the sandbox.

They mirror the SWE-bench harness: the eval script is the harness's ``eval.sh`` for Python
instances (informational ``git status``/``git diff``; restore the files the test patch touches
to the base commit; apply the test patch; run the tests between ``: '>>>>> Start Test Output'``
and ``: '>>>>> End Test Output'`` under ``set -x``; record the test command's exit status;
revert the test files), plus two things of ours: ``exec 2>&1`` so the markers (bash's xtrace
goes to stderr) and the test output share one ordered stream whatever the backend does with
stderr, and a ``timeout`` around the test command so a patch that hangs the tests costs one
bounded run and is graded as a failure (the harness's ``Tests Timed Out``), while the outer
exec timeout is left to catch a wedged sandbox (an infrastructure failure).

Every value interpolated into a script is shell-quoted.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from sandbox_worker.evaluation.constants import (
    END_TEST_OUTPUT,
    START_TEST_OUTPUT,
    TEST_EXIT_CODE,
    TEST_EXIT_CODE_VAR,
    TESTS_TIMEOUT,
)

TIMEOUT_EXIT_CODE = 124  # coreutils `timeout` when the time limit hit


def _q(value: str) -> str:
    return shlex.quote(value)


def reset_script(base_ref: str) -> str:
    """Bring the checkout to the instance's base state with a clean working tree.

    A fresh sandbox already is at the base; this makes it certain. If ``HEAD`` descends from
    the base commit (SWE-bench images commit their environment setup on top of the base), that
    commit is kept; otherwise the base commit is checked out.
    """
    base = _q(base_ref)
    return "\n".join(
        [
            "set -euo pipefail",
            f"git rev-parse --verify --quiet {base}^{{commit}} >/dev/null"
            f" || {{ echo 'base commit '{base}' is not in the repository'; exit 3; }}",
            f"if git merge-base --is-ancestor {base} HEAD; then target=HEAD;"
            f" else target={base}; fi",
            'git reset --quiet --hard "$target"',
            "git clean -fdq",
            "git rev-parse HEAD",
        ]
    )


@dataclass(frozen=True)
class EvalScriptSpec:
    workdir: str
    base_ref: str
    test_patch_path: str | None  # None: the instance has no test patch
    modified_files: list[str]  # restored to base before the test patch (protected files)
    new_files: list[str]  # removed before the test patch
    test_command: str  # full command: runner + test files
    test_timeout_s: int
    # The structured report: the per-run directory outside the repository holding the report
    # plugin module ``report_plugin`` (loaded with -p); the exit status is written there too.
    report_dir: str | None = None
    report_plugin: str | None = None


def eval_script(spec: EvalScriptSpec) -> str:
    """The eval script (bash) that produces the graded log."""
    restore = []
    if spec.modified_files:
        files = " ".join(_q(f) for f in spec.modified_files)
        restore.append(f"git checkout {_q(spec.base_ref)} -- {files}")
    if spec.new_files:
        restore.append("rm -f " + " ".join(_q(f) for f in spec.new_files))
    lines = [
        "#!/bin/bash",
        "set -uxo pipefail",
        "exec 2>&1",
        f"cd {_q(spec.workdir)}",
        "git status",
        f"git -c core.fileMode=false diff {_q(spec.base_ref)}",
        *restore,
    ]
    if spec.test_patch_path is not None:
        lines.append(f"git apply -v {_q(spec.test_patch_path)}")
    if spec.report_dir is not None and spec.report_plugin is not None:
        lines += [
            f'export PYTHONPATH={_q(spec.report_dir)}"${{PYTHONPATH:+:$PYTHONPATH}}"',
            f'export PYTEST_ADDOPTS="-p {spec.report_plugin} ${{PYTEST_ADDOPTS:-}}"',
        ]
    lines += [
        f": '{START_TEST_OUTPUT}'",
        f"timeout -k 10 {spec.test_timeout_s} bash -c {_q(spec.test_command)}",
        f"{TEST_EXIT_CODE_VAR}=$?",
        f": '{END_TEST_OUTPUT}'",
        f'echo "{TEST_EXIT_CODE}: ${TEST_EXIT_CODE_VAR}"',
        f'if [ "${TEST_EXIT_CODE_VAR}" -eq {TIMEOUT_EXIT_CODE} ]; then'
        f" echo {_q(TESTS_TIMEOUT)}; fi",
    ]
    if spec.report_dir is not None:
        lines.append(f'echo "${TEST_EXIT_CODE_VAR}" > {_q(spec.report_dir)}/exit_code')
    lines += [*restore, ""]
    return "\n".join(lines)


def capture_tree_script(work: str, name: str, *, tracked: bool) -> str:
    """List the working tree's non-directory entries (type and path, NUL-separated; ``.git``
    skipped, symlinks not followed) into ``<work>/<name>``, and the tracked files into
    ``<work>/tracked`` if asked."""
    w = _q(work)
    lines = [
        "set -euo pipefail",
        f"mkdir -p {w}",
        f"find . -path ./.git -prune -o ! -type d -printf '%y\\0%p\\0' > {w}/{_q(name)}",
    ]
    if tracked:
        lines.append(f"git ls-files -z > {w}/tracked")
    return "\n".join(lines)


def inspect_patched_tree_script(work: str, commit: str, hash_snapshot: bool) -> str:
    """After the patch, in one step: the tree listing (``<work>/after``), the tracked files
    that differ from ``commit`` (``<work>/changed``) and, if asked, the hashes of the
    snapshotted untracked files (``<work>/after.sha``; a deleted one is simply absent)."""
    w = _q(work)
    lines = [
        capture_tree_script(work, "after", tracked=False),
        f"git diff --name-only --no-renames -z {_q(commit)} -- > {w}/changed",
    ]
    if hash_snapshot:
        lines.append(
            f"xargs -0 -r sha256sum -z -- < {w}/snaplist > {w}/after.sha 2>/dev/null || true"
        )
    return "\n".join(lines)


def restore_script(work: str, commit: str) -> str:
    """Restore the paths listed (NUL-separated) in ``<work>/rm``, ``checkout`` and ``extract``:
    remove them, then bring back tracked ones from ``commit`` and the others from the base
    snapshot ``<work>/snap.tar``. Paths are literal (no pathspec magic, no globbing)."""
    w = _q(work)
    return "\n".join(
        [
            "set -euo pipefail",
            f"xargs -0 -r rm -rf -- < {w}/rm",
            f"if [ -s {w}/checkout ]; then git --literal-pathspecs checkout {_q(commit)}"
            f" --pathspec-from-file={w}/checkout --pathspec-file-nul; fi",
            f"if [ -s {w}/extract ]; then tar -xf {w}/snap.tar --null -T {w}/extract; fi",
        ]
    )
