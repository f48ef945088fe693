"""bench/bench_async.py runs end to end in quick mode (real Redis, a simulated
``python -m sandbox_worker``, the manager's dispatch loop, the driver's collector and phase
controller) and reports every figure. Wall-clock figures are not asserted (noisy machines):
the test checks the fields, their types, and what the bench's own setup fixes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.slow  # starts Redis and a worker process

SCRIPT = REPO_ROOT / "bench" / "bench_async.py"
FIELDS = {
    "measured_steps", "wall_per_step_s", "idle_per_step_s", "idle_share", "lag_mean",
    "lag_max", "switch_step", "submitted", "trained", "over_lag", "cancelled_tasks",
}  # fmt: skip


def test_quick_bench_reports_each_algorithm_and_the_ratios(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out), "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,  # measured about 15 s on the loaded 2-core machine
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    figures = json.loads(out.read_text())
    setting = figures["setting"]
    assert [c["train_s"] for c in figures["runs"]] == [0.1, 0.3]  # quick mode's two
    for comparison in figures["runs"]:
        check_comparison(setting, comparison)
    assert "train step 0.1 s:" in run.stdout and "train step 0.3 s:" in run.stdout
    assert run.stdout.count("li2sao / grpo: wall per step") == 2


def check_comparison(setting: dict, figures: dict) -> None:
    batch = setting["prompts"] * setting["group_size"]
    assert setting["quick"] is True and setting["batch"] == batch
    assert "train_s" not in setting
    algos = figures["algorithms"]
    assert set(algos) == {"grpo", "li2sao", "lisao"}
    for name, r in algos.items():
        assert set(r) == FIELDS, name
        assert r["measured_steps"] == setting["steps"]
        assert r["wall_per_step_s"] > 0 and math.isfinite(r["wall_per_step_s"])
        assert 0 <= r["idle_per_step_s"] <= r["wall_per_step_s"]
        assert 0 <= r["idle_share"] <= 1
        assert r["lag_mean"] >= 0 and r["lag_max"] <= setting["max_policy_lag"]
    # same trajectories per step: P x n groups for GRPO, B = P x n singles for the others
    steps = figures["steps"]
    for name, skip in (("grpo", 1), ("li2sao", 3), ("lisao", 1)):
        assert len(steps[name]) == skip + setting["steps"], name
        assert algos[name]["trained"] == batch * len(steps[name]), name
    # Li2SAO: bootstrap, the drained prefetched batch, then single; the switch after step 1
    assert [r["phase"] for r in steps["li2sao"]] == ["bootstrap", "draining"] + ["single"] * (
        1 + setting["steps"]
    )
    assert algos["li2sao"]["switch_step"] == 1 and algos["li2sao"]["cancelled_tasks"] >= 0
    assert algos["grpo"]["switch_step"] is None and algos["lisao"]["switch_step"] is None
    assert {r["phase"] for r in steps["grpo"]} == {"groups"}
    assert {r["phase"] for r in steps["lisao"]} == {"single"}
    ratios = figures["ratios"]
    for key in ("li2sao_over_grpo_wall", "lisao_over_grpo_wall", "li2sao_faster_than_grpo_pct"):
        assert math.isfinite(ratios[key])
