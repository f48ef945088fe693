"""Adversarial patches that validation feeds to the reward evaluation.

* :func:`tampered_patch`: the gold patch plus a hunk that breaks a *protected* test file (one
  the test patch touches). The evaluation restores protected files before applying the test
  patch, so this must still be resolved; if it were not restored, the test patch would not
  apply over the tampered file and the tests would run against the broken file.
* :func:`broken_patch`: the gold patch's hunks aimed at files that do not exist, which none of
  the harness's apply commands (including ``patch --fuzz``) can apply: must come back
  ``applied=False``.

Both are built from the instance's own patches only (no repository access), so they work for
any SWE-bench-style instance.
"""

from __future__ import annotations

from sandbox_worker.evaluation.patches import (
    DEV_NULL,
    PatchedFile,
    patched_files,
)
from sandbox_worker.evaluation.swesmith_profiles import graded_test_files
from services.protocol.instance import SWEInstance

TAMPER_LINE = 'raise RuntimeError("swerl validation: this protected test file was tampered with")'
MISSING_DIR = "swerl-missing"


class CheckPatchError(ValueError):
    """The instance's patches do not allow building the requested check patch."""


def tampered_patch(instance: SWEInstance) -> str:
    """Gold patch + a hunk inserting ``raise RuntimeError(...)`` into a protected test file
    (SWE-smith: creating the first hidden F2P test file, which the task state removed)."""
    if instance.is_swesmith:
        hidden = graded_test_files(instance)[0]
        if not hidden:
            raise CheckPatchError("no FAIL_TO_PASS test file to tamper with")
        return _ensure_newline(instance.gold_patch) + _new_file_hunk(hidden[0])
    return _ensure_newline(instance.patch) + tamper_hunk(instance.test_patch)


def _new_file_hunk(path: str) -> str:
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n"
        f"--- {DEV_NULL}\n+++ b/{path}\n@@ -0,0 +1 @@\n+{TAMPER_LINE}\n"
    )


def tamper_hunk(test_patch: str) -> str:
    """A diff that breaks the first file the test patch modifies (or else creates)."""
    files = patched_files(test_patch)
    for patched in files:
        if patched.source != DEV_NULL and patched.target != DEV_NULL and patched.hunks:
            return _insert_into_first_hunk(patched)
    for patched in files:
        if patched.source == DEV_NULL:
            return _new_file_hunk(patched.target)
    raise CheckPatchError("the test patch modifies or creates no file to tamper with")


def _insert_into_first_hunk(patched: PatchedFile) -> str:
    """Insert the tamper line after the first line of the test patch's first hunk.

    Inside the hunk's context, so the test patch no longer applies over the tampered file, and
    unindented, so the module fails to import (a ``raise`` or an indentation error).
    """
    hunk = patched.hunks[0]
    old = hunk.old_lines()
    if hunk.old_len == 0 or not old:
        raise CheckPatchError(f"the test patch's first hunk of {patched.source} has no context")
    body = [f" {old[0]}", f"+{TAMPER_LINE}", *(f" {line}" for line in old[1:])]
    start = hunk.old_start
    return (
        f"diff --git a/{patched.source} b/{patched.source}\n"
        f"--- a/{patched.source}\n+++ b/{patched.source}\n"
        f"@@ -{start},{len(old)} +{start},{len(old) + 1} @@\n" + "\n".join(body) + "\n"
    )


def broken_patch(instance: SWEInstance) -> str:
    """The gold patch's modifications, redirected to files under a directory that is absent."""
    parts = []
    for patched in patched_files(instance.gold_patch):
        if patched.source == DEV_NULL or patched.target == DEV_NULL or not patched.hunks:
            continue
        source = f"{MISSING_DIR}/{patched.source}"
        target = f"{MISSING_DIR}/{patched.target}"
        lines = [f"diff --git a/{source} b/{target}", f"--- a/{source}", f"+++ b/{target}"]
        for hunk in patched.hunks:
            lines += [hunk.header, *hunk.lines]
        parts.append("\n".join(lines) + "\n")
    if not parts:
        raise CheckPatchError("the gold patch modifies no existing file")
    return "".join(parts)


def _ensure_newline(patch: str) -> str:
    return patch if patch.endswith("\n") else patch + "\n"
