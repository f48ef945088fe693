"""A patch that fills the evaluation sandbox's disk quota is graded (reward 0), never aborted.

The quota is the sandbox's own limit (docs/sandboxes.md, "Disk quota"): running out of it
because of the patch is the policy's doing, so it must not become an excluded infrastructure
failure. Real backends, the mini set's ``swerl__strkit-1`` with a 48 MiB evaluation disk.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sandbox_worker import images
from sandbox_worker.backends import SandboxBackend, SandboxLimits
from sandbox_worker.evaluation import EvalConfig, evaluate_patch
from services.protocol.instance import SWEInstance

QUOTA = SandboxLimits(disk_mb=48, memory_mb=1024)


def _binary_patch_of_a_big_file(work: Path, size_mb: int) -> str:
    """``git diff --binary`` adding ``size_mb`` MiB of zeros: a few KiB of deflated patch."""
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(work)]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "base"], check=True)
    (work / "blob.bin").write_bytes(bytes(size_mb * 1024 * 1024))
    subprocess.run([*git, "add", "blob.bin"], check=True)
    out = subprocess.run(
        [*git, "diff", "--cached", "--binary", "HEAD"], check=True, capture_output=True, text=True
    )
    return out.stdout


@pytest.fixture(params=["docker", "bwrap"])
def backend(
    request: pytest.FixtureRequest, eval_backends: dict[str, SandboxBackend]
) -> SandboxBackend:
    return eval_backends[request.param]


@pytest.fixture
def inst(instances: dict[str, SWEInstance]) -> SWEInstance:
    return instances["swerl__strkit-1"]


def test_a_patch_that_expands_beyond_the_quota_does_not_apply(
    backend: SandboxBackend, inst: SWEInstance, node: str, tmp_path: Path
) -> None:
    bomb = _binary_patch_of_a_big_file(tmp_path / "repo", 96)
    assert len(bomb) < 1024 * 1024  # small as a patch, 96 MiB once applied
    image = images.instance_image(inst.instance_id)
    config = EvalConfig(limits=QUOTA)
    report = evaluate_patch(backend, inst, inst.patch + bomb, image, node=node, config=config)
    assert report.infra_error is None, report.infra_error
    assert not report.applied and not report.resolved
    assert report.reward == 0.0
    assert "No space left on device" in report.log_tail, report.log_tail


def test_code_that_fills_the_disk_during_the_tests_is_reward_zero(
    backend: SandboxBackend, inst: SWEInstance, node: str
) -> None:
    filler = inst.patch.replace(
        "+    if width <= len(suffix):\n",
        "+    open('/tmp/fill', 'wb').write(bytes(64 * 1024 * 1024))\n"
        "+    if width <= len(suffix):\n",
    ).replace("@@ -26,7 +26,9 @@", "@@ -26,7 +26,10 @@")
    assert filler != inst.patch
    image = images.instance_image(inst.instance_id)
    config = EvalConfig(limits=QUOTA)
    report = evaluate_patch(backend, inst, filler, image, node=node, config=config)
    assert report.infra_error is None, report.infra_error
    assert report.applied and report.tests_run and not report.resolved
    assert report.reward == 0.0
    assert "No space left on device" in report.log_tail, report.log_tail
