"""The toy training run as a train job of the job API: what ``make demo`` runs first.

``python -m services.toy_train_job --config trainer/configs/toy_li2sao.yaml --run-dir DIR``
starts the toy stack of ``python -m services.toy_train`` (Redis, a reference engine on the
warm-started toy model, the adapter with an admin token, a toy-only sandbox worker), then the
job API (``python -m services.api``, one bearer token made for the run) and a trainer service
(``python -m trainer serve``) whose base run config is the given file. It submits the run with
the ``swerl`` CLI (``swerl submit train``: the file's algorithm, steps and batch shape, its
training ids as the dataset file) and follows it with ``swerl status JOB --watch`` until the
job ends: the same path a cluster user takes (docs/api.md). The trainer service writes the
run under ``DIR/jobs/<job id>`` (``DIR/train`` links to it, so ``python -m trainer report DIR``
finds it); the published weights go to ``DIR/weights``, checkpoints to ``DIR/checkpoints``,
service logs to ``DIR/*.log``, the job as the API last showed it to ``DIR/job.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from services.api.config import cache_dir
from services.local_stack import LocalStack, StackError, start_toy_services
from services.processes import free_port, http_ok
from services.toy_train import engine_seed_args, toy_model_dir
from trainer.loop.config import ToyPrompts

DESCRIPTION = __doc__.split("\n\n")[1] if __doc__ else ""
LEASE_TTL_S = 6.0  # the job's progress is heartbeated every ttl / 3 = 2 s
CLI = [sys.executable, "-m", "services.swerl_cli"]


class JobFileError(ValueError):
    """The run config cannot be submitted as a train job (the message says why)."""


def split_config(
    config: dict[str, Any], steps: int | None, seed: int | None = None
) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """The run config as (the trainer service's base config, the training ids for the job's
    dataset file, the job's train spec without ``model``, ``dataset``, ``checkpoint_dir``).

    The job carries what a user submits (algorithm, steps, batch shape, dataset); the base
    keeps the rest (rollout settings, gate, held-out evaluation, optimiser). A train spec sets
    the single phase's batch to prompts x samples, so a file whose single batch differs from
    its bootstrap batch cannot be submitted as it is. ``toy_prompts`` are expanded into the
    ids; ``seed`` (the run seed) sets ``trainer.seed`` and ``train.dataset.seed`` of the base.
    """
    try:
        train, trainer = dict(config["train"]), dict(config["trainer"])
    except (KeyError, TypeError):
        raise JobFileError("the run config needs train: and trainer: sections") from None
    dataset = dict(train.get("dataset") or {})
    toy = dataset.pop("toy_prompts", None)
    try:
        ids = ToyPrompts.model_validate(toy).ids() if toy is not None else []
    except ValueError as exc:
        raise JobFileError(f"train.dataset.toy_prompts: {exc}") from None
    ids += [str(i) for i in dataset.pop("instance_ids", None) or []]
    if not ids:
        raise JobFileError(
            "train.dataset has no instance_ids or toy_prompts: nothing to put in the job"
        )
    boot = train.get("bootstrap") or {}
    prompts, samples = int(boot.get("prompts", 8)), int(boot.get("group_size", 8))
    single = (train.get("single") or {}).get("batch_size")
    if single is not None and int(single) != prompts * samples:
        raise JobFileError(
            f"train.single.batch_size {single} is not bootstrap prompts x group_size "
            f"({prompts} x {samples}): a train job sets both"
        )
    total = steps if steps is not None else train.get("steps")
    if not isinstance(total, int) or total < 1:
        raise JobFileError("train.steps must be a positive integer (or pass --steps)")
    if seed is not None:
        dataset["seed"] = seed
        trainer["seed"] = seed
    train["dataset"] = dataset
    for key in ("run_dir", "run_id", "steps"):  # the job's: <runs_dir>/<job id>, its steps
        train.pop(key, None)
    spec = {
        "algorithm": str(trainer.get("algorithm", "li2sao")),
        "steps": total,
        "batch": {"prompts_per_step": prompts, "samples_per_prompt": samples},
    }
    return {**config, "train": train, "trainer": trainer}, ids, spec


def submit_argv(spec: dict[str, Any], model: Path, dataset: Path, checkpoints: Path,
                key: str) -> list[str]:  # fmt: skip
    """``swerl submit train ...`` for the job (the token and URL travel in the environment)."""
    batch = spec["batch"]
    return ["submit", "train", "--model", str(model), "--dataset", str(dataset),
            "--steps", str(spec["steps"]), "--checkpoint-dir", str(checkpoints),
            "--algorithm", spec["algorithm"],
            "--prompts-per-step", str(batch["prompts_per_step"]),
            "--samples-per-prompt", str(batch["samples_per_prompt"]),
            "--idempotency-key", key]  # fmt: skip


def swerl(
    args: list[str], env: dict[str, str], capture: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run the ``swerl`` CLI, echoing the command as a user would type it."""
    print("$ swerl " + " ".join(args), flush=True)
    return subprocess.run([*CLI, *args], env=env, text=True, check=False,
                          stdout=subprocess.PIPE if capture else None)  # fmt: skip


def start_job_services(stack: LocalStack, run_dir: Path, base: dict[str, Any], redis_url: str,
                       env: dict[str, str], token: str) -> str:  # fmt: skip
    """The job API and a trainer service (base run config ``base``). The API's URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tokens = f"[{{name: demo, token: {token}, scopes: [read, submit]}}]"
    # The job's paths (api.paths): the model in the cache, the run's dataset file and
    # checkpoints in the run dir.
    roots = {"SWERL_API__PATHS__INPUTS": json.dumps([str(run_dir), str(cache_dir())]),
             "SWERL_API__PATHS__OUTPUTS": json.dumps([str(run_dir)])}  # fmt: skip
    stack.python("api", "services.api",
                 ["--redis", redis_url, "--port", str(port), "--runner-threads", "0"],
                 http_ok(f"{url}/healthz"), env={"SWERL_API__TOKENS": tokens, **roots},
                 timeout_s=60)  # fmt: skip
    base_path = run_dir / "trainer-base.yaml"
    base_path.write_text(yaml.safe_dump(base, sort_keys=False))
    service = {"trainer_service": {"base_config": str(base_path), "lease_ttl_s": LEASE_TTL_S,
                                   "poll_interval_s": 0.5}}  # fmt: skip
    (run_dir / "trainer-service.yaml").write_text(yaml.safe_dump(service))
    start_trainer_service(stack, "trainer-service", run_dir, redis_url, env)
    return url


def start_trainer_service(stack: LocalStack, name: str, run_dir: Path, redis_url: str,
                          env: dict[str, str]) -> None:  # fmt: skip
    """A trainer service (``python -m trainer serve``) on ``run_dir/trainer-service.yaml``,
    its job runs under ``run_dir/jobs``; more than one may run (each claims its own job)."""
    stack.python(name, "trainer",
                 ["serve", "--config", str(run_dir / "trainer-service.yaml"), "--redis",
                  redis_url, "--runs-dir", str(run_dir / "jobs")],
                 lambda: True, env=env)  # fmt: skip


def run(config: Path, run_dir: Path, steps: int | None, slots: int, seed: int = 0) -> int:
    """Start the stack, submit the run as a train job, follow it to its end, stop the stack.
    ``seed`` is the run seed (services/toy_train.py ``seed_overrides``). 0 when the job
    succeeded."""
    try:
        raw = yaml.safe_load(config.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise JobFileError(f"{config}: {exc}") from None
    base, ids, spec = split_config(raw if isinstance(raw, dict) else {}, steps, seed)
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    dataset = run_dir / "train-ids.txt"
    dataset.write_text("\n".join(ids) + "\n")
    model = toy_model_dir()
    worker_token, admin_token, api_token = (secrets.token_hex(16) for _ in range(3))
    stack = LocalStack(run_dir)
    try:
        svc = start_toy_services(stack, model, worker_token, slots=slots, admin_token=admin_token,
                                 engine_args=engine_seed_args(seed))  # fmt: skip
        trainer_env = {  # the deployment's settings; the job's come from its spec
            "SWERL_MANAGER__REDIS_URL": svc.redis_url,
            "SWERL_PUBLISH__ADAPTER_URL": svc.adapter_url,
            "SWERL_PUBLISH__ADMIN_TOKEN": admin_token,
            "SWERL_PUBLISH__WEIGHTS_DIR": str(run_dir / "weights"),
        }
        url = start_job_services(stack, run_dir, base, svc.redis_url, trainer_env, api_token)
        return submit_and_follow(url, api_token, spec, model, dataset, run_dir)
    finally:
        stack.stop_all()


def submit_and_follow(url: str, token: str, spec: dict[str, Any], model: Path, dataset: Path,
                      run_dir: Path) -> int:  # fmt: skip
    env = {**os.environ, "SWERL_API_URL": url, "SWERL_API_TOKEN": token}
    key = f"demo-{run_dir.name}-{secrets.token_hex(4)}"
    done = swerl(submit_argv(spec, model, dataset, run_dir / "checkpoints", key), env, True)
    print(done.stdout, end="", flush=True)
    if done.returncode != 0 or not done.stdout.split():
        raise StackError(f"swerl submit failed (exit {done.returncode})")
    job_id = done.stdout.split()[0]
    (run_dir / "train").unlink(missing_ok=True)
    (run_dir / "train").symlink_to(Path("jobs") / job_id)  # trainer report DIR finds the run
    code = swerl(["status", job_id, "--watch"], env).returncode
    swerl(["status", job_id], env)
    shown = subprocess.run([*CLI, "--json", "status", job_id], env=env, text=True,
                           stdout=subprocess.PIPE, check=False).stdout  # fmt: skip
    (run_dir / "job.json").write_text(shown)
    job = json.loads(shown) if shown.strip() else {}
    if code != 0:
        log = run_dir / "jobs" / job_id / f"attempt-{job.get('attempt', 1)}.log"
        print(f"the job did not succeed (swerl exit {code}); its log: {log}", file=sys.stderr)
    return code


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m services.toy_train_job", description=DESCRIPTION)
    p.add_argument("--config", required=True, type=Path, help="the run's YAML (trainer/configs/)")
    p.add_argument("--run-dir", required=True, type=Path, help="logs, the job's run, weights")
    p.add_argument("--steps", type=int, help="override train.steps")
    p.add_argument("--slots", type=int, default=8, help="toy worker slots (8)")
    p.add_argument("--seed", type=int, default=0,
                   help="the run seed (0): trainer.seed, train.dataset.seed and the engine's "
                        "sampler derive from it")  # fmt: skip
    args = p.parse_args(argv)
    if args.seed < 0:
        p.error(f"--seed must be >= 0, got {args.seed}")
    signal.signal(signal.SIGTERM, _exit_on_signal)  # unwind: every service is stopped
    try:
        code = run(args.config, args.run_dir, args.steps, args.slots, args.seed)
    except (StackError, JobFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"job exit {code}; run in {args.run_dir / 'train'}; "
          f"dashboard: python -m trainer report {args.run_dir}")  # fmt: skip
    return code


if __name__ == "__main__":
    sys.exit(main())
