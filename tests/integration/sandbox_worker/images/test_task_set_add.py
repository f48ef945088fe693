"""``python -m sandbox_worker.images add``: a user's own repository (not one of the mini
repos: built here with ``git init``) becomes a validated task set in one command, against the
real Docker engine: images under ``swerl/<name>/``, gold resolves and empty does not, a bad row
and a row whose gold patch does not fix its test fail only themselves, and the valid rows are
registered where a worker resolves ``<name>/<id>`` keys with those images; ``images remove``
then undoes it all, never touching the shared base image."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from sandbox_worker import images, task_sets
from sandbox_worker.config import TrajectoryRunnerConfig
from sandbox_worker.factory import _image_naming, worker_task_instances
from tests.integration.sandbox_worker.images.test_images import _git
from tests.support.docker import ensure_dockerd
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
    registry = ["--task-sets-dir", str(out.parent)]
    cmd = [sys.executable, "-m", "sandbox_worker.images", "add", "--instances", str(rows),
           "--name", NAME, *registry, "--no-bwrap", "--test-timeout", "120"]  # fmt: skip
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
        assert f"--instances {NAME}/me__wordcount-1" in res.stdout  # roll out by name
        assert client.images.get(names[0]).labels["swerl.base_commit"] == base
        written = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["instance_id"] for r in written] == ["me__wordcount-1"]
        # a worker on this node resolves the key to the row and the image just built
        rc = TrajectoryRunnerConfig(task_sets_dir=str(out.parent))
        instances = worker_task_instances(rc)
        key = f"{NAME}/me__wordcount-1"
        assert instances[key].base_commit == base
        assert _image_naming(rc, instances)(key) == names[0]
        # remove undoes add: both images built (valid or not) and the registration
        res = subprocess.run([sys.executable, "-m", "sandbox_worker.images", "remove", "--name",
                              NAME, *registry], env=env, capture_output=True, text=True,
                             cwd=REPO_ROOT, timeout=120)  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        for name in names:
            with pytest.raises(docker.errors.ImageNotFound):
                client.images.get(name)
        client.images.get(images.base_image())  # the shared base image stays
        assert task_sets.registered_sets(out.parent) == []
    finally:
        for name in names:
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.images.remove(name, force=True)
        client.close()


def _tiny_image(client: object, repository: str) -> None:
    """A one-file image (no build, no network): enough to be a set's image for ``remove``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"swerl test\n"
        info = tarfile.TarInfo("marker")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    name, _, tag = repository.rpartition(":")
    client.api.import_image_from_data(buf.getvalue(), repository=name, tag=tag)  # type: ignore[attr-defined]


def test_remove_deletes_the_sets_images_on_the_engine_only(tmp_path: Path) -> None:
    """``images remove`` on the real engine: the set's tags go (the manifest's and a stray one
    under its namespace), another set's image and the registry of others stay; a second
    remove is an unknown set (exit 2)."""
    import docker

    ensure_dockerd()
    name, other = f"{NAME}-rm", f"{NAME}-other"
    ours = [images.local_image(name, "me__tool-1"), images.local_image(name, "me__tool-2")]
    theirs = images.local_image(other, "me__tool-1")
    client = docker.DockerClient(base_url=images.docker_host())
    sets = tmp_path / "sets"
    manifest = task_sets.TaskSetManifest(name=name, source=str(tmp_path / "mine.jsonl"),
                                         images=(ours[0],), valid=0)  # fmt: skip
    task_sets.write_manifest(sets, manifest)  # ours[1]: a build the manifest never recorded
    cmd = [sys.executable, "-m", "sandbox_worker.images", "remove", "--name", name,
           "--task-sets-dir", str(sets)]  # fmt: skip
    env = {**os.environ, "DOCKER_HOST": images.docker_host()}
    try:
        for image in (*ours, theirs):
            _tiny_image(client, image)
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO_ROOT,
                             timeout=60)  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        for image in ours:
            with pytest.raises(docker.errors.ImageNotFound):
                client.images.get(image)
        client.images.get(theirs)
        assert task_sets.registered_sets(sets) == []
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO_ROOT,
                             timeout=60)  # fmt: skip
        assert res.returncode == 2 and f"unknown task set {name!r}" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    finally:
        for image in (*ours, theirs):
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.images.remove(image, force=True)
        client.close()
