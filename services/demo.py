"""``python -m services.demo`` (``make demo``): swerl's main job end to end on one machine.

What runs, all real processes on loopback:

1. a private Redis (AOF on);
2. two reference engines on the tiny model, speaking SGLang's protocol: one in SCRIPTED mode
   (test machinery: it replays each mini instance's gold patch as terminal commands, so its
   trajectories can earn reward 1) and one sampling the policy (``--model``: by default the
   random tiny model, reward 0; ``make demo`` passes the policy its toy training run made);
3. the adapter in front of both, placing by sample index (``placement: sample_index``): sample 0
   of every group runs on the scripted engine and sample 1 on the sampling one, whatever the
   timing, so every group of two or more samples mixes a reward 1 and a reward 0;
4. a sandbox worker (docker by default) that runs the real OpenHands agent server inside each
   task sandbox and grades the patch in a fresh sandbox with SWE-bench semantics;
5. the rollout manager (in this process) which queues ``instances x samples`` trajectories.

Then the recorded trajectories are turned into a padded training batch, the tiny model
recomputes every behaviour logprob (the check that engine and trainer agree, the scripted
engine's tokens included), and the Li2SAO bootstrap objective is evaluated on the batch the
trainer would train on: the scripted engine's trajectories are kept out of the loss (their
tokens are not the policy's samples), so only the sampled ones are in it
(services/demo_objective.py). This step evaluates the
losses only; training runs are ``python -m trainer train`` (``python -m services.toy_train`` on
the toy task, which ``make demo`` runs first: docs/training.md).

Outputs: ``runs/demo-<time>/`` holds every service's log, the scripted policy file and
``metrics.jsonl`` (one line per trajectory and one for the objective); ``--json FILE`` also
writes a summary (trajectories with group, sample, engine role and reward; rewards per group;
the objective) for scripts and tests.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from sandbox_worker import task_sets
from sandbox_worker.images import DEFAULT_INSTANCES
from sandbox_worker.tasks.scripted import write_script
from services.datasets import DatasetError, load_instances
from services.demo_report import (
    TrajectoryRow,
    instance_scores,
    instance_table,
    progress_line,
    summary,
    trajectory_row,
    trajectory_table,
)
from services.local_stack import LocalStack, StackError
from services.manager.client import RolloutManager, tasks_for_request
from services.protocol import AgentLimits, RolloutRequest, SamplingConfig, TaskResult
from services.protocol.instance import SWEInstance
from services.protocol.trajectory import TrajectoryRecord
from services.store.trajectories import load_trajectory
from services.tiny_model.build import ensure_tiny_model

# The adapter runs in training mode as in production: the worker token is shared by the adapter
# and the worker through their environments (never a command line), fresh for every demo.
WORKER_TOKEN = secrets.token_urlsafe(32)
PROGRESS_EVERY_S = 15.0


def _positive(kind: type[int] | type[float], minimum: float) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum:g}, got {text}")
        return value

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m services.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    p.add_argument("--instances", default=str(DEFAULT_INSTANCES),
                   help="SWE-bench-format dataset file (JSONL, JSON or parquet), or the name of "
                        "a task set `python -m sandbox_worker.images add` registered (its "
                        "instances run as <name>/<id> in its swerl/<name>/ images); default: "
                        "the mini set shipped in tests/data")  # fmt: skip
    p.add_argument(
        "--limit",
        type=_positive(int, 0),
        default=2,
        help="use the first N instances of the file (default 2; 0 = all of them)",
    )
    p.add_argument(
        "--samples",
        type=_positive(int, 1),
        default=2,
        help="trajectories per instance, one group (default 2: scripted + sampling)",
    )
    p.add_argument("--backend", choices=["docker", "bwrap"], default="docker",
                   help="sandbox backend of the local worker (docker needs $DOCKER_HOST's "
                        "engine: `make setup` starts a private one)")  # fmt: skip
    p.add_argument(
        "--slots",
        type=_positive(int, 1),
        default=2,
        help="sandbox slots of the local worker (default 2)",
    )
    p.add_argument(
        "--max-steps",
        type=_positive(int, 1),
        default=6,
        help="agent steps (LLM calls) per trajectory (default 6)",
    )
    p.add_argument(
        "--timeout",
        type=_positive(float, 1),
        default=1200.0,
        help="seconds to wait for the batch before cancelling it (default 1200)",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="where logs and metrics go (default: runs/demo-<time>)",
    )
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="also write a machine-readable summary of the run to FILE")  # fmt: skip
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help="the policy the engines serve: an HF model directory, or a training run's weights "
        "directory (its newest published v<N>/, e.g. the toy run of `make demo`); default: the "
        "random tiny model",
    )
    return p.parse_args(argv)


def resolve_model(path: Path) -> Path:
    """``path`` itself when it is an HF model directory, else its newest ``v<N>/`` export (a
    weights directory of the publisher); ValueError naming the problem otherwise."""
    if (path / "config.json").is_file():
        return path
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory")
    versions = [
        (int(child.name[1:]), child)
        for child in path.iterdir()
        if child.name[:1] == "v" and child.name[1:].isdigit() and (child / "config.json").is_file()
    ]
    if not versions:
        raise ValueError(f"{path} holds neither config.json nor a published v<N>/ model")
    return max(versions)[1]


@dataclass(frozen=True)
class DemoTasks:
    """What ``--instances`` names: a file of rows, or a registered task set (``task_set``)."""

    file: Path
    instances: list[SWEInstance]
    task_set: str | None = None

    def key(self, instance: SWEInstance) -> str:
        """The id the request names: ``<set>/<id>`` for a task set (its images), else the id."""
        if self.task_set is None:
            return instance.instance_id
        return task_sets.task_set_key(self.task_set, instance.instance_id)

    def worker_env(self) -> dict[str, str]:
        """How the demo's worker finds the rows: the file, or the set's registry directory."""
        if self.task_set is None:
            return {"SWERL_WORKER__ROLLOUT__INSTANCES": json.dumps([str(self.file.resolve())])}
        return {"SWERL_WORKER__ROLLOUT__TASK_SETS_DIR": str(self.file.parent.resolve())}


def resolve_tasks(ref: str, registry: Path | None = None) -> DemoTasks:
    """``--instances`` -> its rows (DatasetError / TaskSetError naming the problem)."""
    directory = registry or task_sets.default_task_sets_dir()
    found = task_sets.resolve_task_set(ref, directory)
    if found is None:
        return DemoTasks(Path(ref), load_instances(ref))
    name, file = found
    return DemoTasks(file, load_instances(file), name)


EPILOG = """\
environment: SWERL_CACHE_DIR (tiny model and venv cache, default ~/.cache/swerl), DOCKER_HOST
(the Docker engine for --backend docker; `make` sets the private one's socket).
exit status: 0 done; 1 a service failed to start, the batch timed out, or every trajectory
aborted (infrastructure); 2 bad arguments or an unreadable --instances file.
"""


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


# Engine roles in the adapter's --engines order: with placement sample_index, sample k of every
# group runs on engine k mod 2 (sample 0 scripted, sample 1 sampling).
ENGINE_ROLES = (("engine-scripted", "scripted"), ("engine-random", "sampling"))


def start_services(
    stack: LocalStack, args: argparse.Namespace, model: Path, script: Path
) -> tuple[str, str, dict[str, str]]:
    """Redis, the two engines and the adapter; returns their URLs and each engine URL's role."""
    redis_url = stack.start_redis()
    say(f"redis: {redis_url}")
    engines = []
    for name, role in ENGINE_ROLES:
        engines.append(
            stack.start_reference_engine(name, model, script if role == "scripted" else None)
        )
        say(f"{name}: {engines[-1]}")
    adapter_url = stack.start_adapter(
        engines, model, redis_url,
        {"SWERL_ADAPTER__WORKER_TOKEN": WORKER_TOKEN, "SWERL_ADAPTER__PLACEMENT": "sample_index"},
    )  # fmt: skip
    say(f"adapter: {adapter_url} (placement: sample k on engine k mod {len(engines)})")
    roles = {url: role for url, (_, role) in zip(engines, ENGINE_ROLES, strict=True)}
    return redis_url, adapter_url, roles


def start_worker(stack: LocalStack, args: argparse.Namespace, redis_url: str, adapter_url: str,
                 manager: RolloutManager, node: str, log: Callable[[str], None] = say,
                 tasks: DemoTasks | None = None) -> None:  # fmt: skip
    tasks = tasks or DemoTasks(Path(args.instances), [])  # a file (services/eval/generate.py)
    env = {
        "SWERL_WORKER__ROLLOUT__ADAPTER_URL": adapter_url,
        "SWERL_WORKER__ROLLOUT__ADAPTER_TOKEN": WORKER_TOKEN,
        **tasks.worker_env(),
    }

    def alive() -> bool:
        return any(n.name == node and n.alive for n in manager.nodes())

    stack.python("worker", "sandbox_worker",
                 ["--redis", redis_url, "--node", node, "--slots", str(args.slots),
                  "--backend", args.backend],
                 alive, env=env, timeout_s=120)  # fmt: skip
    log(f"sandbox worker: node {node}, {args.slots} slots, backend {args.backend}")


def wait_for_batch(
    manager: RolloutManager, batch_id: str, timeout_s: float, log: Callable[[str], None] = say
) -> list[TaskResult]:
    """Wait for every trajectory, printing progress with an ETA on each change and at least
    every ``PROGRESS_EVERY_S`` (the first trajectories include the agent servers' start)."""
    start = time.monotonic()
    last, last_at = "", 0.0
    while True:
        p = manager.progress(batch_id)
        detail = (f"completed {p.completed}, timeout {p.timeout}, error {p.error}, aborted "
                  f"{p.aborted}; running {p.running}, queued {p.queued}")  # fmt: skip
        now = time.monotonic()
        if detail != last or now - last_at >= PROGRESS_EVERY_S:
            log(progress_line(p.done, p.total, now - start, detail))
            last, last_at = detail, now
        if p.done >= p.total:
            return manager.collect(batch_id, timeout_s=30)
        if now - start > timeout_s:
            manager.cancel(batch_id)
            raise StackError(f"batch {batch_id} not finished after {timeout_s:.0f}s (cancelled)")
        time.sleep(2.0)


def report(
    results: list[TaskResult], request: RolloutRequest, redis_url: str, out: Path,
    roles: dict[str, str],
) -> tuple[list[tuple[TaskResult, TrajectoryRecord]], list[TrajectoryRow]]:  # fmt: skip
    """Print the trajectory and instance tables, append one metrics line per trajectory;
    returns the trainable (result, record) pairs and the rows."""
    tasks = {t.task_id: (t.instance_id, t.sample_index) for t in tasks_for_request(request)}
    client = redis.Redis.from_url(redis_url)
    records, rows = [], []
    with out.open("a") as f:
        for res in results:
            try:
                rec: TrajectoryRecord | None = load_trajectory(client, res.trajectory_id)
            except KeyError:
                rec = None
            rows.append(trajectory_row(res, rec, tasks[res.task_id], roles))
            f.write(json.dumps({"kind": "trajectory", **asdict(rows[-1])}) + "\n")
            if rec is not None and res.outcome.trainable and rec.segments:
                records.append((res, rec))
    client.close()
    for line in trajectory_table(rows):
        say(line)
    say("per instance (pass@k: resolved by any of its k samples):")
    for line in instance_table(instance_scores(rows)):
        say(line)
    return records, rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:  # bad input fails here, before anything starts
        tasks = resolve_tasks(args.instances)
    except (DatasetError, task_sets.TaskSetError, OSError) as exc:
        print(f"python -m services.demo: error: --instances: {exc}", file=sys.stderr)
        return 2
    available = tasks.instances
    instances = available[: args.limit] if args.limit else available
    run_dir = args.run_dir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    cache = Path(os.environ.get("SWERL_CACHE_DIR", Path.home() / ".cache" / "swerl"))
    try:
        model = resolve_model(args.model) if args.model else ensure_tiny_model(cache / "tiny-model")
    except ValueError as exc:
        print(f"python -m services.demo: error: --model: {exc}", file=sys.stderr)
        return 2
    script = write_script(instances, run_dir / "scripted-policy.jsonl")
    source = f"task set {tasks.task_set}" if tasks.task_set else str(tasks.file)
    say(f"using {len(instances)} of {len(available)} instances of {source} "
        f"(--limit {args.limit}; 0 = all) x {args.samples} samples")  # fmt: skip
    say(f"run dir {run_dir}; model {model}")
    # A unique node name: two demos on one machine never reclaim each other's sandboxes.
    node = f"demo-{secrets.token_hex(3)}"
    stack = LocalStack(run_dir)
    manager: RolloutManager | None = None
    try:
        redis_url, adapter_url, roles = start_services(stack, args, model, script)
        manager = RolloutManager(redis_url)
        manager.start()
        start_worker(stack, args, redis_url, adapter_url, manager, node, say, tasks)
        request = RolloutRequest(
            instance_ids=[tasks.key(i) for i in instances],
            n_samples=args.samples,
            limits=AgentLimits(max_steps=args.max_steps, wall_time_s=args.timeout / 2),
            sampling=SamplingConfig(temperature=1.0, max_tokens=2048),
        )
        batch_id = manager.submit(request)
        say(f"submitted batch {batch_id}: {len(instances) * args.samples} trajectories")
        results = wait_for_batch(manager, batch_id, args.timeout)
        records, rows = report(results, request, redis_url, run_dir / "metrics.jsonl", roles)
        metrics = objective_metrics(model, records, run_dir)
        if args.json is not None:
            args.json.write_text(json.dumps(summary(rows, metrics), indent=2) + "\n")
        if rows and all(r.status == "aborted" for r in rows):
            raise StackError(
                f"every trajectory aborted (infrastructure); see the logs in {run_dir}"
            )
        say(f"done; logs and metrics.jsonl in {run_dir}")
        return 0
    except StackError as exc:
        print(f"[demo] error: {exc}", file=sys.stderr)
        return 1
    finally:
        if manager is not None:
            manager.close()
        stack.stop_all()


def objective_metrics(
    model: Path, records: list[tuple[TaskResult, TrajectoryRecord]], run_dir: Path
) -> dict[str, Any] | None:
    """Evaluate the Li2SAO bootstrap objective on the trainable trajectories (None if none)."""
    if not records:
        return None
    from services.demo_objective import evaluate_objective

    metrics = evaluate_objective(model, records)
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"kind": "objective", **metrics}) + "\n")
    for key in ("max_abs_logprob_diff", "n_checked_tokens", "actor_loss", "critic_loss",
                "estimator", "n_trajectories", "scripted_trajectories", "n_action_tokens",
                "mixed_groups", "objective_skipped"):  # fmt: skip
        if key not in metrics:
            continue
        say(f"objective {key}: {metrics.get(key)}")
    return metrics


if __name__ == "__main__":
    sys.exit(main())
