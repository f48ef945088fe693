"""bench/bench_demo_reliability.py: one seed's row from its metrics and eval rows, the table,
and its argument checks (the runs themselves take minutes: docs/training.md has the table)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.bench_scripts import load_bench
from tests.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "bench" / "bench_demo_reliability.py"


def load():
    return load_bench("bench_demo_reliability")


def metrics(rewards: list[float], switch: int | None) -> list[dict]:
    rows = []
    for step, reward in enumerate(rewards, 1):
        row = {"step": step, "reward/mean": reward}
        if switch is not None and step >= switch:
            row["gate/switch_step"] = float(switch)
        rows.append(row)
    return rows


def test_a_seed_passes_only_with_both_the_training_and_the_held_out_reward_at_the_bar() -> None:
    bench = load()
    rewards = [0.2] * 5 + [0.5] * 10 + [0.8] * 5
    evals = [{"step": 10, "eval/reward_mean": 0.5}, {"step": 20, "eval/reward_mean": 0.75,
                                                      "eval/reward_se": 0.04,
                                                      "eval/trajectories": 122.0,
                                                      "eval/shifted/reward_mean": 0.3}]  # fmt: skip
    row = bench.run_figures(metrics(rewards, 12), evals, t_max=20, bar=0.7)
    assert (row["reward_first5"], row["reward_last5"]) == (pytest.approx(0.2), pytest.approx(0.8))
    assert (row["switch_step"], row["gate_opened_by_itself"]) == (12, True)
    assert (row["held_out"], row["shifted"], row["ok"]) == (0.75, 0.3, True)
    # held-out under the bar, or no evaluation at all: not a pass
    assert not bench.run_figures(metrics(rewards, 12), evals[:1], 20, 0.7)["ok"]
    assert not bench.run_figures(metrics(rewards, 12), [], 20, 0.7)["ok"]
    # a switch at t_max came from the cap, not from the gate
    assert not bench.run_figures(metrics(rewards, 20), evals, 20, 0.7)["gate_opened_by_itself"]
    assert not bench.run_figures(metrics(rewards, None), evals, 20, 0.7)["gate_opened_by_itself"]
    assert bench.run_figures([], evals, 20, 0.7) == {"ok": False, "error": "no metrics rows"}


def test_the_table_counts_the_seeds_that_pass() -> None:
    bench = load()
    good = bench.run_figures(metrics([0.2] * 5 + [0.9] * 5, 4),
                             [{"step": 10, "eval/reward_mean": 0.9}], 20, 0.7)  # fmt: skip
    text = bench.table({0: good, 1: {"ok": False, "error": "exit 1: seed1.out"}})
    assert "1 of 2 seeds reach the bar" in text
    assert "exit 1: seed1.out" in text and "0 | 0.200 | 0.900 | 4 (yes)" in text


def test_bad_seeds_are_refused() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--seeds", "a,b"], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert proc.returncode == 2 and "--seeds must be integers" in proc.stderr
