"""Run a training composer (``services.toy_train`` / ``services.swe_train``) under a budget and
read what its run wrote."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO_ROOT


def run_composer(module: str, args: list[str], log: Path, budget_s: float,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
    """``python -m module args`` from the repository root, its output in ``log``; the test
    fails (with the log's tail) when it exits non-zero or outlives ``budget_s`` (then it gets
    SIGTERM, on which the composer stops its whole stack)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO_ROOT,
                                stdout=out, stderr=subprocess.STDOUT, env=env)  # fmt: skip
        try:
            code = proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
            pytest.fail(f"over the budget of {budget_s:.0f} s: {log.read_text()[-3000:]}")
    assert code == 0, log.read_text()[-3000:]


def run_files(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows of ``run_dir/train/metrics.jsonl`` and ``batches.jsonl``."""
    train = run_dir / "train"
    metrics = [json.loads(line) for line in (train / "metrics.jsonl").read_text().splitlines()]
    batches = [json.loads(line) for line in (train / "batches.jsonl").read_text().splitlines()]
    return metrics, batches
