"""Reading file lists out of diffs, hunk-aware; the strict parser of training rewards."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sandbox_worker.evaluation.patches import (
    DEV_NULL,
    PatchParseError,
    directives_of_test_patch,
    files_of_test_ids,
    is_empty_patch,
    modified_files,
    new_files,
    parse_git_patch,
    patch_names_git_dir,
    patched_files,
    strict_patch_refusal,
)
from sandbox_worker.testing.local_sandbox import ISOLATED_GIT_ENV
from services.protocol.instance import SWEInstance

GIT_PATCH = (
    "diff --git a/pkg/mod.py b/pkg/mod.py\nindex 1111111..2222222 100644\n"
    "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -10,3 +10,4 @@ def f():\n a\n-b\n+c\n+d\n e\n"
    "diff --git a/tests/test_new.py b/tests/test_new.py\nnew file mode 100644\n"
    "index 0000000..3333333\n--- /dev/null\n+++ b/tests/test_new.py\n@@ -0,0 +1,2 @@\n"
    "+def test_x():\n+    pass\n"
    "diff --git a/docs/data.json b/docs/data.json\ndeleted file mode 100644\n"
    "--- a/docs/data.json\n+++ /dev/null\n@@ -1 +0,0 @@\n-{}\n"
    "diff --git a/img.png b/img.png\nnew file mode 100644\n"
    "Binary files /dev/null and b/img.png differ\n"
)


def test_git_patch_files() -> None:
    files = patched_files(GIT_PATCH)
    assert [(f.source, f.target) for f in files] == [
        ("pkg/mod.py", "pkg/mod.py"),
        (DEV_NULL, "tests/test_new.py"),
        ("docs/data.json", DEV_NULL),
        (DEV_NULL, "img.png"),
    ]
    hunk = files[0].hunks[0]
    assert (hunk.old_start, hunk.old_len) == (10, 3)
    assert hunk.old_lines() == ["a", "b", "e"]
    assert modified_files(GIT_PATCH) == ["pkg/mod.py", "docs/data.json"]
    assert new_files(GIT_PATCH) == ["tests/test_new.py", "img.png"]


def test_directives_drop_data_files() -> None:
    # docs/data.json and img.png are data (the harness's NON_TEST_EXTS), not tests to run.
    assert directives_of_test_patch(GIT_PATCH) == ["pkg/mod.py", "tests/test_new.py"]


def test_plain_unified_diff_with_timestamps() -> None:
    plain = (
        "--- a/x.py\t2024-01-01 10:00:00\n+++ b/x.py\t2024-01-02 10:00:00\n@@ -1 +1 @@\n-1\n+2\n"
        "--- a/y.py\n+++ b/y.py\n@@ -1,2 +1 @@\n-1\n 2\n"
    )
    assert [(f.source, f.target) for f in patched_files(plain)] == [
        ("x.py", "x.py"),
        ("y.py", "y.py"),
    ]


def test_removed_line_that_looks_like_a_header_stays_in_its_hunk() -> None:
    patch = (
        "diff --git a/q.sql b/q.sql\n--- a/q.sql\n+++ b/q.sql\n@@ -1,2 +1,2 @@\n"
        "--- a/comment\n+++ b/comment\n x\n"
    )
    files = patched_files(patch)
    assert [(f.source, f.target) for f in files] == [("q.sql", "q.sql")]
    assert files[0].hunks[0].lines == ("--- a/comment", "+++ b/comment", " x")


@pytest.mark.parametrize(
    "bad",
    [
        "--- a/x\n+++ b/x\n@@ bogus @@\n",
        "--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n",
        "--- a/x\n+++ b/x\n@@ -1 +1 @@\n*weird\n",
        "@@ -1 +1 @@\n-a\n+b\n",
    ],
    ids=["header", "truncated", "unknown-line", "no-file"],
)
def test_malformed_patches_raise(bad: str) -> None:
    with pytest.raises(PatchParseError):
        patched_files(bad)


def test_empty_patch_detection() -> None:
    assert is_empty_patch("") and is_empty_patch(" \n\t") and is_empty_patch(None)
    assert not is_empty_patch(GIT_PATCH)
    assert patched_files("") == []


def test_files_of_test_ids() -> None:
    ids = ["tests/a.py::T::t[x::y]", "tests/b.py::t", "tests/a.py::u", "no_separator"]
    assert files_of_test_ids(ids) == ["tests/a.py", "tests/b.py"]


HUNK = "@@ -1 +1 @@\n-a\n+b\n"


def _git_block(old: str, new: str | None = None, body: str = HUNK, header: str = "") -> str:
    new = new or old
    return f"diff --git a/{old} b/{new}\n{header}--- a/{old}\n+++ b/{new}\n{body}"


def _real_git_patch(tmp_path: Path, quote_path: bool) -> str:
    """Everything ``git diff --cached --binary`` writes for an agent's tree: edits, new and
    deleted files, a binary file, a symlink, a mode change, names with spaces and unicode."""
    repo = tmp_path / f"repo-{quote_path}"
    repo.mkdir()
    env = {**os.environ, **ISOLATED_GIT_ENV, "HOME": str(tmp_path)}

    def git(*args: str) -> str:
        cmd = ["git", "-c", f"core.quotePath={str(quote_path).lower()}", *args]
        done = subprocess.run(cmd, cwd=repo, env=env, check=True, capture_output=True, text=True)
        return done.stdout

    (repo / "a.py").write_text("a\nb\nc\n")
    (repo / "gone.txt").write_text("bye\n")
    (repo / "run.sh").write_text("echo\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    (repo / "a.py").write_text("a\nB\nc\n")
    (repo / "gone.txt").unlink()
    (repo / "run.sh").chmod(0o755)
    (repo / "blob.bin").write_bytes(bytes(range(256)) * 8)
    (repo / "name with spaces.py").write_text("x = 1\n")
    (repo / "ünïcode.py").write_text("y = 2\n")
    (repo / "empty.py").write_text("")
    os.symlink("a.py", repo / "link")
    git("add", "-A")
    return git("diff", "--cached", "--binary", "--no-color", "HEAD")


@pytest.mark.parametrize("quote_path", [False, True])
def test_strict_parser_accepts_what_git_diff_writes(tmp_path: Path, quote_path: bool) -> None:
    patch = _real_git_patch(tmp_path, quote_path)
    assert strict_patch_refusal(patch) is None, patch
    files = parse_git_patch(patch)
    names = {f.new for f in files} | {f.old for f in files}
    assert {"a.py", "gone.txt", "run.sh", "blob.bin", "name with spaces.py", "ünïcode.py"} <= names
    assert any(f.binary for f in files) and any(f.makes_symlink for f in files)
    assert not patch_names_git_dir(patch)


def test_strict_parser_accepts_every_gold_and_test_patch(
    mini_instances: dict[str, SWEInstance],
) -> None:
    """The mini set's rows and the published SWE-bench Verified fixture rows."""
    rows = [*mini_instances.values()]
    fixture = Path(__file__).parents[3] / "data" / "swebench_verified" / "rows.jsonl"
    verified = [json.loads(line) for line in fixture.read_text().splitlines() if line.strip()]
    assert len(verified) >= 10
    patches = [(r.instance_id, r.patch) for r in rows] + [
        (r.instance_id, r.test_patch) for r in rows
    ]
    patches += [(r["instance_id"], r["patch"]) for r in verified]
    patches += [(r["instance_id"], r["test_patch"]) for r in verified]
    for instance_id, patch in patches:
        if patch:
            assert strict_patch_refusal(patch) is None, instance_id


CONTEXT_DIFF_GIT_CONFIG = (
    "*** a/.git/config\n--- b/.git/config\n***************\n*** 1 ****\n--- 1,3 ----\n"
    '  [core]\n+ \tfsmonitor = "touch /tmp/pwned; echo"\n'
)
INDEX_NORMAL_DIFF = 'Index: .git/config\n1a2\n> \tfsmonitor = "touch /tmp/pwned; echo"\n'


@pytest.mark.parametrize(
    ("patch", "why"),
    [
        (CONTEXT_DIFF_GIT_CONFIG, "not a git-format"),
        (INDEX_NORMAL_DIFF, "not a git-format"),
        (_git_block("x.py") + CONTEXT_DIFF_GIT_CONFIG, "not a git-format"),
        (_git_block("x.py") + INDEX_NORMAL_DIFF, "not a git-format"),
        ("--- a/x.py\n+++ b/x.py\n" + HUNK, "not a git-format"),  # plain unified: no diff --git
        ("From: someone\nSubject: fix\n\n" + _git_block("x.py"), "not a git-format"),
        (_git_block("x.py", body="@@ -1 +1 @@\n-a\n+b\n+c\n"), "not a git-format"),  # count
        (_git_block("x.py", body="@@ -1,2 +1,2 @@\n-a\n+b\n"), "not a git-format"),  # short
        (_git_block("x.py") + "trailing junk\n", "not a git-format"),
        ("diff --git a/x.py b/x.py\n--- a/y.py\n+++ b/y.py\n" + HUNK, "disagree"),
        ("diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n", "without any hunk"),
        (_git_block(".git/config"), "into .git"),
        (_git_block(".GIT/config"), "into .git"),
        (_git_block("sub/.Git/hooks/post-checkout"), "into .git"),
        (_git_block("./sub/../.git//config"), "into .git"),
        (
            'diff --git "a/\\056git/config" "b/\\056git/config"\n'
            '--- "a/\\056git/config"\n+++ "b/\\056git/config"\n' + HUNK,
            "into .git",
        ),
        (
            "diff --git a/x b/y\nsimilarity index 100%\nrename from x\nrename to .git/hooks/pc\n",
            "into .git",
        ),
        (_git_block("../etc/x"), "leaves the repository"),
        (_git_block("/etc/passwd"), "absolute"),
        (_git_block("x\x01y.py"), "control character"),
        (
            "diff --git a/lib b/lib\nnew file mode 120000\n--- /dev/null\n+++ b/lib\n"
            "@@ -0,0 +1 @@\n+/usr/lib\n\\ No newline at end of file\n"
            "diff --git a/lib/x.pth b/lib/x.pth\nnew file mode 100644\n--- /dev/null\n"
            "+++ b/lib/x.pth\n@@ -0,0 +1 @@\n+import os\n",
            "through a symlink",
        ),
        (
            "diff --git a/lib b/lib\nold mode 100644\nnew mode 120000\n"
            "diff --git a/lib/x.pth b/lib/x.pth\nnew file mode 100644\n--- /dev/null\n"
            "+++ b/lib/x.pth\n@@ -0,0 +1 @@\n+import os\n",
            "through a symlink",
        ),
        ("diff --git a/img.png b/img.png\nGIT binary patch\nliteral 3\nnot base85!\n\n", "base85"),
        ("", "empty"),
    ],
)
def test_strict_parser_refuses(patch: str, why: str) -> None:
    refusal = strict_patch_refusal(patch)
    assert refusal is not None and why in refusal, refusal


def test_a_symlink_alone_and_dot_github_are_accepted() -> None:
    link = (
        "diff --git a/lib b/lib\nnew file mode 120000\n--- /dev/null\n+++ b/lib\n"
        "@@ -0,0 +1 @@\n+/usr/lib\n\\ No newline at end of file\n"
    )
    assert strict_patch_refusal(link) is None  # restored later as test infrastructure
    assert strict_patch_refusal(_git_block(".github/ci.yml")) is None
    assert strict_patch_refusal(_git_block(".gitignore")) is None


def test_patch_names_git_dir_reads_every_header_gnu_patch_reads() -> None:
    assert patch_names_git_dir(CONTEXT_DIFF_GIT_CONFIG)
    assert patch_names_git_dir(INDEX_NORMAL_DIFF)
    assert patch_names_git_dir('--- "a/\\056GIT/config"\n+++ "b/\\056GIT/config"\n' + HUNK)
    assert not patch_names_git_dir(_git_block(".github/ci.yml") + _git_block(".gitignore"))
