"""bench/bench_toy_steps.py: the figures it computes from a run's metrics rows, and its
argument checks (the runs themselves take minutes: docs/training.md has measured figures)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.bench_scripts import load_bench
from tests.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "bench" / "bench_toy_steps.py"


def load():
    return load_bench("bench_toy_steps")


def test_figures_skip_the_warm_up_steps_and_give_steps_per_minute() -> None:
    rows = [{"time/step": 30.0, "reward/mean": 0.0}] + [
        {"time/step": s, "time/train": s - 1.0, "time/wait_rollouts": 0.5, "reward/mean": 0.5}
        for s in (2.0, 4.0)
    ]
    f = load().figures(rows, skip=1)
    assert f["steps"] == 2.0 and f["step_s"] == 3.0 and f["steps_per_minute"] == 20.0
    assert (f["train_s"], f["wait_rollouts_s"], f["publish_s"]) == (2.0, 0.5, 0.0)
    assert f["reward_mean"] == 0.5
    with pytest.raises(ValueError, match="no step after the first 3"):
        load().figures(rows, skip=3)


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--algorithms", "grpo,ppo"], "unknown algorithms ['ppo']"),
     (["--steps", "3", "--skip", "4"], "need --steps > --skip")],
)  # fmt: skip
def test_bad_arguments_exit_2_before_anything_runs(args: list[str], needle: str) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
