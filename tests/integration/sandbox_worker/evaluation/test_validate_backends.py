"""The mini task set validated through the real sandbox backends (the acceptance check).

bwrap: every instance, all four checks (gold resolves, empty does not and shows the base
state, a tampered protected test file is restored, a broken patch does not apply).
docker: the same checks for one instance whose test patch modifies a test file and one whose
test patch creates one; plus the CLI end to end.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

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


def test_cli_reports_bad_rows_and_skips_denied_ones(
    eval_backends: dict[str, SandboxBackend], instances: dict[str, SWEInstance], tmp_path: Path
) -> None:
    """Collect-all: a bad gold patch and a bad JSON line are those rows' failures, the good
    row is still validated, and a deny-listed row is skipped with its reason."""
    good = instances["swerl__spanlib-2"].to_swebench_dict()
    denied = instances["swerl__tinyini-1"].to_swebench_dict()
    bad_patch = {**good, "instance_id": "acme__broken-1", "patch": "garbage\n"}
    rows = [json.dumps(bad_patch), "{oops", json.dumps(good), json.dumps(denied)]
    data = tmp_path / "tasks.jsonl"
    data.write_text("\n".join(rows) + "\n")
    deny = tmp_path / "deny.txt"
    deny.write_text("swerl__tinyini-1  # flaky here\n")
    cmd = [sys.executable, "-m", "sandbox_worker.validate", "--backend", "bwrap"]
    cmd += ["--instances", str(data), "--deny", str(deny), "--node", "ev-collect"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "swerl__tinyini-1: skipped, on the deny-list (flaky here)" in res.stderr
    assert "[1/1] swerl__spanlib-2: gold ok, empty ok, tampered ok, broken ok" in res.stderr
    assert "1/3 instances valid" in res.stdout
    assert f"acme__broken-1 load: {data}:line 1 (instance 'acme__broken-1'): field 'patch'" in (
        res.stdout
    )
    assert f"<line 2> load: {data}:line 2: invalid JSON" in res.stdout
    assert "Traceback" not in res.stderr
    bad = subprocess.run(
        [*cmd[:-4], "--deny", str(tmp_path / "none.txt")], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "no such deny-list file" in bad.stderr, bad.stderr
