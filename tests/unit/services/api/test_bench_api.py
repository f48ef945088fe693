"""Smoke test of bench/bench_api.py: a tiny run reports every operation and no errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.slow


def test_a_tiny_run_reports_latencies(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    argv = ["--clients", "8", "--requests", "5", "--seed-jobs", "3", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "bench/bench_api.py", *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["errors"] == 0 and figures["all"]["n"] == 40
    assert 0 < figures["all"]["p50_ms"] <= figures["all"]["p99_ms"] <= figures["all"]["max_ms"]
    assert {"submit", "get", "list"} <= set(figures)
