"""Reading file lists out of diffs, hunk-aware."""

from __future__ import annotations

import pytest

from sandbox_worker.evaluation.patches import (
    DEV_NULL,
    PatchParseError,
    directives_of_test_patch,
    files_of_test_ids,
    is_empty_patch,
    modified_files,
    new_files,
    patched_files,
    unsafe_patch_reason,
)
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


def test_unsafe_patches_are_recognised(mini_instances: dict[str, SWEInstance]) -> None:
    hunk = "@@ -1 +1 @@\n-a\n+b\n"
    git_dir = "--- a/.git/config\n+++ b/.git/config\n" + hunk
    assert "into .git" in (unsafe_patch_reason(git_dir) or "")
    hidden = '--- "a/\\056git/config"\n+++ "b/\\056git/config"\n' + hunk  # octal-escaped "."
    assert "into .git" in (unsafe_patch_reason(hidden) or "")
    dotted = "--- a/./sub/../.git//config\n+++ b/./sub/../.git//config\n" + hunk
    assert unsafe_patch_reason(dotted) is not None
    renamed = "diff --git a/x b/.git/hooks/post-checkout\nrename from x\nrename to .git/hooks/pc\n"
    assert "into .git" in (unsafe_patch_reason(renamed) or "")
    quoted_header = 'diff --git "a/x y" "b/.git/x y"\n'
    assert "into .git" in (unsafe_patch_reason(quoted_header) or "")
    outside = "--- a/../etc/x\n+++ b/../etc/x\n" + hunk
    assert "leaves the repository" in (unsafe_patch_reason(outside) or "")
    link = (
        "diff --git a/lib b/lib\nnew file mode 120000\n--- /dev/null\n+++ b/lib\n"
        "@@ -0,0 +1 @@\n+/usr/lib\n\\ No newline at end of file\n"
    )
    through = "diff --git a/lib/x.pth b/lib/x.pth\nnew file mode 100644\n--- /dev/null\n"
    through += "+++ b/lib/x.pth\n@@ -0,0 +1 @@\n+import os\n"
    assert "through a symlink" in (unsafe_patch_reason(link + through) or "")
    # A symlink alone is applied (and restored as test infrastructure); .github is no .git.
    assert unsafe_patch_reason(link) is None
    github = "--- a/.github/ci.yml\n+++ b/.github/ci.yml\n" + hunk
    assert unsafe_patch_reason(github) is None
    for inst in mini_instances.values():
        assert unsafe_patch_reason(inst.patch) is None
        assert unsafe_patch_reason(inst.test_patch) is None
