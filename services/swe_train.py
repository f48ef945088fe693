"""A short training run on the mini SWE instances: the SWE path of the whole stack, with real
OpenHands agents, real grading and real gradients.

``python -m services.swe_train --config trainer/configs/swe_mini_lisao.yaml --run-dir DIR``
starts Redis, two reference engines on the tiny model -- one in SCRIPTED mode (test machinery:
it replays the gold patch of each instance of the config as terminal commands, so its
trajectories can earn reward 1) and one sampling the policy -- the adapter in training mode
with placement ``sample_index`` (sample 0 of every group on the scripted engine, sample 1 on the
sampling one) and an admin token (the publisher refreshes both engines every step), a sandbox
worker running the OpenHands agent server in docker or bwrap sandboxes with SWE-bench grading,
then ``python -m trainer train`` with the manager's dispatch loop in its process.

The scripted engine marks its answers (``meta_info.scripted``); the adapter records those turns
as ``scripted`` and the trainer keeps them out of the loss (context only: no ratio, value or
advantage), while their rewards stay in the group statistics, so the sampled trajectories get a
real baseline, non-zero advantages and real gradients. This proves the SWE path trains and
publishes; it makes no learning claim (a random 2-layer model does not learn SWE tasks).
Metrics: ``DIR/train/metrics.jsonl`` (``data/scripted_tokens``, ``actor/grad_norm``, ...);
service logs ``DIR/*.log``. See docs/training.md "The SWE path".
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import yaml

from sandbox_worker.images import DEFAULT_INSTANCES
from sandbox_worker.tasks.scripted import ScriptBuildError, write_script
from services.datasets import DatasetError, load_instances
from services.local_stack import LocalStack, StackError, adapter_env
from services.processes import free_port, http_ok
from services.queue.config import QueueConfig
from services.queue.submitter import SubmitterQueue
from services.tiny_model.build import ensure_tiny_model
from services.toy_train import run_trainer, trainer_env

DESCRIPTION = __doc__.split("\n\n")[1] if __doc__ else ""
NODE = "swe-train-node"


@dataclass(frozen=True)
class SWEServices:
    """Where the stack of :func:`start_swe_services` listens."""

    redis_url: str
    scripted_url: str
    sampling_url: str
    adapter_url: str


def config_instance_ids(config: Path) -> list[str]:
    """``train.dataset.instance_ids`` of the run's YAML: the instances the scripted engine must
    know (StackError naming the problem when there are none)."""
    try:
        ids = yaml.safe_load(config.read_text())["train"]["dataset"]["instance_ids"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise StackError(f"{config}: no train.dataset.instance_ids ({exc})") from exc
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise StackError(f"{config}: train.dataset.instance_ids must be a non-empty id list")
    return ids


def start_swe_services(
    stack: LocalStack,
    model: Path,
    script: Path,
    instances_file: Path,
    *,
    backend: str,
    slots: int,
    worker_token: str,
    admin_token: str,
) -> SWEServices:
    """Redis, the scripted and the sampling engine, the adapter (placement sample_index, in that
    engine order) and a SWE sandbox worker on ``backend``."""
    redis_url = stack.start_redis()
    scripted = stack.start_reference_engine("engine-scripted", model, script)
    sampling = stack.start_reference_engine("engine-sampling", model)
    port = free_port()
    adapter_url = f"http://127.0.0.1:{port}"
    env = {**adapter_env(worker_token, admin_token), "SWERL_ADAPTER__PLACEMENT": "sample_index"}
    stack.python("adapter", "adapter",
                 ["--engines", f"{scripted},{sampling}", "--model", str(model),
                  "--redis", redis_url, "--port", str(port)],
                 http_ok(f"{adapter_url}/health"), env=env)  # fmt: skip
    queue = SubmitterQueue(redis_url, QueueConfig())

    def alive() -> bool:
        return any(n.name == NODE and n.alive for n in queue.nodes())

    worker_env = {
        "SWERL_WORKER__ROLLOUT__ADAPTER_URL": adapter_url,
        "SWERL_WORKER__ROLLOUT__ADAPTER_TOKEN": worker_token,
        "SWERL_WORKER__ROLLOUT__INSTANCES": json.dumps([str(instances_file.resolve())]),
    }
    try:
        stack.python("worker", "sandbox_worker",
                     ["--redis", redis_url, "--node", NODE, "--slots", str(slots),
                      "--backend", backend, "--kinds", "swe"],
                     alive, env=worker_env, timeout_s=120)  # fmt: skip
    finally:
        queue.close()
    return SWEServices(redis_url, scripted, sampling, adapter_url)


def run(config: Path, run_dir: Path, *, instances_file: Path, backend: str, slots: int,
        steps: int | None, out: TextIO | None = None) -> int:  # fmt: skip
    """Start the SWE stack, run the trainer to its end, stop the stack. The trainer's exit code."""
    ids = config_instance_ids(config)
    try:
        instances = load_instances(instances_file, only=ids)
    except (DatasetError, OSError) as exc:
        raise StackError(f"--instances {instances_file}: {exc}") from exc
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        script = write_script(instances, run_dir / "scripted-policy.jsonl")
    except ScriptBuildError as exc:
        raise StackError(f"the scripted policy cannot be built: {exc}") from exc
    cache = Path(os.environ.get("SWERL_CACHE_DIR", Path.home() / ".cache" / "swerl"))
    model = ensure_tiny_model(cache / "tiny-model")
    worker_token, admin_token = secrets.token_hex(16), secrets.token_hex(16)
    stack = LocalStack(run_dir)
    try:
        svc = start_swe_services(stack, model, script, instances_file, backend=backend,
                                 slots=slots, worker_token=worker_token,
                                 admin_token=admin_token)  # fmt: skip
        env = trainer_env(run_dir, model, svc.redis_url, svc.adapter_url, admin_token)
        return run_trainer(config, run_dir, steps, env, out)
    finally:
        stack.stop_all()


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m services.swe_train", description=DESCRIPTION)
    p.add_argument("--config", required=True, type=Path,
                   help="the run's YAML (trainer/configs/swe_mini_lisao.yaml)")  # fmt: skip
    p.add_argument("--run-dir", required=True, type=Path, help="logs, metrics, weights of the run")
    p.add_argument("--instances", type=Path, default=DEFAULT_INSTANCES,
                   help="SWE-bench-format dataset holding the config's instance ids "
                        "(default: the mini set in tests/data)")  # fmt: skip
    p.add_argument(
        "--backend",
        choices=["docker", "bwrap"],
        default="docker",
        help="sandbox backend of the worker (docker: $DOCKER_HOST's engine)",
    )
    p.add_argument("--slots", type=int, default=2, help="sandbox slots of the worker (2)")
    p.add_argument("--steps", type=int, help="override train.steps")
    args = p.parse_args(argv)
    if args.slots < 1 or (args.steps is not None and args.steps < 1):
        p.error("--slots and --steps must be >= 1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    signal.signal(signal.SIGTERM, _exit_on_signal)  # unwinds: the stack is stopped
    try:
        code = run(args.config, args.run_dir, instances_file=args.instances,
                   backend=args.backend, slots=args.slots, steps=args.steps)  # fmt: skip
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"trainer exit {code}; metrics in {args.run_dir / 'train' / 'metrics.jsonl'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
