"""Test-only task instances for the sandbox contract tests (independent of tests/data).

``materialize_tiny_repo`` is a materialiser for ``deploy/images/build_instances.py``: it writes a
two-file Python repository with a fixed author and date, so its commit id is the same on every
machine and the instance record below can pin it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

TINY_INSTANCE_ID = "swerltest__tiny-1"
TINY_REPO = "swerltest/tiny"
MATERIALIZER = "tests.support.sandboxes:materialize_tiny_repo"

_FILES = {
    "calc.py": "def add(a, b):\n    return a + b\n",
    "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    "README.md": "A tiny repository for sandbox tests.\n",
}
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "swerl-test",
    "GIT_AUTHOR_EMAIL": "test@swerl.invalid",
    "GIT_COMMITTER_NAME": "swerl-test",
    "GIT_COMMITTER_EMAIL": "test@swerl.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+00:00",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_SYSTEM": "/dev/null",
}


def _git(dest: Path, *args: str) -> str:
    env = {**os.environ, **_GIT_ENV}
    res = subprocess.run(
        ["git", *args], cwd=dest, env=env, check=True, capture_output=True, text=True
    )
    return res.stdout.strip()


def materialize_tiny_repo(name: str, dest: Path) -> str:
    """Create the tiny repository at ``dest``; return its (deterministic) head commit."""
    if name != TINY_REPO:
        raise ValueError(f"unknown test repository {name!r}")
    dest.mkdir(parents=True)
    for rel, text in _FILES.items():
        (dest / rel).write_text(text)
    _git(dest, "init", "-q", "-b", "main")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "initial")
    return _git(dest, "rev-parse", "HEAD")


def tiny_base_commit(tmp_dir: Path) -> str:
    """The commit ``materialize_tiny_repo`` produces (computed, not hard-coded)."""
    return materialize_tiny_repo(TINY_REPO, tmp_dir / "tiny")


def write_instances(path: Path, base_commit: str) -> Path:
    record = {  # a full instance row: the image build reads it with the dataset loader
        "instance_id": TINY_INSTANCE_ID,
        "repo": TINY_REPO,
        "base_commit": base_commit,
        "problem_statement": "n/a",
        "patch": "diff --git a/a b/a\n--- a/a\n+++ b/a\n@@ -1 +1 @@\n-x\n+y\n",
        "FAIL_TO_PASS": ["test_tiny.py::test_tiny"],
        "PASS_TO_PASS": [],
    }
    path.write_text(json.dumps(record) + "\n")
    return path
