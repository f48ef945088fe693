"""Measure the toy task through the real stack: tool-call rate, reward, answer length, cost.

Usage (from the repository root)::

    .venv/bin/python bench/bench_toy_task.py                      # 16 prompts x 8, warm-start
    .venv/bin/python bench/bench_toy_task.py --model ~/.cache/swerl/tiny-model   # random model
    .venv/bin/python bench/bench_toy_task.py --json out.json

Real processes (:func:`services.local_stack.start_toy_services`): Redis, a reference engine
sampling the model, the adapter in training mode, a toy-only sandbox worker; the rollout
manager's dispatch loop runs in this process. One toy rollout request (kind ``toy``) at the
given temperature; then every recorded trajectory is read back from the store.

Printed (and written with ``--json``): the rate of well-formed ``lookup`` calls among the
trajectories that were not aborted, the mean reward (chance is 0.25 with 4 codes), the endings,
the generated tokens of turn 1 (the tool call) and turn 2 (the answer), how many records have
one segment (the toy loop's history extends the adapter's, no re-render), and wall-clock
figures. Nothing here asserts; the numbers in docs/toy-task.md come from this script.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.local_stack import LocalStack, start_toy_services  # noqa: E402
from services.manager.client import RolloutManager  # noqa: E402
from services.protocol import AgentLimits, RolloutRequest, SamplingConfig  # noqa: E402
from services.protocol.toy import toy_instance_ids  # noqa: E402
from services.store.trajectories import load_trajectory  # noqa: E402
from services.tiny_model.warm_start import DEFAULT_DIR_NAME  # noqa: E402

CACHE = Path(os.environ.get("SWERL_CACHE_DIR", Path.home() / ".cache" / "swerl"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/bench_toy_task.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model",
        type=Path,
        default=CACHE / DEFAULT_DIR_NAME,
        help="model the engine samples (default: the warm-started tiny-model-toy)",
    )
    p.add_argument("--prompts", type=int, default=16, help="toy prompts (instance ids) (16)")
    p.add_argument("--samples", type=int, default=8, help="trajectories per prompt (8)")
    p.add_argument("--slots", type=int, default=8, help="worker slots (8)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (1.0)")
    p.add_argument("--max-tokens", type=int, default=48, help="max tokens per turn (48)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    return p.parse_args(argv)


def turn_tokens(client: redis.Redis, trajectory_id: str) -> tuple[list[int], int]:
    """Generated tokens per turn, and the number of segments, of one record."""
    rec = load_trajectory(client, trajectory_id)
    per_turn = [len(t.output_ids) for s in rec.segments for t in s.turns]
    return per_turn, len(rec.segments)


def measure(args: argparse.Namespace, manager: RolloutManager, redis_url: str) -> dict[str, Any]:
    request = RolloutRequest(
        kind="toy",
        instance_ids=toy_instance_ids(args.prompts),
        n_samples=args.samples,
        sampling=SamplingConfig(temperature=args.temperature, max_tokens=args.max_tokens),
        limits=AgentLimits(max_steps=2, wall_time_s=300),
    )
    started = time.monotonic()
    batch = manager.submit(request)
    results = manager.collect(batch, timeout_s=600)
    wall = time.monotonic() - started
    client = redis.Redis.from_url(redis_url)
    endings: collections.Counter[str] = collections.Counter()
    rewards, turn1, turn2, one_segment, durations = [], [], [], 0, []
    for res in results:
        out = res.outcome
        endings[out.test_report.get("ending") or f"aborted: {out.abort_reason}"] += 1
        if not out.trainable:
            continue
        rewards.append(out.reward or 0.0)
        durations.append(out.durations.get("total", 0.0))
        per_turn, segments = turn_tokens(client, res.trajectory_id)
        one_segment += segments == 1
        turn1.append(per_turn[0])
        if len(per_turn) > 1:
            turn2.append(per_turn[1])
    client.close()
    graded = len(rewards)
    return {
        "model": str(args.model),
        "trajectories": len(results),
        "graded": graded,
        "tool_call_rate": round((graded - endings["no_tool_call"]) / max(1, graded), 4),
        "mean_reward": round(statistics.fmean(rewards), 4) if rewards else None,
        "endings": dict(endings),
        "turn1_tokens": _spread(turn1),
        "answer_tokens": _spread(turn2),
        "answer_token_histogram": dict(sorted(collections.Counter(turn2).items())),
        "one_segment_records": one_segment,
        "wall_s": round(wall, 1),
        "trajectory_s_median": round(statistics.median(durations), 3) if durations else None,
        "trajectories_per_s": round(len(results) / wall, 2),
    }


def _spread(values: list[int]) -> dict[str, float] | None:
    if not values:
        return None
    return {"mean": round(statistics.fmean(values), 2), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="swerl-bench-toy-"))
    stack = LocalStack(run_dir)
    try:
        services = start_toy_services(
            stack, args.model, secrets.token_urlsafe(32), slots=args.slots
        )
        with RolloutManager(services.redis_url) as manager:
            manager.start()
            figures = measure(args, manager, services.redis_url)
    finally:
        stack.stop_all()
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"logs: {run_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
