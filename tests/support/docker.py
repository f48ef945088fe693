"""A running private dockerd and the sandbox test images, for integration tests.

Nothing here skips: if docker cannot start or an image cannot be built, the fixture fails with
the daemon's log tail, because a sandbox test that silently does not run proves nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sandbox_worker import images
from tests.support import sandboxes
from tests.support.paths import REPO_ROOT

DOCKERD_SCRIPT = REPO_ROOT / "deploy" / "dev" / "dockerd.sh"
DOCKERD_LOG = Path("/var/log/swerl-dockerd.log")


class DockerUnavailable(RuntimeError):
    pass


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def ensure_dockerd() -> str:
    """Start the private dockerd if needed (idempotent); return its DOCKER_HOST."""
    host = images.docker_host()
    env = {**os.environ, "DOCKER_HOST": host}
    res = subprocess.run(
        ["bash", str(DOCKERD_SCRIPT), "start"], env=env, capture_output=True, text=True
    )
    if res.returncode != 0:
        raise DockerUnavailable(
            f"dockerd could not start ({DOCKERD_SCRIPT} start -> {res.returncode}):\n"
            f"{res.stdout}{res.stderr}\n--- {DOCKERD_LOG} ---\n{_tail(DOCKERD_LOG)}"
        )
    return host


def build_test_images(work: Path) -> str:
    """Build the base image and the tiny test instance (cached); return the instance image."""
    env = {**os.environ, "DOCKER_HOST": images.docker_host()}
    work.mkdir(parents=True, exist_ok=True)
    commit = sandboxes.tiny_base_commit(work)
    instances = sandboxes.write_instances(work / "instances.jsonl", commit)
    steps = [
        ["bash", str(REPO_ROOT / "deploy" / "images" / "build_base.sh")],
        [
            sys.executable,
            str(REPO_ROOT / "deploy" / "images" / "build_instances.py"),
            "--instances",
            str(instances),
            "--materializer",
            sandboxes.MATERIALIZER,
        ],
    ]
    for cmd in steps:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO_ROOT)
        if res.returncode != 0:
            raise DockerUnavailable(
                f"image build failed: {' '.join(cmd)} -> {res.returncode}\n"
                f"{res.stdout[-3000:]}{res.stderr[-3000:]}"
            )
    return images.instance_image(sandboxes.TINY_INSTANCE_ID)


def build_task_images(instances: Path = images.DEFAULT_INSTANCES) -> None:
    """Build the images (and bwrap trees) of a SWE-bench-format JSONL (default: the mini set)."""
    res = subprocess.run(
        [sys.executable, "-m", "sandbox_worker.images", "build", "--instances", str(instances)],
        env={**os.environ, "DOCKER_HOST": images.docker_host()},
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    if res.returncode != 0:
        raise DockerUnavailable(
            f"task image build failed ({res.returncode}):\n{res.stdout[-3000:]}{res.stderr[-3000:]}"
        )
