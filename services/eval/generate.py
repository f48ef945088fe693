"""Generation mode: run the training scaffold on every instance and write ``predictions.jsonl``.

With ``--model-url`` the engines are replaced by any OpenAI-compatible endpoint: the adapter
runs in relay mode (``adapter/relay.py``) and records text-only trajectories; the rest is the
same.

The same path as a training rollout, on one machine (``services/local_stack.py``, as
``services/demo.py`` composes it): a private Redis, the engines (``--engine-url``: SGLang
serving the checkpoint; else the reference engine on CPU, scripted with ``--engine-script``),
the adapter in front of them (recording token ids as in training), a sandbox worker running the
OpenHands agent server in each instance's sandbox with the training limits (steps, wall time,
context), and the rollout manager queueing one trajectory per instance. Each trajectory's patch
becomes a prediction; its record is kept under ``trajectories/``. An aborted trajectory (an
infrastructure failure) gets no prediction: the run report lists it as incomplete.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path

import redis

from services.datasets.predictions import Prediction
from services.demo import WORKER_TOKEN, start_worker, wait_for_batch
from services.local_stack import LocalStack, StackError
from services.manager.client import RolloutManager, tasks_for_request
from services.protocol import AgentLimits, RolloutRequest, SamplingConfig, TaskResult
from services.protocol.instance import SWEInstance
from services.store.trajectories import load_trajectory

PREDICTIONS_FILE = "predictions.jsonl"
TRAJECTORIES_DIR = "trajectories"


def say(msg: str) -> None:
    print(f"[eval] {msg}", file=sys.stderr, flush=True)


def model_name(args: argparse.Namespace) -> str:
    if args.model_name:
        return str(args.model_name)
    return str(args.upstream_model) if args.model_url else Path(args.model).name


def start_engines_and_adapter(stack: LocalStack, args: argparse.Namespace) -> tuple[str, str]:
    """Redis, the engines (unless --engine-url) and the adapter -- or, with --model-url, the
    adapter relaying to that endpoint (text-only records); their URLs."""
    redis_url = stack.start_redis()
    env = {"SWERL_ADAPTER__WORKER_TOKEN": WORKER_TOKEN}
    if args.model_url:
        say(f"relaying to {args.model_url} (model {args.upstream_model}): text-only records")
        url = stack.start_relay_adapter(
            args.model_url, args.upstream_model, args.api_key_env, redis_url, env
        )
        return redis_url, url
    engines = list(args.engine_url or [])
    if not engines:
        script = Path(args.engine_script) if args.engine_script else None
        engines.append(stack.start_reference_engine("engine", Path(args.model), script))
    say(f"engines: {', '.join(engines)}")
    adapter_url = stack.start_adapter(engines, Path(args.model), redis_url, env)
    return redis_url, adapter_url


def _write(
    results: list[TaskResult], request: RolloutRequest, redis_url: str, out: Path, name: str
) -> dict[str, Prediction]:
    """Append each finished trajectory's prediction; keep its record."""
    instance_of = {t.task_id: t.instance_id for t in tasks_for_request(request)}
    client = redis.Redis.from_url(redis_url)
    written: dict[str, Prediction] = {}
    (out / TRAJECTORIES_DIR).mkdir(exist_ok=True)
    try:
        with (out / PREDICTIONS_FILE).open("a") as f:
            for res in results:
                iid = instance_of[res.task_id]
                try:
                    record = load_trajectory(client, res.trajectory_id)
                    text = json.dumps(record.to_json())
                    (out / TRAJECTORIES_DIR / f"{iid}.json").write_text(text)
                except KeyError:
                    pass
                if not res.outcome.trainable:
                    say(f"{iid}: aborted ({res.outcome.abort_reason}): no prediction")
                    continue
                pred = Prediction(instance_id=iid, model_name_or_path=name,
                                  model_patch=res.outcome.patch)  # fmt: skip
                f.write(json.dumps(pred.model_dump()) + "\n")
                written[iid] = pred
    finally:
        client.close()
    return written


def generate(args: argparse.Namespace, instances: list[SWEInstance], out: Path) -> tuple[Path, int]:
    """Predictions for ``instances`` (those already in ``out/predictions.jsonl`` are kept);
    the file's path and how many trajectories aborted. Raises :class:`StackError` when a
    service does not start or the generation times out."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / PREDICTIONS_FILE
    done = set()
    if path.exists():
        done = {json.loads(line)["instance_id"] for line in path.read_text().splitlines() if line}
    todo = [inst.instance_id for inst in instances if inst.instance_id not in done]
    say(f"generating {len(todo)} prediction(s) ({len(done)} already in {path})")
    if not todo:
        return path, 0
    stack = LocalStack(out)
    manager: RolloutManager | None = None
    try:
        redis_url, adapter_url = start_engines_and_adapter(stack, args)
        manager = RolloutManager(redis_url)
        manager.start()
        node = f"eval-gen-{secrets.token_hex(3)}"
        for key, value in (
            ("IMAGE_NAMESPACE", args.image_namespace),
            ("IMAGE_TAG", args.image_tag),
        ):
            if value:  # the worker's image naming (worker.rollout.image_namespace / image_tag)
                os.environ[f"SWERL_WORKER__ROLLOUT__{key}"] = value
        worker_args = argparse.Namespace(
            instances=args.dataset, slots=args.workers, backend=args.backend
        )
        start_worker(stack, worker_args, redis_url, adapter_url, manager, node, say)
        request = RolloutRequest(
            instance_ids=todo,
            n_samples=1,
            limits=AgentLimits(
                max_steps=args.max_steps,
                wall_time_s=args.wall_time,
                max_context_tokens=args.max_context,
            ),
            sampling=SamplingConfig(temperature=args.temperature),
        )
        batch_id = manager.submit(request)
        results = wait_for_batch(manager, batch_id, args.generation_timeout, say)
        written = _write(results, request, redis_url, out, model_name(args))
    finally:
        if manager is not None:
            manager.close()
        stack.stop_all()
    return path, len(todo) - len(written)


__all__ = ["PREDICTIONS_FILE", "StackError", "generate"]
