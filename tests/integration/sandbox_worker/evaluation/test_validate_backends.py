"""The mini task set validated through the real sandbox backends (the acceptance check).

bwrap: every instance, all four checks (gold resolves, empty does not and shows the base
state, a tampered protected test file is restored, a broken patch does not apply).
docker: the same checks for one instance whose test patch modifies a test file and one whose
test patch creates one; plus the CLI end to end.
"""

from __future__ import annotations

import io
import subprocess
import sys

from sandbox_worker import images, validate
from sandbox_worker.backends import SandboxBackend
from sandbox_worker.evaluation import EvalConfig
from services.protocol.instance import SWEInstance

CONFIG = EvalConfig(test_timeout_s=300)


def _validate(backend: SandboxBackend, chosen: list[SWEInstance], node: str) -> None:
    progress = io.StringIO()
    results = validate.validate_all(
        backend, chosen, images.instance_image, config=CONFIG, progress=progress, node=node
    )
    table = validate.format_table(results)
    assert all(result.ok for result in results), table
    assert f"{len(chosen)}/{len(chosen)} instances valid" in table
    for result in results:
        gold = next(c.report for c in result.checks if c.name == "gold")
        assert gold is not None and gold.apply_method == "git apply --verbose"
        assert "pytest-7" in gold.log_tail  # ran Debian's pytest inside the image


def test_every_instance_through_bwrap(
    eval_backends: dict[str, SandboxBackend], instances: dict[str, SWEInstance], node: str
) -> None:
    _validate(eval_backends["bwrap"], list(instances.values()), node)


def test_instances_through_docker(
    eval_backends: dict[str, SandboxBackend], instances: dict[str, SWEInstance], node: str
) -> None:
    chosen = [instances["swerl__tinyini-1"], instances["swerl__strkit-3"]]
    _validate(eval_backends["docker"], chosen, node)


def test_cli(eval_backends: dict[str, SandboxBackend]) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandbox_worker.validate",
            "--backend",
            "bwrap",
            "--only",
            "swerl__spanlib-2",
            "--node",
            "ev-cli",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[1/1] swerl__spanlib-2: gold ok, empty ok, tampered ok, broken ok" in res.stderr
    assert "1/1 instances valid" in res.stdout
    assert eval_backends["bwrap"].list_sandboxes("ev-cli") == []
