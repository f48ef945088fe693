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

The graded run is split in two steps so that no git command runs after the evaluation has
listed the tree for test infrastructure: :func:`prelude_script` (the harness's informational
``git status``/``git diff``, restoring the files the test patch touches, applying the test
patch) runs first; then the tree is inspected and restored, the canaries are planted, and
:func:`eval_script` runs only the tests (``.git`` moved out of the repository meanwhile, so the
code under test cannot diff its way to the planted canaries).

Every git command of a harness step runs under :data:`GIT_ISOLATION`: no fsmonitor, no hooks, no
global or system configuration, no external diff or textconv.

Every value interpolated into a script is shell-quoted.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from sandbox_worker.evaluation.constants import (
    END_TEST_OUTPUT,
    START_TEST_OUTPUT,
    TEST_EXIT_CODE,
    TEST_EXIT_CODE_VAR,
    TESTS_TIMEOUT,
)

TIMEOUT_EXIT_CODE = 124  # coreutils `timeout` when the time limit hit

# Prepended to every harness step: git runs nothing the repository's configuration names.
# (-c flags beat every configuration file; GIT_CONFIG_GLOBAL needs git >= 2.32, the rest is
# older than any image's git.) A patch cannot write .git under the strict policy; this also
# holds when the lenient harness cascade let one through.
GIT_ISOLATION = (
    "git() { command git -c core.fsmonitor=false -c core.hooksPath=/dev/null"
    " -c core.attributesFile=/dev/null -c core.sshCommand=false -c diff.noprefix=false"
    ' "$@"; }; export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0'
    " GIT_PAGER=cat PAGER=cat; unset GIT_EXTERNAL_DIFF\n"
)


def isolated(command: str) -> str:
    """``command`` with :data:`GIT_ISOLATION` in front."""
    return GIT_ISOLATION + command


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
class PreludeSpec:
    workdir: str
    base_ref: str
    test_patch_path: str | None  # None: the instance has no test patch
    modified_files: list[str]  # restored to base before the test patch (protected files)
    new_files: list[str]  # removed before the test patch


def prelude_script(spec: PreludeSpec) -> str:
    """The harness's steps before its tests: informational status and diff, the files the test
    patch touches back to the base, the test patch applied (a failure to apply it fails here)."""
    lines = [
        "set -uxo pipefail",
        "exec 2>&1",
        f"cd {_q(spec.workdir)}",
        "git status",
        f"git -c core.fileMode=false diff --no-ext-diff --no-textconv {_q(spec.base_ref)}",
        *_restore_test_files(spec.base_ref, spec.modified_files, spec.new_files),
    ]
    if spec.test_patch_path is not None:
        lines.append(f"git apply -v {_q(spec.test_patch_path)} || exit 3")
    return isolated("\n".join([*lines, ""]))


def _restore_test_files(base_ref: str, modified: list[str], new: list[str]) -> list[str]:
    restore = []
    if modified:
        files = " ".join(_q(f) for f in modified)
        restore.append(f"git checkout {_q(base_ref)} -- {files} || exit 3")
    if new:
        restore.append("rm -f -- " + " ".join(_q(f) for f in new))
    return restore


@dataclass(frozen=True)
class EvalScriptSpec:
    workdir: str
    test_command: str  # full command: runner + test files
    test_timeout_s: int
    # The test command's output goes to this file, then into the log: a process the tests
    # leave behind holding the output open cannot keep the run from ending.
    output_path: str
    # The structured report: the per-run directory outside the repository holding the report
    # plugin module ``report_plugin`` (loaded with -p); the exit status is written there too.
    report_dir: str | None = None
    report_plugin: str | None = None
    # Where ``.git`` waits while the tests run (None: it stays).
    hidden_git: str | None = None
    # Harness files removed before the tests run.
    remove_before: list[str] = field(default_factory=list)


def eval_script(spec: EvalScriptSpec) -> str:
    """The eval script (bash) that produces the graded log: the tests between the harness's
    markers, their exit status, a ``timeout`` around them. No git command: the prelude ran
    them all before the tree was inspected."""
    output = _q(spec.output_path)
    lines = [
        "#!/bin/bash",
        "set -uxo pipefail",
        "exec 2>&1",
        f"cd {_q(spec.workdir)}",
        f'mkdir -p -- "$(dirname -- {output})"',
    ]
    if spec.report_dir is not None and spec.report_plugin is not None:
        lines += [
            f'export PYTHONPATH={_q(spec.report_dir)}"${{PYTHONPATH:+:$PYTHONPATH}}"',
            # --maxfail=0 after the repository's ini addopts: a planted canary must not end
            # an honest run early (-x / --maxfail in the repository's configuration).
            f'export PYTEST_ADDOPTS="-p {spec.report_plugin} ${{PYTEST_ADDOPTS:-}} --maxfail=0"',
        ]
    if spec.remove_before:
        lines.append("rm -f -- " + " ".join(_q(path) for path in spec.remove_before))
    if spec.hidden_git is not None:
        lines.append(f"mv .git {_q(spec.hidden_git)}")
    lines += [
        f": '{START_TEST_OUTPUT}'",
        f"timeout -k 10 {spec.test_timeout_s} bash -c {_q(spec.test_command)}"
        f" > {output} 2>&1 < /dev/null",
        f"{TEST_EXIT_CODE_VAR}=$?",
        f"cat -- {output}",
        f": '{END_TEST_OUTPUT}'",
        f'echo "{TEST_EXIT_CODE}: ${TEST_EXIT_CODE_VAR}"',
        f'if [ "${TEST_EXIT_CODE_VAR}" -eq {TIMEOUT_EXIT_CODE} ]; then'
        f" echo {_q(TESTS_TIMEOUT)}; fi",
    ]
    if spec.report_dir is not None:
        lines.append(f'echo "${TEST_EXIT_CODE_VAR}" > {_q(spec.report_dir)}/exit_code')
    if spec.hidden_git is not None:
        lines.append(f"rm -rf .git; mv {_q(spec.hidden_git)} .git")
    return "\n".join([*lines, ""])


# A pytest runner the safe launcher can start: "python[X.Y] -m pytest ..." or "pytest ...".
_PYTHON_M_PYTEST = re.compile(
    r"^(?P<python>\S*python[0-9.]*)\s+-m\s+pytest(?=\s|$)(?P<rest>.*)$", re.S
)
_PYTEST = re.compile(r"^(?P<runner>(?:\S*/)?py\.?test)(?=\s|$)(?P<rest>.*)$", re.S)


def safe_pytest_command(test_command: str, launcher: str, workdir: str) -> str | None:
    """``test_command`` started through the safe launcher (``safe_pytest.py``), or None when
    the command is not a pytest runner the launcher knows (it then runs as it is).

    ``python -m pytest`` puts the working directory first on ``sys.path``; the launcher
    reproduces that once pytest has started (``SWERL_CWD_ON_PATH=1``). A ``pytest`` script
    runs under its shebang's interpreter, with the working directory off ``sys.path``."""
    env = f"SWERL_REPO={_q(workdir)}"
    if match := _PYTHON_M_PYTEST.match(test_command.strip()):
        python, rest = match.group("python"), match.group("rest")
        return f"{env} SWERL_CWD_ON_PATH=1 {python} {_q(launcher)}{rest}"
    if match := _PYTEST.match(test_command.strip()):
        runner, rest = match.group("runner"), match.group("rest")
        python = f"$(sed -n '1s/^#! *//p' \"$(command -v {_q(runner)})\")"
        return f"{env} SWERL_CWD_ON_PATH=0 {python} {_q(launcher)}{rest}"
    return None


def git_state_script(workdir: str) -> str:
    """A fingerprint of ``.git`` without its object store, index and logs: the configuration,
    hooks, info, refs, HEAD and the type of ``.git`` itself (checked after the patch)."""
    return isolated(
        "\n".join(
            [
                f"cd {_q(workdir)}",
                "stat -c '%F' .git",
                "find .git \\( -path .git/index -o -path '.git/objects/??' -o -path"
                " .git/objects/pack -o -path .git/logs \\) -prune -o -printf '%y %m %p\\n'"
                " | LC_ALL=C sort",
                "find .git \\( -path .git/index -o -path '.git/objects/??' -o -path"
                " .git/objects/pack -o -path .git/logs \\) -prune -o -type f -print0"
                " | LC_ALL=C sort -z | xargs -0 -r sha256sum",
            ]
        )
    )


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
