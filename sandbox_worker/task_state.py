"""Bring a sandbox's repository to its instance's task state (SWE-smith rows).

A SWE-bench / SWE-Gym image already is the task: its checkout sits at ``base_commit``, and the
instance is returned unchanged. A SWE-smith image holds a clean repository *snapshot* shared by
every instance of that repository; SWE-smith's harness makes the task with ``git checkout
<instance_id>``, a branch of two commits on the snapshot: "Bug Patch" (the row's ``patch``
applied) and "Remove F2P Tests" (the files of the FAIL_TO_PASS tests deleted, so the agent
cannot read the tests it will be graded by). Its evaluation checks out the branch, goes back
one commit (the tests return), applies the model patch, reverts the test files and runs the
tests.

:func:`prepare_task` makes the same state in a sandbox, without network (the harness fetches
the branch; here it must already be in the image or is rebuilt from the row):

1. a branch ``<instance_id>`` (local, or ``origin/<instance_id>``) is checked out as it is;
2. else, if the row's ``patch`` applies to the snapshot, it is applied and committed, then the
   F2P test files are deleted and committed (fixed author, committer and dates: the same
   commits, with the same ids, in the agent's sandbox and in the evaluation's);
3. else, if the ``patch`` is already applied (an image built with the bug in it), only the
   tests are removed;
4. else the image does not hold this instance's repository: :class:`TaskStateError`.

Then the history is hidden: SWE-smith's branch keeps the snapshot as the parent of "Bug
Patch", so ``git diff HEAD~2 HEAD~1`` shows the bug and reverting it is the fix -- a policy
trained with RL finds that. The task becomes one root commit of the task tree (fixed identity,
dates and message: the same id in every sandbox), every other ref, remote and reflog entry is
deleted and, in the agent's sandbox, the unreachable objects are pruned (``git gc``).

It returns a SWE-bench-shaped instance of that state: ``base_commit`` the task commit (what
the agent's patch is taken against) and ``test_patch`` the diff that brings the hidden test
files back (restricted to those files: an old-style branch without the removal commit gives an
empty one, never the fix). The evaluation then runs with SWE-bench semantics: the model's
edits to those files are undone, the tests re-added, and every F2P and P2P test must pass.
"""

from __future__ import annotations

import secrets
import shlex

from sandbox_worker.backends.base import Sandbox
from sandbox_worker.evaluation.swesmith_profiles import graded_test_files
from services.protocol.instance import SWEInstance

# The commits made here: the same bytes in every sandbox of an instance, so the same ids.
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "swerl",
    "GIT_AUTHOR_EMAIL": "swerl@localhost",
    "GIT_COMMITTER_NAME": "swerl",
    "GIT_COMMITTER_EMAIL": "swerl@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+00:00",
}
TASK_BRANCH = "swerl-task"
TASK_MESSAGE = "Task"  # the one commit the agent's repository holds
BASE_MARK = "swerl-task-base:"
HOW_MARK = "swerl-task-how:"
NO_REPO_EXIT = 3


class TaskStateError(RuntimeError):
    """The image cannot hold this instance's task state (wrong image: not retried)."""


def prepare_script(
    instance: SWEInstance, bug_path: str, tests_path: str, prune: bool = True
) -> str:
    """The bash script of :func:`prepare_task` (module docstring), run in the repository:
    prints the task commit and how it was made, writes the hidden tests' diff to
    ``tests_path``; ``prune``: delete the objects no ref reaches any more (the agent's
    sandbox; an evaluation needs only the commit)."""
    q = shlex.quote
    branch = q(instance.instance_id)
    hidden = [q(f) for f in graded_test_files(instance)[0]]  # SWE-smith's rule per repository
    files = " ".join(hidden)
    lines = [
        "set -euo pipefail",
        "git reset -q --hard && git clean -fdq",
        f"if git rev-parse -q --verify refs/heads/{branch}^{{commit}} >/dev/null; then"
        f" ref=refs/heads/{branch}",
        f"elif git rev-parse -q --verify refs/remotes/origin/{branch}^{{commit}} >/dev/null; then"
        f" ref=refs/remotes/origin/{branch}",
        "else ref=''; fi",
        'if [ -n "$ref" ]; then',
        f'  git checkout -q -f -B {TASK_BRANCH} "$ref"; how=branch',
        "else",
        f"  git checkout -q -B {TASK_BRANCH}",
        f"  if git apply --check {q(bug_path)} 2>/dev/null; then",
        f"    git apply {q(bug_path)} && git add -A"
        " && git commit -q --no-verify --allow-empty -m 'Bug Patch'; how=bug-patch",
        f"  elif git apply --check -R {q(bug_path)} 2>/dev/null; then how=bug-present",
        "  else",
        "    echo 'the bug patch neither applies to the image nor is applied in it'",
        f"    exit {NO_REPO_EXIT}",
        "  fi",
    ]
    if hidden:
        lines += [
            "  present=()",
            f'  for f in {files}; do if git ls-files --error-unmatch -- "$f" >/dev/null 2>&1;'
            ' then present+=("$f"); fi; done',
            '  if [ "${#present[@]}" -gt 0 ]; then',
            '    git rm -q -- "${present[@]}"',
            "    git commit -q --no-verify -m 'Remove F2P Tests'",
            "  fi",
        ]
    lines += [
        "fi",
        # the hidden tests: what the commit before the task brings back of the F2P files
        "if git rev-parse -q --verify HEAD~1 >/dev/null; then",
        f"  git diff --binary HEAD HEAD~1 -- {files} > {q(tests_path)}"
        if hidden
        else f"  : > {q(tests_path)}",
        f"else : > {q(tests_path)}; fi",
        # hide the history: the task becomes one root commit (fixed identity and dates: the
        # same id in every sandbox) and nothing else stays reachable -- not the snapshot
        # before the bug (reverting "Bug Patch" would be the fix), not the tests' commit,
        # not another instance's branch
        f"task=$(git commit-tree 'HEAD^{{tree}}' -m {q(TASK_MESSAGE)})",
        f'git checkout -q -f -B {TASK_BRANCH} "$task"',
        'for r in $(git remote); do git remote remove "$r"; done',
        "git for-each-ref --format='%(refname)' | while read -r ref; do",
        f'  if [ "$ref" != refs/heads/{TASK_BRANCH} ]; then git update-ref -d "$ref"; fi',
        "done",
        "git reflog expire --expire=now --all",
    ]
    if prune:
        lines.append("git gc --quiet --prune=now")
    lines += [
        f'echo "{HOW_MARK} $how"',
        f'echo "{BASE_MARK} $(git rev-parse HEAD)"',
    ]
    return "\n".join(lines) + "\n"


def prepare_task(
    sandbox: Sandbox,
    instance: SWEInstance,
    workdir: str,
    *,
    scratch_dir: str = "/tmp",
    timeout_s: float = 120,
    prune: bool = True,
) -> SWEInstance:
    """Make ``instance``'s task state in ``sandbox`` (module docstring); the SWE-bench-shaped
    instance of it (``instance`` itself when there is nothing to make). ``prune=False`` (an
    evaluation's sandbox, which no agent sees) keeps the unreachable objects: the same commit,
    without the cost of a ``git gc``.

    Raises :class:`TaskStateError` when the image cannot hold the task, and the backend's
    errors when the sandbox fails.
    """
    if not instance.is_swesmith:
        return instance
    work = f"{scratch_dir}/swerl-task-{secrets.token_hex(6)}"
    bug, tests = f"{work}/bug.diff", f"{work}/tests.diff"
    sandbox.write_file(bug, instance.patch.encode())
    script = prepare_script(instance, bug, tests, prune)
    sandbox.write_file(f"{work}/prepare.sh", script.encode())
    result = sandbox.exec(
        f"/bin/bash {shlex.quote(work)}/prepare.sh 2>&1",
        workdir=workdir,
        timeout_s=timeout_s,
        env=GIT_IDENTITY,
    )
    if result.timed_out:
        raise TaskStateError(f"making the task state of {instance.instance_id} timed out")
    if result.exit_code != 0:
        raise TaskStateError(
            f"the image holds no task state for {instance.instance_id} (exit "
            f"{result.exit_code}): {result.output[-400:].strip()}"
        )
    marks = dict(
        line.split(":", 1) for line in result.output.splitlines() if line.startswith("swerl-task-")
    )
    base = marks.get(BASE_MARK[:-1], "").strip()
    if len(base) != 40:
        raise TaskStateError(f"no task commit in the output: {result.output[-400:].strip()}")
    test_patch = sandbox.read_file(tests).decode()
    return instance.model_copy(update={"base_commit": base, "test_patch": test_patch})
