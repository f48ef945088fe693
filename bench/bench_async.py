"""The wall-clock claim of Li2SAO (issue 12 "Performance"): without a group barrier the trainer
waits less. GRPO (P x n groups, the group barrier) vs Li2SAO after its switch (B x 1, streaming)
vs LiSAO (B x 1 from the start), the same trajectories per step, in one run.

Usage (from the repository root)::

    .venv/bin/python bench/bench_async.py            # 8 x 8 vs 64 x 1, 10 measured steps each
    .venv/bin/python bench/bench_async.py --quick    # small and fast (the smoke test)
    .venv/bin/python bench/bench_async.py --json out.json

Real parts: a Redis server, one ``python -m sandbox_worker --backend simulated`` process fed
through the queue, the rollout manager's dispatch loop in this process, and the driver's own
``Collector`` (requests, the in-flight budget, one result thread per request, the pool's batch
selection with its lag filter) and ``PhaseController`` (schedules, the Li2SAO switch: the
prefetched bootstrap batch, the cancel of leftover bootstrap work, then single requests). The
bench's step is the driver's ``TrainLoop._take_batch`` sequence, then the train step.

Simulated (named here so nobody mistakes it for more):

* **Trajectory durations**: the simulated runner sleeps a duration drawn per task from a
  lognormal (``SimulatedRunnerConfig.lognormal_median_s`` / ``lognormal_sigma``, seeded by
  the task id) capped at the time limit ``max_duration_s``. Full mode: median 1.0 s, sigma
  0.8, cap 6 s: about 85 % of runs take 0.3-3 s, 1.25 % hit the cap (ln 6 / 0.8 = 2.24 sd),
  and 55 % of 64-trajectory requests hold at least one run at the cap (1 - 0.9875^64): the
  paper's shape (most agent runs short, a long tail up to the time limit), scaled from
  minutes to seconds. Every in-flight trajectory has a worker slot (slots = 2 x B).
* **The train step**: a fixed sleep and version + 1. One comparison per value of
  ``--train-s`` (full: 0.5 s, rollouts the bottleneck; 2 s, the train step the bottleneck).
* **Records**: the simulated worker writes no trajectory record, so the collector's record
  loader is replaced by one that builds a one-turn record whose token version is the
  trainer version when the task *started*: the
  lag a trajectory would have with an agent-step refresh, where its oldest tokens decide.
  (Start = the result's ``finished_at`` minus the runner's ``run`` time, both the worker's
  wall clock on this machine.)

Measured per algorithm over the steps after the first ``skip`` (the pipeline filling: 1 for
GRPO and LiSAO; 3 for Li2SAO: its bootstrap step, the drained prefetched batch, and the first
single step after the cancel): wall-clock per step, trainer idle time per step (waiting for
a batch), the idle share, policy lag, and the collector's counts (submitted, over-lag drops,
cancelled). Nothing here asserts; docs/training.md "bench_async" holds measured figures.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.local_stack import LocalStack  # noqa: E402
from services.manager.client import RolloutManager  # noqa: E402
from services.manager.config import ManagerConfig  # noqa: E402
from services.protocol import TaskResult, TrajectoryRecord  # noqa: E402
from services.queue.submitter import SubmitterQueue  # noqa: E402
from tests.support.loop_rollouts import record_of  # noqa: E402
from trainer.loop.collector import Collector  # noqa: E402
from trainer.loop.config import TrainConfig  # noqa: E402
from trainer.loop.phases import PhaseController  # noqa: E402
from trainer.loop.prompts import PromptCursor  # noqa: E402

ALGORITHMS = {"grpo": "groups", "li2sao": "switch", "lisao": "single"}
SKIP = {"grpo": 1, "li2sao": 3, "lisao": 1}


@dataclass(frozen=True)
class Setting:
    prompts: int  # P of GRPO's P x n
    group_size: int  # n
    steps: int  # measured steps per algorithm
    train_s: float
    median_s: float
    sigma: float
    cap_s: float
    slots: int
    max_policy_lag: int = 4  # the driver's default (trainer.batch.max_policy_lag)
    seed: int = 0

    @property
    def batch(self) -> int:
        return self.prompts * self.group_size


FULL = Setting(8, 8, 10, 2.0, 1.0, 0.8, 6.0, slots=128)
QUICK = Setting(4, 4, 2, 0.3, 0.15, 0.8, 1.0, slots=32)


class VersionClock:
    """The trainer version over (wall-clock) time, to tag a trajectory by its start."""

    def __init__(self) -> None:
        self.times = [0.0]
        self.versions = [0]

    def bump(self) -> None:
        self.times.append(time.time())
        self.versions.append(self.versions[-1] + 1)

    def at(self, t: float) -> int:
        return self.versions[max(0, bisect.bisect_right(self.times, t) - 1)]


class SimulatedRecordsCollector(Collector):
    """The driver's collector, with records built from the result (the simulated worker
    writes none): one turn whose version is the trainer's when the task started."""

    def __init__(self, *args: Any, clock: VersionClock, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.clock = clock

    def _record(self, result: TaskResult) -> TrajectoryRecord | None:
        if not result.outcome.trainable:
            return None
        started = result.finished_at - float(result.outcome.durations.get("run", 0.0))
        return record_of(result, (self.clock.at(started),))


@dataclass
class StepRow:
    step: int
    phase: str
    wall_s: float
    idle_s: float
    lag_mean: float
    lag_max: int


@dataclass
class AlgoResult:
    algorithm: str
    skip: int
    rows: list[StepRow] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    switch_step: int | None = None

    def measured(self) -> list[StepRow]:
        return self.rows[self.skip :]

    def summary(self) -> dict[str, Any]:
        rows = self.measured()
        wall = [r.wall_s for r in rows]
        idle = [r.idle_s for r in rows]
        return {
            "measured_steps": len(rows),
            "wall_per_step_s": statistics.fmean(wall),
            "idle_per_step_s": statistics.fmean(idle),
            "idle_share": sum(idle) / sum(wall),
            "lag_mean": statistics.fmean(r.lag_mean for r in rows),
            "lag_max": max(r.lag_max for r in rows),
            "switch_step": self.switch_step,
            "submitted": self.counts.get("submitted", 0),
            "trained": self.counts.get("trained", 0),
            "over_lag": self.counts.get("over_lag", 0),
            "cancelled_tasks": self.counts.get("cancelled_tasks", 0),
        }


def run_algorithm(
    name: str, s: Setting, manager: RolloutManager, store: redis.Redis, run_id: str
) -> AlgoResult:
    """The driver's step sequence with a simulated train step, ``skip + steps`` steps."""
    schedule = ALGORITHMS[name]
    skip = SKIP[name]
    n_ids = 4 * s.batch * (skip + s.steps)
    train = TrainConfig(
        run_dir=str(ROOT / "unused"), run_id=run_id, steps=skip + s.steps, publish=False,
        tensorboard=False, schedule=schedule,  # type: ignore[arg-type]
        bootstrap={"prompts": s.prompts, "group_size": s.group_size},
        single={"batch_size": s.batch, "in_flight": 2 * s.batch},
        gate={"t_min": 0, "t_max": 1},  # Li2SAO: switch after step 1 (forced by t_max)
        dataset={"instance_ids": [f"q{i}" for i in range(n_ids)], "shuffle": False},
        rollout={"wait_timeout_s": 600},
    )  # fmt: skip
    phases = PhaseController(schedule, train.bootstrap, train.single, train.gate)
    clock = VersionClock()
    cursor = PromptCursor(train.dataset.instance_ids, 0, False)
    collector = SimulatedRecordsCollector(manager, store, cursor, train, clock=clock)
    result = AlgoResult(name, skip)
    try:
        for step in range(1, skip + s.steps + 1):
            t0 = time.monotonic()
            version = clock.versions[-1]
            collector.top_up(phases.request_shape, version)
            selection, wait = collector.next_batch(
                phases.batch_shape, version, s.max_policy_lag, phases.request_shape
            )
            phase = phases.phase
            phases.batch_taken()
            if phases.take_cancel():
                collector.cancel_all()
            collector.top_up(phases.request_shape, version)
            time.sleep(s.train_s)  # the simulated train step
            clock.bump()
            phases.after_step(step, None, None)
            lags = selection.lags
            result.rows.append(StepRow(step, phase, time.monotonic() - t0, wait.seconds,
                                       statistics.fmean(lags), max(lags)))  # fmt: skip
    finally:
        collector.cancel_all()
        collector.feed.join()
    result.counts = dict(collector.pool.counts)
    result.switch_step = phases.switch_step
    return result


def start_stack(stack: LocalStack, s: Setting) -> str:
    url = stack.start_redis()
    env = {
        "SWERL_WORKER__LOG_LEVEL": "WARNING",
        "SWERL_WORKER__SIMULATED__LOGNORMAL_MEDIAN_S": str(s.median_s),
        "SWERL_WORKER__SIMULATED__LOGNORMAL_SIGMA": str(s.sigma),
        "SWERL_WORKER__SIMULATED__MAX_DURATION_S": str(s.cap_s),
        "SWERL_WORKER__SIMULATED__SEED": str(s.seed),
        "SWERL_WORKER__SIMULATED__REWARD": "1.0",
    }
    queue = SubmitterQueue(url)
    argv = ["--redis", url, "--node", "sim0", "--slots", str(s.slots), "--backend", "simulated"]
    try:
        stack.python(
            "worker", "sandbox_worker", argv, lambda: any(n.alive for n in queue.nodes()),
            env=env, timeout_s=120,
        )  # fmt: skip
    finally:
        queue.close()
    return url


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    g = results["grpo"]
    out: dict[str, float] = {}
    for name in ("li2sao", "lisao"):
        r = results[name]
        out[f"{name}_over_grpo_wall"] = r["wall_per_step_s"] / g["wall_per_step_s"]
        out[f"{name}_over_grpo_idle"] = (
            r["idle_per_step_s"] / g["idle_per_step_s"] if g["idle_per_step_s"] > 0 else 0.0
        )
        out[f"{name}_faster_than_grpo_pct"] = 100.0 * (1 - out[f"{name}_over_grpo_wall"])
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/bench_async.py", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes and short durations")
    p.add_argument("--steps", type=int, help="measured steps per algorithm")
    p.add_argument(
        "--train-s",
        metavar="S[,S...]",
        help="seconds of the simulated train step, one comparison each (full: 0.5,2.0)",
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the figures here")
    p.add_argument("--workdir", type=Path, help="logs and Redis data (default: a temp dir)")
    return p.parse_args(argv)


def compare(s: Setting, manager: RolloutManager, store: redis.Redis, tag: str) -> dict[str, Any]:
    """The three algorithms at one train-step time: their figures, per-step rows, ratios."""
    results: dict[str, dict[str, Any]] = {}
    per_step: dict[str, list[dict[str, Any]]] = {}
    for name in ALGORITHMS:
        res = run_algorithm(name, s, manager, store, f"bench-{tag}-{name}")
        results[name] = res.summary()
        per_step[name] = [asdict(r) for r in res.rows]
    return {"train_s": s.train_s, "algorithms": results, "ratios": ratios(results),
            "steps": per_step}  # fmt: skip


def print_comparison(s: Setting, run: dict[str, Any]) -> None:
    print(f"\ntrain step {s.train_s} s:")
    print(f"{'algorithm':<8} {'steps':>5} {'wall/step s':>11} {'idle/step s':>11} "
          f"{'idle share':>10} {'lag mean':>8} {'lag max':>7} {'submitted':>9} "
          f"{'over lag':>8}")  # fmt: skip
    for name, r in run["algorithms"].items():
        print(f"{name:<8} {r['measured_steps']:>5} {r['wall_per_step_s']:>11.3f} "
              f"{r['idle_per_step_s']:>11.3f} {r['idle_share']:>10.3f} {r['lag_mean']:>8.2f} "
              f"{r['lag_max']:>7} {r['submitted']:>9} {r['over_lag']:>8}")  # fmt: skip
    rt = run["ratios"]
    for name in ("li2sao", "lisao"):
        print(f"{name} / grpo: wall per step x{rt[f'{name}_over_grpo_wall']:.3f} "
              f"({rt[f'{name}_faster_than_grpo_pct']:+.1f} % faster), idle per step "
              f"x{rt[f'{name}_over_grpo_idle']:.3f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = QUICK if args.quick else FULL
    if args.steps is not None:
        base = Setting(**{**asdict(base), "steps": args.steps})
    train_values = (0.1, 0.3) if args.quick else (0.5, 2.0)
    if args.train_s:
        train_values = tuple(float(x) for x in args.train_s.split(","))
    settings = [Setting(**{**asdict(base), "train_s": t}) for t in train_values]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-async-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stack = LocalStack(workdir)
    runs: list[dict[str, Any]] = []
    t_all = time.monotonic()
    b = base
    print(f"bench_async: {b.batch} trajectories per step (GRPO {b.prompts} x {b.group_size}, "
          f"LiSAO / Li2SAO {b.batch} x 1, in flight 2 x {b.batch} for both), durations "
          f"lognormal(median {b.median_s} s, sigma {b.sigma}) capped at {b.cap_s} s, "
          f"{b.slots} worker slots, {b.steps} measured steps each")  # fmt: skip
    try:
        url = start_stack(stack, base)
        manager = RolloutManager(url, ManagerConfig(redis_url=url, poll_interval_s=0.05))
        store = redis.Redis.from_url(url, decode_responses=False)
        manager.start()
        try:
            for i, s in enumerate(settings):
                runs.append(compare(s, manager, store, f"t{i}"))
                print_comparison(s, runs[-1])
        finally:
            manager.close()
            store.close()
    finally:
        stack.stop_all()
    setting = {k: v for k, v in asdict(base).items() if k != "train_s"}
    figures = {
        "setting": {**setting, "batch": base.batch, "quick": args.quick},
        "runs": runs,
        "total_s": time.monotonic() - t_all,
    }
    print(f"\ntotal {figures['total_s']:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
