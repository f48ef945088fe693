"""Does ``make demo`` learn every time? The demo's training run over several run seeds.

Usage (from the repository root)::

    .venv/bin/python bench/bench_demo_reliability.py                  # seeds 0-4, 50 steps
    .venv/bin/python bench/bench_demo_reliability.py --seeds 5,6 --json out.json
    .venv/bin/python bench/bench_demo_reliability.py --quick          # seed 0 only

For each seed, one after the other on this machine, ``python -m services.toy_train_job
--config trainer/configs/toy_li2sao.yaml --seed S`` runs exactly what ``make demo`` runs first
(the whole stack, the job API and a trainer service, submitted with ``swerl submit train``).
From the run's ``metrics.jsonl`` and ``eval.jsonl`` it prints one row per seed: the mean
training reward of the first and last 5 steps, the switch step and whether the gate opened by
itself (before ``gate.t_max``), the final held-out reward with its standard error and the
shifted set's, and whether the run passes the bar of issue 32 (last-5 training reward and final
held-out reward both >= ``--bar``, 0.7). The target: at least 4 of 5 seeds pass. Nothing here
asserts; docs/training.md "Toy task runs" holds measured tables.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "trainer" / "configs" / "toy_li2sao.yaml"
EDGE = 5


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_figures(
    metrics: list[dict[str, Any]], evals: list[dict[str, Any]], t_max: int, bar: float
) -> dict[str, Any]:
    """One seed's row from its metrics and eval rows (``t_max``: the config's gate.t_max)."""
    if not metrics:
        return {"ok": False, "error": "no metrics rows"}
    rewards = [float(m["reward/mean"]) for m in metrics]
    switch = next((int(m["gate/switch_step"]) for m in metrics if "gate/switch_step" in m), None)
    last = evals[-1] if evals else {}
    held_out = last.get("eval/reward_mean")
    row = {
        "steps": len(metrics),
        "reward_first5": statistics.fmean(rewards[:EDGE]),
        "reward_last5": statistics.fmean(rewards[-EDGE:]),
        "switch_step": switch,
        "gate_opened_by_itself": switch is not None and switch < t_max,
        "eval_step": last.get("step"),
        "held_out": held_out,
        "held_out_se": last.get("eval/reward_se"),
        "held_out_n": last.get("eval/trajectories"),
        "shifted": last.get("eval/shifted/reward_mean"),
        "held_out_curve": [(e.get("step"), e.get("eval/reward_mean")) for e in evals],
    }
    row["ok"] = bool(held_out is not None and row["reward_last5"] >= bar and held_out >= bar)
    return row


def run_seed(seed: int, steps: int | None, workdir: Path) -> tuple[int, Path, float]:
    run_dir = workdir / f"seed{seed}"
    cmd = [sys.executable, "-m", "services.toy_train_job", "--config", str(CONFIG),
           "--run-dir", str(run_dir), "--seed", str(seed)]  # fmt: skip
    cmd += ["--steps", str(steps)] if steps else []
    started = time.monotonic()
    with open(workdir / f"seed{seed}.out", "w") as out:
        code = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                              env=os.environ, check=False).returncode  # fmt: skip
    return code, run_dir / "train", time.monotonic() - started


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def table(rows: dict[int, dict[str, Any]]) -> str:
    lines = ["seed | first 5 | last 5 | switch (by itself) | held-out (+- se, n) | shifted | ok",
             "---|---|---|---|---|---|---"]  # fmt: skip
    for seed, r in rows.items():
        if "error" in r:
            lines.append(f"{seed} | {r['error']} | | | | | no")
            continue
        switch = f"{_fmt(r['switch_step'], 'd')} ({'yes' if r['gate_opened_by_itself'] else 'no'})"
        held = (
            f"{_fmt(r['held_out'])} +- {_fmt(r['held_out_se'])} (n {_fmt(r['held_out_n'], '.0f')})"
        )
        ok = "yes" if r["ok"] else "no"
        lines.append(f"{seed} | {_fmt(r['reward_first5'])} | {_fmt(r['reward_last5'])} | "
                     f"{switch} | {held} | {_fmt(r['shifted'])} | {ok}")  # fmt: skip
    passed = sum(1 for r in rows.values() if r.get("ok"))
    lines.append(f"\n{passed} of {len(rows)} seeds reach the bar")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    p.add_argument("--seeds", default=None, help="run seeds, comma-separated (0,1,2,3,4)")
    p.add_argument("--quick", action="store_true", help="seed 0 only (--seeds wins)")
    p.add_argument("--steps", type=int, default=None, help="override train.steps (50)")
    p.add_argument("--bar", type=float, default=0.7, help="last-5 and held-out bar (0.7)")
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    p.add_argument("--keep", type=Path, default=None, help="keep the runs in this directory")
    args = p.parse_args(argv)
    if args.seeds is None:
        args.seeds = "0" if args.quick else "0,1,2,3,4"
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds must be integers, got {args.seeds!r}")
    t_max = int(yaml.safe_load(CONFIG.read_text())["train"]["gate"]["t_max"])
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="swerl-reliability-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows: dict[int, dict[str, Any]] = {}
    for seed in seeds:
        code, train, seconds = run_seed(seed, args.steps, workdir)
        row = run_figures(read_jsonl(train / "metrics.jsonl"), read_jsonl(train / "eval.jsonl"),
                          t_max, args.bar)  # fmt: skip
        row.update(exit=code, seconds=round(seconds, 1))
        if code != 0:
            row.update(ok=False, error=f"exit {code}: {workdir / f'seed{seed}.out'}")
        rows[seed] = row
        print(f"seed {seed}: exit {code}, {seconds:.0f} s, last 5 {_fmt(row.get('reward_last5'))},"
              f" held-out {_fmt(row.get('held_out'))}", flush=True)  # fmt: skip
    print(table(rows))
    print(f"runs in {workdir}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
