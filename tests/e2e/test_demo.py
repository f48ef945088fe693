"""`make demo`'s main job, end to end: real Redis, engines, adapter, docker worker, OpenHands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docker import build_task_images, ensure_dockerd

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_demo_runs_the_whole_loop(tmp_path: Path) -> None:
    ensure_dockerd()
    build_task_images()
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "services.demo", "--limit", "1", "--samples", "2",
         "--max-steps", "6", "--run-dir", str(run_dir), "--timeout", "900"],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trajectories = [x for x in lines if x["kind"] == "trajectory"]
    assert len(trajectories) == 2
    # Every trajectory finished as a trainable outcome with a 0/1 reward (nothing aborted).
    assert all(t["status"] in ("completed", "timeout", "error") for t in trajectories)
    assert all(t["reward"] in (0.0, 1.0) for t in trajectories)
    (objective,) = [x for x in lines if x["kind"] == "objective"]
    assert objective["n_trajectories"] == 2
    assert objective["n_action_tokens"] > 0
    # The tiny model's plain forward pass reproduces the engine's behaviour logprobs.
    assert objective["max_abs_logprob_diff"] < 1e-5
    # Every service stopped and left its log behind.
    for name in ("redis", "engine-scripted", "engine-random", "adapter", "worker"):
        assert (run_dir / f"{name}.log").exists()
