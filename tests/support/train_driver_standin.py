"""A stand-in for ``python -m trainer train`` (no rollout stack, no model), for the trainer
service's tests: the same command line (``--config FILE [--resume]``), the same run config
sections it reads (``train.run_dir``, ``train.steps``, ``trainer.checkpoint.dir``), the same
outputs the service watches: one ``metrics.jsonl`` line per step (``step``, ``phase``,
``reward/mean``, ``version``) and a real checkpoint per step (``trainer.checkpoint``'s writer,
``step-N``). ``--resume`` continues after the newest complete checkpoint (metrics truncated to
it, like the driver) and fails with exit 1 when there is none; a missing config is exit 2.

Each start appends ``{pid, resume, start_step, config}`` to ``RUN_DIR/invocations.jsonl`` so a
test sees every attempt. ``SWERL_STANDIN_STEP_S`` (default 0.3) is the time of one step.

``SWERL_STANDIN_ROLE=follower`` plays a follower node's ranks: it appends its start to
``RUN_DIR/invocations-follower.jsonl``, takes the steps' time and writes nothing else (rank 0
writes metrics and checkpoints). ``SWERL_STANDIN_EXIT=N`` exits with ``N`` after the first
step (a crashing rank).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

from trainer.checkpoint import latest_checkpoint, read_manifest, write_checkpoint
from trainer.loop.metrics import METRICS_FILE, truncate_steps


def _append(path: Path, row: dict[str, object]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="stand-in of python -m trainer train")
    p.add_argument("--config", required=True, help="the run config")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    args = p.parse_args(argv)
    try:
        cfg = yaml.safe_load(Path(args.config).read_text())
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_dir, steps = Path(cfg["train"]["run_dir"]), int(cfg["train"]["steps"])
    ckpts = Path(cfg["trainer"]["checkpoint"]["dir"])
    start = 0
    if args.resume:
        latest = latest_checkpoint(ckpts)
        if latest is None:
            print(f"error: --resume: no complete checkpoint in {ckpts}", file=sys.stderr)
            return 1
        start = int(read_manifest(latest)["step"])
        truncate_steps(run_dir / METRICS_FILE, start)
    run_dir.mkdir(parents=True, exist_ok=True)
    follower = os.environ.get("SWERL_STANDIN_ROLE") == "follower"
    invocation = {"pid": os.getpid(), "resume": args.resume, "start_step": start}
    name = "invocations-follower.jsonl" if follower else "invocations.jsonl"
    _append(run_dir / name, {**invocation, "config": args.config})
    step_s = float(os.environ.get("SWERL_STANDIN_STEP_S", "0.3"))
    crash = os.environ.get("SWERL_STANDIN_EXIT")
    for step in range(start + 1, steps + 1):
        time.sleep(step_s)
        if crash is not None:
            print(f"error: rank crashed at step {step}", file=sys.stderr)
            return int(crash)
        if follower:
            continue
        # the metrics row before the checkpoint, as trainer/loop/driver.py does: a kill
        # between them redoes the step on resume (its row truncated), never loses the row
        row = {"step": step, "phase": "bootstrap" if step <= 2 else "single",
               "reward/mean": step / steps, "version": step}  # fmt: skip
        _append(run_dir / METRICS_FILE, row)
        write_checkpoint(ckpts / f"step-{step}", {}, {"step": step})
    print(json.dumps({"step": steps}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
