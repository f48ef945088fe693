"""Reward against wall-clock time of Li2SAO, LiSAO and GRPO on the toy task, rollout-bound.

Usage (from the repository root)::

    .venv/bin/python bench/bench_time_to_reward.py                  # 3 algorithms x seeds 0,1,2
    .venv/bin/python bench/bench_time_to_reward.py --quick          # 1 seed, 30 steps, 1 s
    .venv/bin/python bench/bench_time_to_reward.py --algorithms grpo,li2sao --seeds 0 \\
        --steps 30 --latency-median-s 3 --latency-p99-s 30 --out runs/ttr --json ttr.json

For each algorithm and seed, one after the other on this machine, ``python -m
services.toy_train --config trainer/configs/toy_<algorithm>.yaml --seed S`` runs the whole stack
(Redis, a reference engine, the adapter, a toy worker with ``--slots`` slots, the trainer with a
disk publish every step), with the toy runner's **tool latency model** switched on through the
environment the worker inherits (``SWERL_WORKER__ROLLOUT__TOY_TOOL_LATENCY__*``; docs/toy-task.md
"Latency model"): every trajectory waits a lognormal time (default median 3 s, p99 30 s, the
"SWE-like" shape) before its second turn, so agent steps, not the train step, dominate each
step, as on a GPU cluster. The held-out evaluation is off (``SWERL_TRAIN__EVAL_INTERVAL=0``: its
rollouts would take worker slots in Li2SAO's config only); every other setting is the config's.

From each run's ``DIR/train/metrics.jsonl`` it builds the reward curve against the training
loop's wall-clock time (the cumulative ``time/step``; the stack's start and the trainer's
start-up are not counted, the same for every algorithm), the time the rolling mean of the reward
over ``--window`` steps first reaches ``--threshold`` (median over seeds; a run that never
reaches it counts as infinitely slow), the switch of Li2SAO's readiness gate (``gate/switch_step``;
opened *by itself* when it switched before the config's ``train.gate.t_max``, else by the cap),
and the policy lag and off-policy token ratio before and after the switch. It prints a table
(times to threshold and their ratio to GRPO's: > 1 means sooner than GRPO), writes
``OUT/time_to_reward.png`` (one panel per algorithm and an overlay, the switch marked; the lag
and off-policy ratio over time below) and with ``--json FILE`` the summary
(``time_to_threshold_s`` per algorithm and every run's details). Nothing here asserts; measured
figures belong in docs/training.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "trainer" / "configs"
ALGORITHMS = ("li2sao", "lisao", "grpo")  # each runs trainer/configs/toy_<name>.yaml
OPTIONAL = ("pact", "srppo")  # also accepted by --algorithms
COLOURS = {"li2sao": "tab:blue", "lisao": "tab:green", "grpo": "tab:red", "pact": "tab:purple",
           "srppo": "tab:orange"}  # fmt: skip
GATE_T_MAX_DEFAULT = 150  # trainer.loop.config.GateSettings.t_max
LATENCY_ENV = "SWERL_WORKER__ROLLOUT__TOY_TOOL_LATENCY__"
# --quick: one seed and 30 steps (Li2SAO's gate can open by itself from step 9, t_max 30), the
# latency scaled down to median 1 s / p99 10 s: the slowest of a group batch's 64 draws (about
# 8 s) still outlasts the 2-3 s train step of a 2-core machine, so the run stays rollout-bound
QUICK = {"steps": 30, "seeds": [0], "median_s": 1.0, "p99_s": 10.0}


# -- the environment of a run ------------------------------------------------------------------


def latency_env(median_s: float, p99_s: float | None, max_s: float | None = None) -> dict[str, str]:
    """The toy worker's latency model as environment overrides (``median_s`` 0: off)."""
    if median_s < 0 or (p99_s is not None and p99_s < median_s):
        raise ValueError(f"need 0 <= median ({median_s}) <= p99 ({p99_s})")
    env = {LATENCY_ENV + "MEDIAN_S": f"{median_s:g}"}
    if median_s == 0:
        return env
    if p99_s is not None:
        env[LATENCY_ENV + "P99_S"] = f"{p99_s:g}"
    if max_s is not None:
        env[LATENCY_ENV + "MAX_S"] = f"{max_s:g}"
    return env


def gate_t_max(config: Path) -> int | None:
    """``train.gate.t_max`` of a config whose algorithm has the readiness gate (Li2SAO), the
    default when the file does not set it; None for algorithms without a gate."""
    data = yaml.safe_load(config.read_text()) or {}
    if (data.get("trainer") or {}).get("algorithm") != "li2sao":
        return None
    gate = (data.get("train") or {}).get("gate") or {}
    return int(gate.get("t_max", GATE_T_MAX_DEFAULT))


# -- pure figures from metrics rows ------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(float(value)) else float(value)


def metric_rows(lines: Sequence[str]) -> list[dict[str, Any]]:
    """The step rows of a metrics.jsonl (rows without ``step`` and unreadable lines skipped),
    in step order."""
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return sorted(rows, key=lambda r: r["step"])


def reward_curve(rows: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """Per step: ``step``, ``t_s`` (the loop's wall-clock at the step's end: cumulative
    ``time/step``), ``reward`` (``reward/mean``), ``lag`` and ``off_policy`` (None where a row
    lacks them)."""
    t = 0.0
    curve = []
    for row in rows:
        t += _number(row.get("time/step")) or 0.0
        curve.append({
            "step": row["step"],
            "t_s": round(t, 3),
            "reward": _number(row.get("reward/mean")),
            "lag": _number(row.get("lag/mean")),
            "off_policy": _number(row.get("lag/off_policy_token_ratio")),
            "phase": row.get("phase"),
        })  # fmt: skip
    return curve


def rolling_mean(values: Sequence[float | None], window: int) -> list[float | None]:
    """The mean of each full window of ``window`` values ending here (None before the first
    full window, or where the window holds a missing value)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out: list[float | None] = []
    for i in range(len(values)):
        part = values[i + 1 - window : i + 1] if i + 1 >= window else []
        full = len(part) == window and all(v is not None for v in part)
        out.append(statistics.fmean(v for v in part if v is not None) if full else None)
    return out


def time_to_threshold(
    curve: Sequence[dict[str, Any]], threshold: float, window: int = 3
) -> tuple[float, int] | None:
    """(loop time, step) at which the rolling mean of the reward first reaches ``threshold``;
    None when it never does."""
    smooth = rolling_mean([p["reward"] for p in curve], window)
    for point, value in zip(curve, smooth, strict=True):
        if value is not None and value >= threshold:
            return float(point["t_s"]), int(point["step"])
    return None


def switch_info(rows: Sequence[dict[str, Any]], t_max: int | None) -> dict[str, Any]:
    """The readiness gate of a run: ``gated`` (its rows log ``gate/*``), ``switch_step`` (None:
    no switch within the run), ``opened_by_itself`` (switched before ``t_max``; None without a
    switch or a gate), the last ``e_bar`` / ``a_bar`` / ``counter`` logged."""
    gated = any(any(k.startswith("gate/") for k in r) for r in rows)
    switch = None
    for row in rows:
        logged = _number(row.get("gate/switch_step"))
        if logged is not None:
            switch = int(logged)
            break
        if row.get("phase") in ("draining", "single") and gated:  # switched the step before
            switch = int(row["step"]) - 1
            break
    info: dict[str, Any] = {"gated": gated, "switch_step": switch, "opened_by_itself": None}
    if gated and switch is not None and t_max is not None:
        info["opened_by_itself"] = switch < t_max
    last = rows[-1] if rows else {}
    for key in ("e_bar", "a_bar", "counter"):
        info[key] = _number(last.get(f"gate/{key}"))
    return info


def lag_split(rows: Sequence[dict[str, Any]], switch_step: int | None) -> dict[str, Any]:
    """Mean ``lag/mean`` and ``lag/off_policy_token_ratio`` over the steps up to the switch
    (``before``) and after it (``after``; None without a switch)."""

    def means(part: Sequence[dict[str, Any]]) -> dict[str, float | None] | None:
        if not part:
            return None
        out: dict[str, float | None] = {"steps": float(len(part))}
        for name, key in (("lag", "lag/mean"), ("off_policy", "lag/off_policy_token_ratio")):
            values = [v for r in part if (v := _number(r.get(key))) is not None]
            out[name] = statistics.fmean(values) if values else None
        return out

    if switch_step is None:
        return {"before": means(rows), "after": None}
    before = [r for r in rows if r["step"] <= switch_step]
    after = [r for r in rows if r["step"] > switch_step]
    return {"before": means(before), "after": means(after)}


def summarize_run(
    rows: Sequence[dict[str, Any]], threshold: float, window: int, t_max: int | None
) -> dict[str, Any]:
    """One run's figures: steps, loop time, last-5 reward, time and step to threshold, the
    gate's switch, lag before and after it, and the curve."""
    curve = reward_curve(rows)
    reached = time_to_threshold(curve, threshold, window)
    gate = switch_info(rows, t_max)
    rewards = [p["reward"] for p in curve if p["reward"] is not None]
    switch_t = next((p["t_s"] for p in curve if p["step"] == gate["switch_step"]), None)
    return {
        "steps": len(curve),
        "loop_time_s": curve[-1]["t_s"] if curve else 0.0,
        "reward_last5": statistics.fmean(rewards[-5:]) if rewards else None,
        "time_to_threshold_s": reached[0] if reached else None,
        "step_to_threshold": reached[1] if reached else None,
        "gate": {**gate, "switch_t_s": switch_t},
        "lag": lag_split(rows, gate["switch_step"]),
        "curve": curve,
    }


def median_time(times: Sequence[float | None]) -> float | None:
    """The median over seeds of the times to threshold, a run that never reached it counting
    as infinitely slow (None when the median itself is such a run, or there are no runs)."""
    if not times:
        return None
    value = statistics.median(math.inf if t is None else t for t in times)
    return None if math.isinf(value) else value


def summarize_algorithm(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Over the seeds of one algorithm (runs that failed carry ``error`` and are left out)."""
    ok = {seed: r for seed, r in runs.items() if "error" not in r}
    times = [r["time_to_threshold_s"] for r in ok.values()]
    switches = [r["gate"]["switch_step"] for r in ok.values() if r["gate"]["gated"]]
    by_itself = [r["gate"]["opened_by_itself"] for r in ok.values() if r["gate"]["gated"]]
    last5 = [r["reward_last5"] for r in ok.values() if r["reward_last5"] is not None]
    return {
        "time_to_threshold_s": median_time(times),
        "reached": sum(t is not None for t in times),
        "runs": len(ok),
        "failed": len(runs) - len(ok),
        "reward_last5": statistics.fmean(last5) if last5 else None,
        "switch_steps": switches,
        "opened_by_itself": by_itself,
    }


def ratios_to(summary: dict[str, dict[str, Any]], base: str = "grpo") -> dict[str, float | None]:
    """``base``'s median time to threshold over each algorithm's (> 1: sooner than ``base``)."""
    ref = summary.get(base, {}).get("time_to_threshold_s")
    out: dict[str, float | None] = {}
    for name, s in summary.items():
        t = s.get("time_to_threshold_s")
        out[name] = ref / t if ref and t else None
    return out


# -- running ---------------------------------------------------------------------------------


def run_one(
    algorithm: str, seed: int, steps: int | None, slots: int, env: dict[str, str], out: Path
) -> tuple[list[dict[str, Any]], float]:
    """One toy run; its metrics rows and its wall-clock seconds with the stack (raises with
    the log's tail on failure)."""
    run_dir = out / f"{algorithm}-seed{seed}"
    config = CONFIGS / f"toy_{algorithm}.yaml"
    cmd = [sys.executable, "-m", "services.toy_train", "--config", str(config),
           "--run-dir", str(run_dir), "--seed", str(seed), "--slots", str(slots)]  # fmt: skip
    cmd += ["--steps", str(steps)] if steps is not None else []
    t0 = time.monotonic()
    with open(out / f"{algorithm}-seed{seed}.out", "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=log,
                              stderr=subprocess.STDOUT)  # fmt: skip
    wall = time.monotonic() - t0
    path = run_dir / "train" / "metrics.jsonl"
    if proc.returncode != 0 or not path.is_file():
        trainer_log = run_dir / "trainer.log"
        tail = trainer_log.read_text()[-2000:] if trainer_log.exists() else ""
        raise RuntimeError(f"{algorithm} seed {seed}: exit {proc.returncode}\n{tail}")
    return metric_rows(path.read_text().splitlines()), wall


def plot(results: dict[str, dict[str, Any]], threshold: float, window: int, path: Path) -> None:
    """Reward against loop time: one panel per algorithm (each seed, raw and smoothed, the
    switch dashed) and an overlay (smoothed); below, the lag and off-policy ratio over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig = plt.figure(figsize=(4.2 * (len(names) + 1), 7.5))
    grid = fig.add_gridspec(2, 2 * (len(names) + 1))
    overlay = fig.add_subplot(grid[0, 2 * len(names) :])
    lag_ax = fig.add_subplot(grid[1, : len(names) + 1])
    off_ax = fig.add_subplot(grid[1, len(names) + 1 :])
    for i, name in enumerate(names):
        ax = fig.add_subplot(grid[0, 2 * i : 2 * i + 2], sharey=overlay)
        colour = COLOURS.get(name, f"C{i}")
        labelled = False
        for run in results[name].values():
            if "error" in run:
                continue
            t = [p["t_s"] for p in run["curve"]]
            smooth = rolling_mean([p["reward"] for p in run["curve"]], window)
            ax.plot(t, [p["reward"] for p in run["curve"]], color=colour, alpha=0.25, lw=0.8)
            label, labelled = (None if labelled else name), True
            ax.plot(t, smooth, color=colour, lw=1.6)
            overlay.plot(t, smooth, color=colour, lw=1.4, label=label)
            lag_ax.plot(t, [p["lag"] for p in run["curve"]], color=colour, lw=1.0, label=label)
            off_ax.plot(t, [p["off_policy"] for p in run["curve"]], color=colour, lw=1.0,
                        label=label)  # fmt: skip
            switch_t = run["gate"]["switch_t_s"]
            if switch_t is not None:
                for a in (ax, overlay, lag_ax, off_ax):
                    a.axvline(switch_t, color=colour, ls="--", lw=0.9, alpha=0.8)
            if run["time_to_threshold_s"] is not None:
                ax.plot([run["time_to_threshold_s"]], [threshold], "o", color=colour, ms=4)
        ax.axhline(threshold, color="grey", lw=0.8, ls=":")
        ax.set_title(f"{name} (dashed: gate switch)" if name == "li2sao" else name)
        ax.set_xlabel("training loop wall-clock (s)")
        ax.set_ylabel(f"reward (raw; rolling mean of {window})")
    overlay.axhline(threshold, color="grey", lw=0.8, ls=":")
    overlay.set_title("overlay (rolling means)")
    overlay.set_xlabel("training loop wall-clock (s)")
    overlay.set_ylim(0.0, 1.0)
    overlay.legend(loc="lower right", fontsize=8)
    lag_ax.set_title("policy lag (lag/mean)")
    off_ax.set_title("off-policy token ratio")
    for a in (lag_ax, off_ax):
        a.set_xlabel("training loop wall-clock (s)")
        a.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(value: float | None, spec: str = ".0f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def report(results: dict[str, dict[str, Any]], summary: dict[str, dict[str, Any]],
           threshold: float, window: int) -> str:  # fmt: skip
    """The printed table: per algorithm and seed, then medians and ratios to GRPO."""
    lines = [f"time to a rolling mean (over {window} steps) of reward >= {threshold:g}, "
             "on the training loop's wall-clock"]  # fmt: skip
    lines.append(f"{'run':<16} {'steps':>5} {'loop s':>7} {'to thr s':>8} {'step':>4} "
                 f"{'last5':>5} {'switch':>6} {'by itself':>9} {'lag b/a':>9} "
                 f"{'offpol b/a':>10}")  # fmt: skip
    for name, runs in results.items():
        for seed, r in runs.items():
            if "error" in r:
                lines.append(f"{name + ' s' + str(seed):<16} failed: {r['error'].splitlines()[0]}")
                continue
            b, a = r["lag"]["before"] or {}, r["lag"]["after"] or {}
            gate = r["gate"]
            itself = "-" if gate["opened_by_itself"] is None else str(gate["opened_by_itself"])
            lines.append(
                f"{name + ' s' + str(seed):<16} {r['steps']:>5} {r['loop_time_s']:>7.0f} "
                f"{_fmt(r['time_to_threshold_s']):>8} {_fmt(r['step_to_threshold'], 'd'):>4} "
                f"{_fmt(r['reward_last5'], '.2f'):>5} {_fmt(gate['switch_step'], 'd'):>6} "
                f"{itself:>9} {_fmt(b.get('lag'), '.2f')}/{_fmt(a.get('lag'), '.2f'):<4} "
                f"{_fmt(b.get('off_policy'), '.2f'):>5}/{_fmt(a.get('off_policy'), '.2f')}"
            )
    ratios = ratios_to(summary)
    lines.append("")
    lines.append(f"{'algorithm':<9} {'median s':>8} {'reached':>7} {'vs grpo':>7} {'last5':>5}")
    for name, s in summary.items():
        ratio = ratios.get(name)
        lines.append(
            f"{name:<9} {_fmt(s['time_to_threshold_s']):>8} {s['reached']:>3}/{s['runs']:<3} "
            f"{_fmt(ratio, '.2f', 'x'):>7} {_fmt(s['reward_last5'], '.2f'):>5}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/bench_time_to_reward.py",
                                description=__doc__.split("\n")[0])  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help=f"one seed, {QUICK['steps']} steps, latency median {QUICK['median_s']} s "
                        f"/ p99 {QUICK['p99_s']} s (options given explicitly win)")  # fmt: skip
    p.add_argument("--algorithms", default=",".join(ALGORITHMS),
                   help=f"comma-separated, of {','.join(ALGORITHMS + OPTIONAL)} "
                        f"(default {','.join(ALGORITHMS)})")  # fmt: skip
    p.add_argument("--seeds", help="comma-separated run seeds (default 0,1,2)")
    p.add_argument("--steps", type=int, help="steps per run (default: each config's train.steps)")
    p.add_argument("--threshold", type=float, default=0.7, help="reward threshold (0.7)")
    p.add_argument("--window", type=int, default=3, help="rolling-mean window in steps (3)")
    p.add_argument("--latency-median-s", type=float, help="tool latency median (3; 0: off)")
    p.add_argument("--latency-p99-s", type=float, help="tool latency p99 (10 x the median: 30)")
    p.add_argument("--latency-max-s", type=float, help="cap of one draw (the worker's, 60)")
    p.add_argument(
        "--slots",
        type=int,
        default=64,
        help="toy worker slots (64: a step's batch runs at once, so the latency bounds a "
        "step, not the slots)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "runs" / "bench-time-to-reward",
        help="run dirs, logs and the PNG (default runs/bench-time-to-reward)",
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the summary here")
    args = p.parse_args(argv)
    args.algorithms = [a for a in args.algorithms.split(",") if a]
    unknown = sorted(set(args.algorithms) - set(ALGORITHMS + OPTIONAL))
    if unknown or not args.algorithms:
        p.error(f"unknown algorithms {unknown}" if unknown else "no algorithm given")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s] if args.seeds else None
    except ValueError:
        p.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    args.seeds = seeds or (list(QUICK["seeds"]) if args.quick else [0, 1, 2])
    if any(s < 0 for s in args.seeds):
        p.error("seeds must be >= 0")
    if args.steps is None and args.quick:
        args.steps = QUICK["steps"]
    if args.latency_median_s is None:
        args.latency_median_s = QUICK["median_s"] if args.quick else 3.0
    if args.latency_p99_s is None:
        args.latency_p99_s = QUICK["p99_s"] if args.quick else 10.0 * args.latency_median_s
    if args.steps is not None and args.steps < args.window:
        p.error(f"--steps ({args.steps}) must be >= --window ({args.window})")
    if args.window < 1 or args.slots < 1:
        p.error("--window and --slots must be >= 1")
    if args.latency_median_s < 0 or args.latency_p99_s < args.latency_median_s:
        p.error("need 0 <= --latency-median-s <= --latency-p99-s")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    env = latency_env(args.latency_median_s, args.latency_p99_s, args.latency_max_s)
    env["SWERL_TRAIN__EVAL_INTERVAL"] = "0"
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"latency median {args.latency_median_s:g} s, p99 {args.latency_p99_s:g} s; "
          f"{args.slots} slots; seeds {args.seeds}; out {args.out}", flush=True)  # fmt: skip
    results: dict[str, dict[str, Any]] = {}
    for name in args.algorithms:
        t_max = gate_t_max(CONFIGS / f"toy_{name}.yaml")
        results[name] = {}
        for seed in args.seeds:
            try:
                rows, wall = run_one(name, seed, args.steps, args.slots, env, args.out)
                run = summarize_run(rows, args.threshold, args.window, t_max)
                run["wall_with_stack_s"] = round(wall, 1)
            except (RuntimeError, OSError) as exc:
                run = {"error": str(exc)}
            results[name][str(seed)] = run
            done = run.get("time_to_threshold_s")
            print(f"{name} seed {seed}: "
                  + (f"failed ({run['error'].splitlines()[0]})" if "error" in run else
                     f"{run['steps']} steps, loop {run['loop_time_s']:.0f} s, "
                     f"threshold at {_fmt(done, '.0f', ' s')}, "
                     f"{run['wall_with_stack_s']:.0f} s with the stack"), flush=True)  # fmt: skip
    summary = {name: summarize_algorithm(runs) for name, runs in results.items()}
    print()
    print(report(results, summary, args.threshold, args.window))
    png = args.out / "time_to_reward.png"
    if any("error" not in r for runs in results.values() for r in runs.values()):
        plot(results, args.threshold, args.window, png)
        print(f"\nfigure: {png}")
    if args.json:
        out = {
            "settings": {
                "algorithms": args.algorithms,
                "seeds": args.seeds,
                "steps": args.steps,
                "threshold": args.threshold,
                "window": args.window,
                "slots": args.slots,
                "latency_median_s": args.latency_median_s,
                "latency_p99_s": args.latency_p99_s,
                "latency_max_s": args.latency_max_s,
                "x_axis": "cumulative time/step (s)",
            },
            "time_to_threshold_s": {n: s["time_to_threshold_s"] for n, s in summary.items()},
            "ratio_to_grpo": ratios_to(summary),
            "summary": summary,
            "runs": results,
            "figure": str(png),
        }
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    failed = any("error" in r for runs in results.values() for r in runs.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
