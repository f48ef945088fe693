"""``python -m sandbox_worker.images add``: a user's own repository (not one of the mini
repos: built here with ``git init``) becomes a validated task set in one command, against the
real Docker engine: images under ``swerl/<name>/``, gold resolves and empty does not, a bad row
and a row whose gold patch does not fix its test fail only themselves, and the valid rows are
written where a worker resolves ``<name>/<id>`` keys with those images."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_worker import images
from sandbox_worker.config import TrajectoryRunnerConfig
from sandbox_worker.factory import _image_naming, worker_task_instances
from tests.integration.sandbox_worker.images.test_images import _git
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.docker
NAME = "swerltest-add"


def _repo(root: Path) -> tuple[Path, str, str, str]:
    """A small package with a bug and a passing test; returns the repository, its base commit,
    the gold patch (the fix) and the test patch (a test that fails until the fix)."""
    repo = root / "wordcount"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "wordcount.py").write_text(
        "def count(text):\n    return len(text.split(' '))\n\n\ndef upper(text):\n"
        "    return text.upper()\n"
    )
    (repo / "test_wordcount.py").write_text(
        "from wordcount import upper\n\n\ndef test_upper():\n    assert upper('a') == 'A'\n"
    )
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "wordcount")
    base = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "wordcount.py").write_text(
        "def count(text):\n    return len(text.split())\n\n\ndef upper(text):\n"
        "    return text.upper()\n"
    )
    gold = _git(repo, "diff") + "\n"  # _git strips the output: a diff ends with a newline
    _git(repo, "checkout", "-q", "--", "wordcount.py")
    with (repo / "test_wordcount.py").open("a") as f:
        f.write("\n\ndef test_count_spaces():\n    from wordcount import count\n\n"
                "    assert count('a  b ') == 2\n")  # fmt: skip
    test_patch = _git(repo, "diff") + "\n"
    _git(repo, "checkout", "-q", "--", "test_wordcount.py")
    return repo, base, gold, test_patch


def test_a_users_repository_becomes_a_validated_task_set(tmp_path: Path) -> None:
    import docker

    repo, base, gold, test_patch = _repo(tmp_path)
    row = {"repo": "me/wordcount", "instance_id": "me__wordcount-1", "base_commit": base,
           "patch": gold, "test_patch": test_patch, "problem_statement": "count() miscounts",
           "FAIL_TO_PASS": ["test_wordcount.py::test_count_spaces"],
           "PASS_TO_PASS": ["test_wordcount.py::test_upper"],
           "repo_url": repo.as_uri()}  # fmt: skip
    no_fix = {**row, "instance_id": "me__wordcount-2", "patch": test_patch.replace(
        "test_wordcount.py", "NOTES.py")}  # fmt: skip  # gold "fixes" nothing: not valid
    rows = tmp_path / "mine.jsonl"
    rows.write_text(json.dumps(row) + "\n" + json.dumps(no_fix) + "\n{broken\n")
    out = tmp_path / "sets" / f"{NAME}.jsonl"
    cmd = [sys.executable, "-m", "sandbox_worker.images", "add", "--instances", str(rows),
           "--name", NAME, "--out", str(out), "--no-bwrap", "--test-timeout", "120"]  # fmt: skip
    env = {**os.environ, "DOCKER_HOST": images.docker_host()}
    client = docker.DockerClient(base_url=images.docker_host())
    names = [images.local_image(NAME, iid) for iid in ("me__wordcount-1", "me__wordcount-2")]
    try:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO_ROOT,
                             timeout=900)  # fmt: skip
        report = res.stdout + res.stderr
        assert res.returncode == 1, report  # two rows are not valid: reported, not fatal
        assert "Traceback" not in report
        assert "me__wordcount-1: swerl/swerltest-add/sweb.eval" in report
        assert "gold ok, empty ok" in report, report
        assert "me__wordcount-2" in report and "gold FAIL" in report, report
        assert "line 3: invalid JSON" in report  # the bad row, by its line
        assert "1/3 instances valid" in report
        assert f"train on it: --dataset {NAME}={out.resolve()}" in res.stdout
        assert client.images.get(names[0]).labels["swerl.base_commit"] == base
        written = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["instance_id"] for r in written] == ["me__wordcount-1"]
        # a worker on this node resolves the key to the row and the image just built
        rc = TrajectoryRunnerConfig(task_sets_dir=str(out.parent))
        instances = worker_task_instances(rc)
        key = f"{NAME}/me__wordcount-1"
        assert instances[key].base_commit == base
        assert _image_naming(rc, instances)(key) == names[0]
    finally:
        for name in names:
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.images.remove(name, force=True)
        client.close()
