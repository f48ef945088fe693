"""Image naming, the build scripts' idempotency and error handling, the prepull ops script."""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import ClassVar

import pytest

from sandbox_worker import images
from sandbox_worker.backends import ImageNotFoundError
from tests.integration.sandbox_worker.conftest import SessionEnv
from tests.support import sandboxes
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.docker

REPO = REPO_ROOT
PREPULL = REPO / "deploy" / "images" / "prepull_swebench.sh"
BUILD_INSTANCES = REPO / "deploy" / "images" / "build_instances.py"


def _build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_instances", BUILD_INSTANCES)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _run_build_instances(
    instances: Path, env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[str]:
    """``build_instances.py`` on ``instances`` with the test repositories' materializer."""
    cmd = [sys.executable, str(BUILD_INSTANCES), "--instances", str(instances),
           "--materializer", sandboxes.MATERIALIZER, *extra]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)


# -- naming -----------------------------------------------------------------------------------


def test_instance_image_follows_swebench_naming() -> None:
    # The official image of this SWE-bench Verified instance, as published by SWE-bench.
    assert (
        images.instance_image("django__django-11099", namespace="swebench")
        == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    )
    assert (
        images.instance_image("Psf__Requests-2317", namespace="swebench", tag="v2", arch="arm64")
        == "swebench/sweb.eval.arm64.psf_1776_requests-2317:v2"
    )
    assert images.instance_image("swerl__strkit-1").startswith("swerl/sweb.eval.x86_64.")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"instance_id": ""},
        {"instance_id": "a b"},
        {"instance_id": "x/../y"},
        {"instance_id": "ok-1", "namespace": "Bad NS"},
        {"instance_id": "ok-1", "arch": "sparc"},
        {"instance_id": "ok-1", "tag": "bad tag"},
    ],
)
def test_instance_image_rejects_bad_input(kwargs: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        images.instance_image(**kwargs)


def test_rootfs_lookup_of_unbuilt_image_is_image_not_found(tmp_path: Path) -> None:
    with pytest.raises(ImageNotFoundError) as err:
        images.rootfs_info("swerl/never-built:1", cache=tmp_path)
    assert "python -m sandbox_worker.images build" in str(err.value)
    assert images.rootfs_key("a/b:c") != images.rootfs_key("a_b_c")


def test_rootfs_of_built_image_is_the_same_tree(sandbox_env: SessionEnv) -> None:
    info = images.rootfs_info(sandbox_env.image)
    base = images.rootfs_info(images.base_image())
    assert info.root == base.root  # instance images share the base tree
    assert info.testbed is not None
    assert (info.testbed / "calc.py").read_text().startswith("def add")
    assert "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in info.env
    assert (info.root / "usr" / "bin" / "python3").exists()


def test_docker_backend_reads_the_labels_the_build_writes(sandbox_env: SessionEnv) -> None:
    docker_backend = sandbox_env.backends["docker"]
    labels = docker_backend.image_labels(sandbox_env.image)
    assert labels is not None
    assert labels["swerl.repo"] == sandboxes.TINY_REPO and len(labels["swerl.base_commit"]) == 40
    assert docker_backend.image_labels("swerl/no-such-image:never") is None
    # the bwrap tree's stamp keeps the image's swerl.* labels, so both backends check alike
    bwrap = sandbox_env.backends["bwrap"]
    assert bwrap.image_labels(sandbox_env.image) == images.swerl_labels(labels)
    assert bwrap.image_labels("swerl/no-such-image:never") is None


# -- build ------------------------------------------------------------------------------------


def test_build_is_idempotent_when_warm(sandbox_env: SessionEnv) -> None:
    # Warm means nothing is rebuilt (counted by the builder), not a wall-clock bound.
    instances = sandbox_env.root / "images" / "instances.jsonl"
    env = {**os.environ, "DOCKER_HOST": images.docker_host()}
    res = _run_build_instances(instances, env)
    assert res.returncode == 0, res.stderr
    assert "0 images built, 0 bwrap trees written" in res.stdout
    base = subprocess.run(
        ["bash", str(REPO / "deploy" / "images" / "build_base.sh")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert base.returncode == 0 and "nothing to do" in base.stderr


def _user_row(**fields: object) -> dict[str, object]:
    row: dict[str, object] = {
        "instance_id": "acme__calc-1",
        "repo": "acme/calc",
        "problem_statement": "add() subtracts",
        "patch": "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n"
        "-x\n+y\n",
        "FAIL_TO_PASS": ["test_calc.py::test_add"],
        "PASS_TO_PASS": [],
    }
    return {**row, **fields}


def test_build_instances_reports_bad_records(tmp_path: Path) -> None:
    mod = _build_module()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_user_row()) + "\n")
    with pytest.raises(mod.BuildError, match="an image build needs base_commit"):
        mod.load_instances(bad)
    bad.write_text("{not json\n")
    with pytest.raises(mod.BuildError, match=r"line 1: invalid JSON"):
        mod.load_instances(bad)
    rec = _user_row(base_commit="abc")
    bad.write_text(json.dumps(rec) + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(mod.BuildError, match="duplicate"):
        mod.load_instances(bad)
    for fields, message in (
        ({"patch": "garbage"}, "field 'patch'"),
        ({"repo_path": "nowhere"}, "repo_path 'nowhere' is not a git repository"),
        ({"repo_path": str(tmp_path), "repo_url": "file:///x"}, "not both"),
        ({"setup_script": ""}, "setup_script must be"),
        ({"setup_commands": "make"}, "setup_commands must be a list"),
    ):
        bad.write_text(json.dumps(_user_row(base_commit="abc", **fields)) + "\n")
        with pytest.raises(mod.BuildError, match=message):
            mod.load_instances(bad)
    with pytest.raises(mod.BuildError, match="MODULE:FUNCTION"):
        mod.load_materializer("no_colon")


def test_build_refuses_a_repo_at_the_wrong_commit(tmp_path: Path) -> None:
    instances = sandboxes.write_instances(tmp_path / "i.jsonl", "0" * 40)
    env = {**os.environ, "DOCKER_HOST": images.docker_host(), "SWERL_IMAGE_NAMESPACE": "swerltest"}
    res = _run_build_instances(instances, env, "--no-bwrap")
    assert res.returncode == 1
    assert "but the instance's base_commit is 0000" in res.stderr


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo.parent), "PATH": os.environ["PATH"]}
    env |= {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env |= {"GIT_COMMITTER_EMAIL": "t@t"}
    res = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def _user_repo(root: Path) -> tuple[Path, str]:
    """A repository that is not in the mini set: a first commit (tagged v0.1), the base, then
    the fix on main (tagged v1.0) and a branch of its own; returns it and the base."""
    repo = root / "calc"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "calc")
    _git(repo, "tag", "v0.1")
    (repo / "README").write_text("calc\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "readme (the base)")
    base = _git(repo, "rev-parse", "HEAD")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    _git(repo, "commit", "-q", "-am", "fix (after the base)")
    _git(repo, "tag", "-a", "v1.0", "-m", "release with the fix")
    _git(repo, "branch", "hotfix")
    return repo, base


def test_users_own_repositories_by_path_and_file_url(tmp_path: Path) -> None:
    """repo_path (relative to the file) and repo_url (file://) rows: cloned at base_commit with
    their history up to it and nothing after it (no later commit, object, tag, branch or
    remote: the agent cannot read the fix), the setup script run in the image, labelled; a
    bad commit is a message."""
    import docker

    namespace = "swerltestuser"
    env = {**os.environ, "DOCKER_HOST": images.docker_host(), "SWERL_IMAGE_NAMESPACE": namespace}
    repo, base = _user_repo(tmp_path)
    fix = _git(repo, "rev-parse", "main")
    script = "python3 -c 'import calc' && echo ok > /opt/swerl-setup-ran\n"
    rows = [
        _user_row(base_commit=base, repo_path="calc", setup_script=script),
        _user_row(instance_id="acme__calc-2", base_commit=base[:12], repo_url=repo.as_uri()),
    ]
    instances = tmp_path / "mine.jsonl"
    instances.write_text("".join(json.dumps(row) + "\n" for row in rows))
    client = docker.DockerClient(base_url=images.docker_host())
    names = [images.instance_image(str(r["instance_id"]), namespace=namespace) for r in rows]
    try:
        res = _run_build_instances(instances, env, "--no-bwrap")
        assert res.returncode == 0, res.stdout + res.stderr
        for name, row in zip(names, rows, strict=True):
            labels = client.images.get(name).labels
            assert labels["swerl.base_commit"] == row["base_commit"]
            assert labels["swerl.repo"] == "acme/calc"
            shell = "git -C /testbed rev-parse HEAD; git -C /testbed log --all --format=%s; "
            shell += f"git -C /testbed cat-file -t {fix} || echo no-fix-object; "
            shell += "git -C /testbed tag; git -C /testbed branch -a; git -C /testbed remote -v; "
            shell += "cat /testbed/calc.py; cat /opt/swerl-setup-ran || true"
            cmd = ["sh", "-c", shell]
            out = client.containers.run(name, cmd, remove=True, network_mode="none").decode()
            assert out.splitlines()[0] == base
            assert "readme (the base)" in out and "calc" in out  # history up to the base kept
            assert "fix (after the base)" not in out  # nothing after it: no log of the fix,
            assert "no-fix-object" in out  # not even its object,
            assert "v0.1" in out and "v1.0" not in out and "hotfix" not in out  # later refs,
            assert "origin" not in out  # or the remote to fetch them from
            assert "return a - b" in out  # the tree at the base commit
            assert ("ok" in out.splitlines()[-1]) == ("setup_script" in row)
        instances.write_text(json.dumps(_user_row(base_commit="0" * 40, repo_path="calc")) + "\n")
        res = _run_build_instances(instances, env, "--no-bwrap")
        assert res.returncode == 1 and "Traceback" not in res.stderr
        expected = f"acme__calc-1: cloning {repo}: base_commit {'0' * 40} is not a commit"
        assert expected in res.stderr, res.stderr
    finally:
        for name in names:
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.images.remove(name)
        client.close()


def test_a_rebuild_leaves_no_dangling_image(tmp_path: Path) -> None:
    import docker

    namespace = "swerltestrebuild"
    env = {**os.environ, "DOCKER_HOST": images.docker_host(), "SWERL_IMAGE_NAMESPACE": namespace}
    instances = sandboxes.write_instances(
        tmp_path / "i.jsonl", sandboxes.tiny_base_commit(tmp_path)
    )
    client = docker.DockerClient(base_url=images.docker_host())
    image = images.instance_image(sandboxes.TINY_INSTANCE_ID, namespace=namespace)
    try:
        assert _run_build_instances(instances, env, "--no-bwrap").returncode == 0
        first = client.images.get(image).id
        record = json.loads(instances.read_text())  # new content: the tag moves to a new image
        instances.write_text(json.dumps({**record, "setup_commands": ["touch /marker"]}) + "\n")
        res = _run_build_instances(instances, env, "--no-bwrap")
        assert res.returncode == 0, res.stderr
        assert client.images.get(image).id != first
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(first)
        dangling = client.images.list(filters={"dangling": True, "label": "swerl.kind=instance"})
        assert not [i for i in dangling if i.id == first]
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(image)
        client.close()


# -- prepull ops script -----------------------------------------------------------------------


def test_prepull_dry_run_uses_the_same_names(tmp_path: Path) -> None:
    ids = ["django__django-11099", "Astropy__astropy-12907", "swerl__strkit-1"]
    src = tmp_path / "ids.jsonl"
    src.write_text("".join(json.dumps({"instance_id": i}) + "\n" for i in ids))
    res = subprocess.run(
        ["bash", str(PREPULL), "--dry-run", str(src)],
        capture_output=True,
        text=True,
        env={**os.environ, "DOCKER_HOST": images.docker_host()},
    )
    assert res.returncode == 0, res.stderr
    rows = [line.split("\t") for line in res.stdout.splitlines()]
    assert [r[0] for r in rows] == ids
    assert [r[1] for r in rows] == [images.instance_image(i, namespace="swebench") for i in ids]


@pytest.fixture
def fake_docker(tmp_path: Path) -> Path:
    """A `docker` stand-in: `present:` images exist, `flaky:` ones pull on the 2nd try."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    script = f"""#!/usr/bin/env bash
img="${{@: -1}}"; key="$(printf '%s' "$img" | tr '/:' '__')"
case "$1 $2" in
  "image inspect") [[ -e "{state}/$key" || "$img" == *present-* ]] ;;
  "pull --quiet")
    echo "$img" >> "{state}/pulls"
    if [[ "$img" == *flaky-* ]]; then
      if [[ -e "{state}/$key.tried" ]]; then touch "{state}/$key"; exit 0; fi
      touch "{state}/$key.tried"
    fi
    exit 1 ;;
  *) exit 3 ;;
esac
"""
    (bin_dir / "docker").write_text(script)
    (bin_dir / "docker").chmod(0o755)
    return bin_dir


def test_prepull_retries_and_reports_missing(tmp_path: Path, fake_docker: Path) -> None:
    src = tmp_path / "ids.txt"
    src.write_text("present-1\nflaky-1\ngone-1\n")
    missing = tmp_path / "missing.txt"
    env = {**os.environ, "PATH": f"{fake_docker}:{os.environ['PATH']}"}
    res = subprocess.run(
        ["bash", str(PREPULL), "--retries", "2", "--missing-out", str(missing), str(src)],
        capture_output=True,
        text=True,
        env={**env, "PREPULL_BACKOFF_S": "0"},
        timeout=120,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert missing.read_text().split() == ["gone-1"]
    assert "gone-1 -> swebench/sweb.eval.x86_64.gone-1:latest" in res.stderr
    pulls = (tmp_path / "state" / "pulls").read_text().split()
    assert pulls.count("swebench/sweb.eval.x86_64.flaky-1:latest") == 2
    assert pulls.count("swebench/sweb.eval.x86_64.gone-1:latest") == 2
    assert "swebench/sweb.eval.x86_64.present-1:latest" not in pulls


# -- pull a whole dataset ---------------------------------------------------------------------


def test_pull_a_dataset_is_resumable_and_reports_missing(tmp_path: Path) -> None:
    """Against the local engine and a loopback registry nothing listens on (so no registry is
    ever contacted): images the engine holds are present, the others fail cleanly and are
    listed; a rerun pulls only what is still missing."""
    import docker

    from sandbox_worker.image_pull import image_name
    from services.datasets import load_instances

    registry = "127.0.0.1:9"
    data = REPO / "tests" / "data" / "instances.jsonl"
    instances = load_instances(data)
    client = docker.DockerClient(base_url=images.docker_host())
    tagged: list[str] = []

    def hold(index: int) -> None:  # the engine already has this instance's published image
        name = image_name(instances[index], "swebench", registry)
        local = client.images.get(images.instance_image(instances[index].instance_id))
        repository, _, tag = name.rpartition(":")
        local.tag(repository, tag)
        tagged.append(name)

    missing_out = tmp_path / "missing.txt"
    cmd = [sys.executable, "-m", "sandbox_worker.images", "pull", "--instances", str(data)]
    cmd += ["--dataset", "swebench", "--docker-host", images.docker_host()]
    cmd += ["--registry", registry, "--parallel", "3", "--missing-out", str(missing_out)]
    cmd += ["--retries", "1", "--retry-backoff", "0"]  # nothing listens: transient, one retry
    try:
        hold(0), hold(1)
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        total = len(instances)
        assert res.returncode == 1, res.stdout + res.stderr
        assert f"{total} image(s): 2 present, 0 pulled, {total - 2} missing" in res.stdout
        assert "Traceback" not in res.stderr
        want_missing = [inst.instance_id for inst in instances[2:]]
        assert sorted(missing_out.read_text().split()) == sorted(want_missing)
        assert f"missing {image_name(instances[2], 'swebench', registry)}" in res.stderr
        hold(2)  # resumable: the rerun sees the newly held image as present
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert f"{total} image(s): 3 present, 0 pulled, {total - 3} missing" in res.stdout
        assert instances[2].instance_id not in missing_out.read_text().split()
    finally:
        for name in tagged:
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.images.remove(name)
        client.close()
    assert "try 1 failed" in res.stdout and "connection refused" in res.stdout
    no_engine = [*cmd[:8], "--docker-host", f"unix://{tmp_path}/none.sock"]
    res = subprocess.run(no_engine, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "no Docker engine at" in res.stderr, res.stderr
    bad = subprocess.run([*cmd, "--registry", "Bad Host"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid registry 'Bad Host'" in bad.stderr, bad.stderr


class _LoopbackRegistry(http.server.BaseHTTPRequestHandler):
    """A registry on loopback (registry API v2, enough for the engine to ask for a manifest):
    repository ``t/missing`` is unknown (404 MANIFEST_UNKNOWN), ``t/secret`` unauthorized
    (401), every other one busy (503). Counts the manifest requests per repository."""

    manifests: ClassVar[dict[str, int]] = {}

    def do_GET(self) -> None:
        if self.path == "/v2/":
            return self._answer(200, {})
        repository = self.path.removeprefix("/v2/").split("/manifests/")[0]
        if self.command == "GET":
            self.manifests[repository] = self.manifests.get(repository, 0) + 1
        if repository == "t/missing":
            return self._error(404, "MANIFEST_UNKNOWN", "manifest unknown")
        if repository == "t/secret":
            return self._error(401, "UNAUTHORIZED", "authentication required")
        return self._error(503, "UNAVAILABLE", "busy")

    def _error(self, status: int, code: str, message: str) -> None:
        self._answer(status, {"errors": [{"code": code, "message": message}]})

    do_HEAD = do_GET

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_pull_retries_a_busy_registry_and_not_a_missing_image() -> None:
    """The real engine pulling from a registry on loopback: a 503 is retried (bounded), an
    unknown manifest and an unauthorized pull are not."""
    import docker

    from sandbox_worker.image_pull import RetryPolicy, pull_all

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _LoopbackRegistry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    wanted = {f"{host}/t/{name}:latest": [name] for name in ("busy", "missing", "secret")}
    client = docker.DockerClient(base_url=images.docker_host())
    _LoopbackRegistry.manifests.clear()
    try:
        results = pull_all(client, wanted, parallel=3, progress=lambda _: None,
                           retry=RetryPolicy(retries=2, backoff_s=0.1))  # fmt: skip
    finally:
        client.close()
        server.shutdown()
    by_name = {r.image.split("/t/")[1].removesuffix(":latest"): r for r in results}
    assert {n: (r.state, r.attempts) for n, r in by_name.items()} == {
        "busy": ("missing", 3),
        "missing": ("missing", 1),
        "secret": ("missing", 1),
    }
    assert "503" in by_name["busy"].error and "manifest unknown" in by_name["missing"].error
    # the engine asks for a manifest once per pull (it does not retry on its own)
    assert _LoopbackRegistry.manifests["t/busy"] == 3 * _LoopbackRegistry.manifests["t/missing"]
