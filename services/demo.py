"""``python -m services.demo`` (``make demo``): swerl's main job end to end on one machine.

What runs, all real processes on loopback:

1. a private Redis (AOF on);
2. two reference engines on the tiny model, speaking SGLang's protocol: one in SCRIPTED mode
   (test machinery: it replays each mini instance's gold patch as terminal commands, so its
   trajectories can earn reward 1) and one sampling the random tiny model (reward 0);
3. the adapter in front of both, placing by sample index (``placement: sample_index``): sample 0
   of every group runs on the scripted engine and sample 1 on the sampling one, whatever the
   timing, so every group of two or more samples mixes a reward 1 and a reward 0;
4. a sandbox worker (docker by default) that runs the real OpenHands agent server inside each
   task sandbox and grades the patch in a fresh sandbox with SWE-bench semantics;
5. the rollout manager (in this process) which queues ``instances x samples`` trajectories.

Then the recorded trajectories are turned into a padded training batch, the tiny model
recomputes every behaviour logprob (the check that engine and trainer agree), and the Li2SAO
bootstrap objective (GRPO advantages + DIS actor loss, centred critic loss with the divergence
mask and ranking loss, readiness statistics) is evaluated on it. The trainer loop that steps
the weights and refreshes the engines is not built yet; this step evaluates the losses only.

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
from pathlib import Path

import redis

from sandbox_worker.images import DEFAULT_INSTANCES
from sandbox_worker.tasks.scripted import write_script
from services.datasets import load_instances
from services.local_stack import LocalStack, StackError
from services.manager.client import RolloutManager
from services.processes import free_port, http_ok
from services.protocol import AgentLimits, RolloutRequest, SamplingConfig, TaskResult
from services.store.trajectories import load_trajectory
from services.tiny_model.build import ensure_tiny_model

# The adapter runs in training mode as in production: the worker token is shared by the adapter
# and the worker through their environments (never a command line), fresh for every demo.
WORKER_TOKEN = secrets.token_urlsafe(32)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m services.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--instances", default=str(DEFAULT_INSTANCES), help="SWE-bench-format JSONL")
    p.add_argument("--limit", type=int, default=2, help="how many instances (prompts) to use")
    p.add_argument("--samples", type=int, default=2, help="trajectories per instance (group)")
    p.add_argument("--backend", choices=["docker", "bwrap"], default="docker")
    p.add_argument("--slots", type=int, default=2, help="sandbox slots of the local worker")
    p.add_argument("--max-steps", type=int, default=6, help="agent steps per trajectory")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds to wait for the batch")
    p.add_argument("--run-dir", type=Path, default=None, help="default: runs/demo-<time>")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="also write a machine-readable summary of the run to FILE")  # fmt: skip
    return p.parse_args(argv)


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
        extra = ["--script", str(script)] if role == "scripted" else []
        port = free_port()
        stack.python(name, "services.reference_engine.server",
                     ["--model", str(model), "--port", str(port), *extra],
                     http_ok(f"http://127.0.0.1:{port}/health"))  # fmt: skip
        engines.append(f"http://127.0.0.1:{port}")
        say(f"{name}: {engines[-1]}")
    port = free_port()
    adapter_url = f"http://127.0.0.1:{port}"
    stack.python("adapter", "adapter",
                 ["--engines", ",".join(engines), "--model", str(model), "--redis", redis_url,
                  "--port", str(port)],
                 http_ok(f"{adapter_url}/health"),
                 env={"SWERL_ADAPTER__WORKER_TOKEN": WORKER_TOKEN,
                      "SWERL_ADAPTER__PLACEMENT": "sample_index"})  # fmt: skip
    say(f"adapter: {adapter_url} (placement: sample k on engine k mod {len(engines)})")
    roles = {url: role for url, (_, role) in zip(engines, ENGINE_ROLES, strict=True)}
    return redis_url, adapter_url, roles


def start_worker(stack: LocalStack, args: argparse.Namespace, redis_url: str, adapter_url: str,
                 manager: RolloutManager) -> None:  # fmt: skip
    env = {
        "SWERL_WORKER__ROLLOUT__ADAPTER_URL": adapter_url,
        "SWERL_WORKER__ROLLOUT__ADAPTER_TOKEN": WORKER_TOKEN,
        "SWERL_WORKER__ROLLOUT__INSTANCES": json.dumps([str(Path(args.instances).resolve())]),
    }

    def alive() -> bool:
        return any(n.name == "demo-node" and n.alive for n in manager.nodes())

    stack.python("worker", "sandbox_worker",
                 ["--redis", redis_url, "--node", "demo-node", "--slots", str(args.slots),
                  "--backend", args.backend],
                 alive, env=env, timeout_s=120)  # fmt: skip
    say(f"sandbox worker: node demo-node, {args.slots} slots, backend {args.backend}")


def wait_for_batch(manager: RolloutManager, batch_id: str, timeout_s: float) -> list[TaskResult]:
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        p = manager.progress(batch_id)
        line = (
            f"{p.done}/{p.total} done (completed {p.completed}, timeout {p.timeout}, "
            f"error {p.error}, aborted {p.aborted}); running {p.running}, queued {p.queued}"
        )
        if line != last:
            say(line)
            last = line
        if p.done >= p.total:
            return manager.collect(batch_id, timeout_s=30)
        if time.monotonic() > deadline:
            manager.cancel(batch_id)
            raise StackError(f"batch {batch_id} not finished after {timeout_s:.0f}s (cancelled)")
        time.sleep(2.0)


def report(
    results: list[TaskResult], redis_url: str, out: Path, roles: dict[str, str]
) -> tuple[list, list[dict]]:
    """Print and append one metrics line per trajectory; returns the trainable (result, record)
    pairs and the lines."""
    client = redis.Redis.from_url(redis_url)
    records = []
    rows = []
    say(f"{'trajectory':<34} {'status':<10} {'reward':>6} {'turns':>5} {'gen tok':>7}  engine")
    with out.open("a") as f:
        for res in sorted(results, key=lambda r: r.task_id):
            o = res.outcome
            try:
                rec = load_trajectory(client, res.trajectory_id)
            except KeyError:
                rec = None
            engines = sorted({t.engine for s in rec.segments for t in s.turns}) if rec else []
            reward = "-" if o.reward is None else f"{o.reward:.0f}"
            say(f"{res.trajectory_id:<34} {o.status!s:<10} {reward:>6} "
                f"{rec.n_turns if rec else 0:>5} {rec.n_generated_tokens if rec else 0:>7}  "
                f"{','.join(e.rsplit(':', 1)[-1] for e in engines)}"
                + (f"  ({o.abort_reason})" if o.abort_reason else ""))  # fmt: skip
            rows.append({"kind": "trajectory", "trajectory_id": res.trajectory_id,
                         "group_id": rec.meta.group_id if rec else None,
                         "sample_index": rec.meta.extra.get("sample_index") if rec else None,
                         "engines": [roles.get(e, e) for e in engines],
                         "status": str(o.status), "reward": o.reward,
                         "turns": rec.n_turns if rec else 0,
                         "durations": o.durations})  # fmt: skip
            f.write(json.dumps(rows[-1]) + "\n")
            if rec is not None and o.trainable and rec.segments:
                records.append((res, rec))
    client.close()
    return records, rows


def summary(rows: list[dict], objective: dict | None) -> dict:
    """``--json``: the trajectories, the rewards of each group, and the objective's figures."""
    groups: dict[str, list] = {}
    for row in rows:
        groups.setdefault(str(row["group_id"]), []).append(row["reward"])
    mixed = [g for g, rewards in groups.items() if len(set(rewards) - {None}) > 1]
    return {"trajectories": rows, "groups": groups, "mixed_groups": sorted(mixed),
            "objective": objective}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir = args.run_dir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    cache = Path(os.environ.get("SWERL_CACHE_DIR", Path.home() / ".cache" / "swerl"))
    model = ensure_tiny_model(cache / "tiny-model")
    instances = load_instances(args.instances)[: args.limit]
    script = write_script(instances, run_dir / "scripted-policy.jsonl")
    say(f"run dir {run_dir}; tiny model {model}; {len(instances)} instances x {args.samples}")
    stack = LocalStack(run_dir)
    manager: RolloutManager | None = None
    try:
        redis_url, adapter_url, roles = start_services(stack, args, model, script)
        manager = RolloutManager(redis_url)
        manager.start()
        start_worker(stack, args, redis_url, adapter_url, manager)
        request = RolloutRequest(
            instance_ids=[i.instance_id for i in instances],
            n_samples=args.samples,
            limits=AgentLimits(max_steps=args.max_steps, wall_time_s=args.timeout / 2),
            sampling=SamplingConfig(temperature=1.0, max_tokens=2048),
        )
        batch_id = manager.submit(request)
        say(f"submitted batch {batch_id}: {len(instances) * args.samples} trajectories")
        results = wait_for_batch(manager, batch_id, args.timeout)
        records, rows = report(results, redis_url, run_dir / "metrics.jsonl", roles)
        metrics = None
        if records:
            from services.demo_objective import evaluate_objective

            metrics = evaluate_objective(model, records)
            with (run_dir / "metrics.jsonl").open("a") as f:
                f.write(json.dumps({"kind": "objective", **metrics}) + "\n")
            for key in ("max_abs_logprob_diff", "actor_loss", "critic_loss", "estimator",
                        "n_trajectories", "n_action_tokens", "mixed_groups"):  # fmt: skip
                say(f"objective {key}: {metrics.get(key)}")
        if args.json is not None:
            args.json.write_text(json.dumps(summary(rows, metrics), indent=2) + "\n")
        say(f"done; logs and metrics.jsonl in {run_dir}")
        return 0
    except StackError as exc:
        print(f"[demo] error: {exc}", file=sys.stderr)
        return 1
    finally:
        if manager is not None:
            manager.close()
        stack.stop_all()


if __name__ == "__main__":
    sys.exit(main())
