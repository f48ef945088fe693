"""Toy-task training steps per minute of every algorithm, through the whole real stack.

Usage (from the repository root)::

    .venv/bin/python bench/bench_toy_steps.py                 # 7 algorithms x 14 steps
    .venv/bin/python bench/bench_toy_steps.py --steps 20 --algorithms grpo,li2sao
    .venv/bin/python bench/bench_toy_steps.py --json out.json

For each algorithm, one after the other on this machine, ``python -m services.toy_train``
runs its toy config (trainer/configs/toy_<config>.yaml: GRPO's for DAPO and GSPO, with
``SWERL_TRAINER__ALGORITHM`` overridden) for ``--steps`` steps, with 2 critic-only steps for
the critic-based ones (``SWERL_TRAIN__CRITIC_WARMUP_STEPS``) and no held-out evaluation:
Redis, a reference engine, the adapter, a toy worker, the trainer with a disk publish and
refresh every step. From each run's ``metrics.jsonl`` it takes the steps after the first
``--skip`` (the stack and the first publish warming up) and prints the mean step time, its
split, the steps per minute, and the ratio to GRPO's (> 1: more steps per minute than GRPO).
The batch is 64 trajectories per step for every algorithm (8 x 8 groups or 64 singles).
Nothing here asserts; docs/training.md "Toy
task runs" holds measured figures.
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

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "trainer" / "configs"
# algorithm -> the toy config it runs (DAPO and GSPO share GRPO's groups)
ALGORITHMS = {
    "grpo": "grpo",
    "dapo": "grpo",
    "gspo": "grpo",
    "lisao": "lisao",
    "li2sao": "li2sao",
    "pact": "pact",
    "srppo": "srppo",
}
PARTS = ("wait_rollouts", "build", "train", "publish")
CRITIC_WARMUP = ("lisao", "pact", "srppo")


def run_one(algorithm: str, steps: int, work: Path) -> list[dict[str, Any]]:
    """One toy run of ``algorithm``; its metrics rows (raises with the log's tail on failure)."""
    run_dir = work / algorithm
    env = {**os.environ, "SWERL_TRAINER__ALGORITHM": algorithm, "SWERL_TRAIN__EVAL_INTERVAL": "0"}
    if algorithm in CRITIC_WARMUP:  # their configs' 10 critic-only steps would be most of a run
        env["SWERL_TRAIN__CRITIC_WARMUP_STEPS"] = "2"
    config = CONFIGS / f"toy_{ALGORITHMS[algorithm]}.yaml"
    cmd = [sys.executable, "-m", "services.toy_train", "--config", str(config),
           "--run-dir", str(run_dir), "--steps", str(steps)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        trainer_log = run_dir / "trainer.log"
        log = trainer_log.read_text()[-2000:] if trainer_log.exists() else ""
        raise RuntimeError(f"{algorithm}: exit {proc.returncode}\n{proc.stdout[-1500:]}{log}")
    path = run_dir / "train" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def figures(rows: list[dict[str, Any]], skip: int) -> dict[str, float]:
    """Mean step time (and parts) over the rows after the first ``skip``; steps per minute."""
    measured = rows[skip:]
    if not measured:
        raise ValueError(f"no step after the first {skip} (ran {len(rows)})")
    step = statistics.fmean(float(r["time/step"]) for r in measured)
    out = {"steps": float(len(measured)), "step_s": step, "steps_per_minute": 60.0 / step}
    for part in PARTS:
        out[f"{part}_s"] = statistics.fmean(float(r.get(f"time/{part}") or 0.0) for r in measured)
    out["reward_mean"] = statistics.fmean(float(r["reward/mean"]) for r in measured)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algorithms", default=",".join(ALGORITHMS),
                   help=f"comma-separated, of {','.join(ALGORITHMS)}")  # fmt: skip
    p.add_argument("--steps", type=int, default=14, help="steps per run (default 14)")
    p.add_argument("--skip", type=int, default=4, help="first steps not measured (default 4)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args()
    names = [a for a in args.algorithms.split(",") if a]
    unknown = sorted(set(names) - set(ALGORITHMS))
    if unknown or args.steps <= args.skip or args.skip < 0:
        p.error(f"unknown algorithms {unknown}" if unknown else "need --steps > --skip >= 0")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-toy-steps-") as tmp:
        for name in names:
            t0 = time.monotonic()
            results[name] = figures(run_one(name, args.steps, Path(tmp)), args.skip)
            print(f"{name}: {results[name]['steps_per_minute']:.1f} steps/minute "
                  f"({time.monotonic() - t0:.0f} s with the stack)", flush=True)  # fmt: skip
    print(f"\ntoy task, 64 trajectories per step, steps {args.skip + 1}-{args.steps} of each run")
    print(f"{'algorithm':<9} {'step s':>7} {'wait':>6} {'build':>6} {'train':>6} {'publish':>7} "
          f"{'steps/min':>9} {'vs grpo':>7}")  # fmt: skip
    base = results.get("grpo", {}).get("steps_per_minute")
    for name, f in results.items():
        ratio = f"{f['steps_per_minute'] / base:.2f}x" if base else "-"
        print(f"{name:<9} {f['step_s']:>7.2f} {f['wait_rollouts_s']:>6.2f} {f['build_s']:>6.2f} "
              f"{f['train_s']:>6.2f} {f['publish_s']:>7.2f} {f['steps_per_minute']:>9.1f} "
              f"{ratio:>7}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
