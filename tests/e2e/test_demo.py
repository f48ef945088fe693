"""`make demo`'s main job, end to end: real Redis, engines, adapter, docker worker, OpenHands.

The demo exists to show a reward signal and a group with mixed rewards: the adapter places
sample 0 of every group on the scripted engine (it replays the gold patch: reward 1) and
sample 1 on the sampling one (the random tiny model: reward 0), whatever the timing. The test
reads the demo's ``--json`` summary.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docker import build_task_images, ensure_dockerd

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_demo_shows_a_reward_signal_and_a_mixed_group(tmp_path: Path) -> None:
    ensure_dockerd()
    build_task_images()
    run_dir = tmp_path / "run"
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        [sys.executable, "-m", "services.demo", "--limit", "1", "--samples", "2",
         "--max-steps", "6", "--run-dir", str(run_dir), "--timeout", "900", "--json", str(out)],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    trajectories = summary["trajectories"]
    assert len(trajectories) == 2
    # Every trajectory finished as a trainable outcome with a 0/1 reward (nothing aborted).
    assert all(t["status"] in ("completed", "timeout", "error") for t in trajectories)
    assert all(t["reward"] in (0.0, 1.0) for t in trajectories)

    # Deterministic placement: sample 0 on the scripted engine, sample 1 on the sampling one.
    placed = {t["sample_index"]: t["engines"] for t in trajectories}
    assert placed == {0: ["scripted"], 1: ["sampling"]}, trajectories

    # The reward signal: the scripted gold patch resolves, the random policy does not.
    rewards = {t["sample_index"]: t["reward"] for t in trajectories}
    assert rewards == {0: 1.0, 1: 0.0}, trajectories

    # A group with mixed rewards, from the trajectories themselves and in the summary.
    groups: dict[str, set[float]] = {}
    for t in trajectories:
        groups.setdefault(t["group_id"], set()).add(t["reward"])
    mixed = sorted(g for g, r in groups.items() if r == {0.0, 1.0})
    assert len(mixed) == 1
    assert summary["mixed_groups"] == mixed
    assert summary["groups"] == {g: [rewards[0], rewards[1]] for g in mixed}

    # The per-instance table: the one instance, resolved by 1 of its 2 samples, so pass@2 = 1.
    [instance] = summary["instances"]
    assert instance["instance_id"] == trajectories[0]["instance_id"]
    assert (instance["samples"], instance["resolved"], instance["pass_at_k"]) == (2, 1, 1.0)
    assert instance["instance_id"] in proc.stdout and "pass@k" in proc.stdout
    assert "using 1 of " in proc.stdout  # the --limit is said, not silent

    objective = summary["objective"]
    # The trainer's batch keeps the scripted engine's trajectory out of the loss: only the
    # sampled one is in it (a group of one), the replayed one is counted.
    assert (objective["n_trajectories"], objective["scripted_trajectories"]) == (1, 1)
    assert objective["mixed_groups"] == 0
    assert objective["n_action_tokens"] > 0
    # The tiny model's plain forward pass reproduces the engine's behaviour logprobs, on every
    # generated token (the replayed ones included).
    assert objective["n_checked_tokens"] > objective["n_action_tokens"]
    assert objective["max_abs_logprob_diff"] < 1e-5
    # Every service stopped and left its log behind.
    for name in ("redis", "engine-scripted", "engine-random", "adapter", "worker"):
        assert (run_dir / f"{name}.log").exists()
