"""reverse_unified_diff against git: applying the reverse of ``git diff A B`` to B gives A
(modified, added, deleted, renamed and mode-changed files, missing final newlines)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from services.protocol.diff_reverse import reverse_unified_diff
from services.protocol.diffs import unified_diff_problem

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t.invalid",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    res = subprocess.run(
        ["git", *args], cwd=repo, env=ENV, input=stdin, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def two_commits(repo: Path) -> tuple[str, str]:
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "keep.py").write_text("".join(f"line {i}\n" for i in range(30)))
    (repo / "gone.py").write_text("x = 1\n")
    (repo / "old_name.py").write_text("def f():\n    return 1\n" * 5)
    (repo / "tool.sh").write_text("echo hi\n")
    (repo / "tail.txt").write_text("no newline at the end")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a")
    first = git(repo, "rev-parse", "HEAD").strip()
    lines = (repo / "keep.py").read_text().splitlines(keepends=True)
    lines[3] = "changed 3\n"
    lines[10:12] = ["new 10\n", "new 10b\n", "new 10c\n"]
    del lines[25]
    (repo / "keep.py").write_text("".join(lines))
    (repo / "gone.py").unlink()
    (repo / "added.py").write_text("y = 2\n")
    git(repo, "mv", "old_name.py", "new_name.py")
    (repo / "tool.sh").chmod(0o755)
    (repo / "tail.txt").write_text("still no newline, but other text")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "b")
    return first, git(repo, "rev-parse", "HEAD").strip()


def test_the_reverse_applied_to_b_gives_a(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    a, b = two_commits(repo)
    forward = git(repo, "diff", "-M", a, b)
    assert "rename from old_name.py" in forward and "new file mode" in forward
    assert "\\ No newline at end of file" in forward
    backward = reverse_unified_diff(forward)
    assert unified_diff_problem(backward) is None
    assert backward != forward
    git(repo, "apply", "--index", stdin=backward)  # on B
    assert git(repo, "diff", "--cached", a) == ""  # the index is A again
    git(repo, "commit", "-q", "-m", "back to a")
    # and the reverse of the reverse is the original
    assert reverse_unified_diff(backward) == forward


def test_a_plain_unified_diff_without_git_headers(tmp_path: Path) -> None:
    forward = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n-a\n+b\n c\n"
    assert reverse_unified_diff(forward) == "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n-b\n+a\n c\n"


@pytest.mark.parametrize(
    "diff",
    [
        "diff --git a/x.bin b/x.bin\nindex 1..2 100644\nGIT binary patch\nliteral 1\n",
        "diff --git a/a.py b/c.py\nsimilarity index 100%\ncopy from a.py\ncopy to c.py\n",
    ],
    ids=["binary", "copy"],
)
def test_binary_patches_and_copies_are_refused(diff: str) -> None:
    with pytest.raises(ValueError, match="cannot reverse"):
        reverse_unified_diff(diff)
