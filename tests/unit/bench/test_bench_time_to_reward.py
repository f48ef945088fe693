"""bench/bench_time_to_reward.py: the curves, times to threshold, gate switches and summaries
it computes from runs' metrics rows, its figure and its argument checks (the runs themselves
take minutes to hours: docs/training.md has measured figures)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "bench" / "bench_time_to_reward.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_time_to_reward", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(step: int, reward: float, t: float = 2.0, **kw: Any) -> dict[str, Any]:
    return {"step": step, "reward/mean": reward, "time/step": t, "phase": "bootstrap", **kw}


def li2sao_rows() -> list[dict[str, Any]]:
    """A gated run switching at step 4 (t_max 30): lag 2 / ratio 1 before, 1 / 0.5 after."""
    rows = []
    for step, reward in enumerate([0.2, 0.3, 0.5, 0.6, 0.75, 0.8, 0.9, 0.9], start=1):
        phase = "bootstrap" if step <= 4 else ("draining" if step == 5 else "single")
        before = step <= 4
        r = row(step, reward, phase=phase, **{"lag/mean": 2.0 if before else 1.0,
                                               "lag/off_policy_token_ratio": 1.0 if before else 0.5,
                                               "gate/counter": float(min(step, 4)),
                                               "gate/e_bar": 0.1 * step})  # fmt: skip
        if step >= 4:
            r["gate/switch_step"] = 4.0
        rows.append(r)
    return rows


def test_metric_rows_keep_step_rows_in_order(bench: ModuleType) -> None:
    lines = [json.dumps(row(2, 0.5)), "not json", json.dumps({"eval": 1}), json.dumps(row(1, 0.1))]
    assert [r["step"] for r in bench.metric_rows(lines)] == [1, 2]


def test_the_curve_runs_on_cumulative_step_time(bench: ModuleType) -> None:
    curve = bench.reward_curve([row(1, 0.1, 5.0), row(2, 0.2, 3.0), row(3, float("nan"), 2.0)])
    assert [p["t_s"] for p in curve] == [5.0, 8.0, 10.0]
    assert [p["reward"] for p in curve] == [0.1, 0.2, None]  # NaN: missing


def test_rolling_mean_needs_a_full_window(bench: ModuleType) -> None:
    assert bench.rolling_mean([1.0, 2.0, 3.0, 4.0], 3) == [None, None, 2.0, 3.0]
    assert bench.rolling_mean([1.0, None, 3.0, 4.0, 5.0], 2) == [None, None, None, 3.5, 4.5]
    with pytest.raises(ValueError, match="window"):
        bench.rolling_mean([1.0], 0)


def test_time_to_threshold_is_the_first_smoothed_crossing(bench: ModuleType) -> None:
    # one lucky step (0.9 at step 2) does not count; the rolling mean crosses 0.7 at step 6
    rewards = [0.2, 0.9, 0.3, 0.6, 0.7, 0.8, 0.9]
    curve = bench.reward_curve([row(i + 1, r, 10.0) for i, r in enumerate(rewards)])
    assert bench.time_to_threshold(curve, 0.7, window=3) == (60.0, 6)
    assert bench.time_to_threshold(curve, 0.7, window=1) == (20.0, 2)
    assert bench.time_to_threshold(curve, 0.95, window=3) is None


def test_switch_detection_and_who_opened_the_gate(bench: ModuleType) -> None:
    rows = li2sao_rows()
    info = bench.switch_info(rows, t_max=30)
    assert info["gated"] and info["switch_step"] == 4 and info["opened_by_itself"] is True
    assert info["counter"] == 4.0 and info["e_bar"] == pytest.approx(0.8)
    # switched at t_max: by the cap
    assert bench.switch_info(rows, t_max=4)["opened_by_itself"] is False
    # no gate/switch_step logged: the first draining row tells (switched the step before)
    bare = [{k: v for k, v in r.items() if k != "gate/switch_step"} for r in rows]
    assert bench.switch_info(bare, t_max=30)["switch_step"] == 4
    # a gated run that never switched, and an algorithm without a gate
    assert bench.switch_info(rows[:3], t_max=30)["switch_step"] is None
    grpo = bench.switch_info([row(1, 0.1), row(2, 0.2, phase="groups")], t_max=None)
    assert not grpo["gated"] and grpo["switch_step"] is None and grpo["opened_by_itself"] is None


def test_lag_before_and_after_the_switch(bench: ModuleType) -> None:
    split = bench.lag_split(li2sao_rows(), 4)
    assert split["before"] == {"steps": 4.0, "lag": 2.0, "off_policy": 1.0}
    assert split["after"] == {"steps": 4.0, "lag": 1.0, "off_policy": 0.5}
    whole = bench.lag_split(li2sao_rows(), None)
    assert whole["after"] is None and whole["before"]["steps"] == 8.0


def test_summaries_median_over_seeds_and_ratio_to_grpo(bench: ModuleType) -> None:
    run = bench.summarize_run(li2sao_rows(), threshold=0.7, window=3, t_max=30)
    assert (
        run["time_to_threshold_s"] == 12.0 and run["step_to_threshold"] == 6
    )  # (0.6 + 0.75 + 0.8) / 3
    assert run["gate"]["switch_t_s"] == 8.0 and run["loop_time_s"] == 16.0
    assert run["reward_last5"] == pytest.approx(0.79)
    # a run that never reaches the threshold counts as infinitely slow in the median
    assert bench.median_time([10.0, None, 30.0]) == 30.0
    assert bench.median_time([10.0, None, None]) is None
    assert bench.median_time([]) is None

    def fake(t: float | None) -> dict[str, Any]:
        gate = {"gated": False, "switch_step": None, "opened_by_itself": None}
        return {"time_to_threshold_s": t, "reward_last5": 0.8, "gate": gate}

    grpo = bench.summarize_algorithm({"0": fake(100.0), "1": fake(120.0), "2": {"error": "x"}})
    assert grpo["time_to_threshold_s"] == 110.0 and (grpo["runs"], grpo["failed"]) == (2, 1)
    li2sao = bench.summarize_algorithm({"0": run})
    assert li2sao["switch_steps"] == [4] and li2sao["opened_by_itself"] == [True]
    ratios = bench.ratios_to(
        {"grpo": grpo, "li2sao": li2sao, "lisao": {"time_to_threshold_s": None}}
    )
    assert ratios == {"grpo": 1.0, "li2sao": pytest.approx(110.0 / 12.0), "lisao": None}


def test_the_latency_reaches_the_worker_as_its_config_variables(bench: ModuleType) -> None:
    from sandbox_worker.config import WorkerConfig
    from services.config import load_config

    env = bench.latency_env(3.0, 30.0, 60.0)
    latency = load_config(WorkerConfig, section="worker", environ=env).rollout.toy_tool_latency
    assert (latency.median_s, latency.p99, latency.max_s) == (3.0, 30.0, 60.0)
    off = bench.latency_env(0.0, 0.0)
    assert not load_config(
        WorkerConfig, section="worker", environ=off
    ).rollout.toy_tool_latency.enabled
    with pytest.raises(ValueError, match="median"):
        bench.latency_env(3.0, 1.0)


def test_the_gate_cap_comes_from_the_config(bench: ModuleType, tmp_path: Path) -> None:
    assert bench.gate_t_max(bench.CONFIGS / "toy_grpo.yaml") is None
    t_max = bench.gate_t_max(bench.CONFIGS / "toy_li2sao.yaml")
    assert isinstance(t_max, int) and t_max > 0
    bare = tmp_path / "c.yaml"
    bare.write_text("trainer: {algorithm: li2sao}\ntrain: {}\n")
    assert bench.gate_t_max(bare) == bench.GATE_T_MAX_DEFAULT


def test_the_figure_and_the_report(bench: ModuleType, tmp_path: Path) -> None:
    grpo_rows = [row(i, min(1.0, 0.1 * i + 0.02), 4.0, phase="groups") for i in range(1, 10)]
    results = {
        "li2sao": {"0": bench.summarize_run(li2sao_rows(), 0.7, 3, 30)},
        "grpo": {"0": bench.summarize_run(grpo_rows, 0.7, 3, None), "1": {"error": "exit 1\nx"}},
    }
    summary = {n: bench.summarize_algorithm(r) for n, r in results.items()}
    png = tmp_path / "ttr.png"
    bench.plot(results, 0.7, 3, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = bench.report(results, summary, 0.7, 3)
    assert "grpo s1" in text and "failed: exit 1" in text
    assert "2.67x" in text  # GRPO reaches 0.7 at 32 s (step 8), Li2SAO at 12 s


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--algorithms", "ppo"], "unknown algorithms"),
        (["--seeds", "a"], "comma-separated integers"),
        (["--steps", "2"], "--window"),
        (["--latency-median-s", "5", "--latency-p99-s", "1"], "latency"),
    ],
)
def test_bad_arguments_are_refused(bench: ModuleType, argv: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True)
    assert proc.returncode == 2 and message in proc.stderr


def test_quick_defaults_and_explicit_options(bench: ModuleType) -> None:
    quick = bench.parse_args(["--quick"])
    assert (quick.seeds, quick.steps, quick.latency_median_s, quick.latency_p99_s) == (
        [0],
        30,
        1.0,
        10.0,
    )
    assert quick.algorithms == ["li2sao", "lisao", "grpo"]
    full = bench.parse_args(["--latency-median-s", "2", "--algorithms", "grpo,pact"])
    assert (full.seeds, full.steps, full.latency_p99_s) == ([0, 1, 2], None, 20.0)
    assert full.algorithms == ["grpo", "pact"]
    assert math.isclose(bench.parse_args(["--quick", "--steps", "6"]).steps, 6)
