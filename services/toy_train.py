"""A real training run on the toy task: the whole stack on this machine, then ``python -m
trainer train`` (a composer: it starts the planes as processes).

``python -m services.toy_train --config trainer/configs/toy_grpo.yaml --run-dir DIR`` starts
Redis, a reference engine serving the warm-started toy model
(``$SWERL_CACHE_DIR/tiny-model-toy-v2``, docs/toy-task.md), the adapter in training mode with an
admin token (the publisher refreshes the weights every step), a toy-only sandbox worker, and
the trainer with the manager's dispatch loop in its process (``train.run_dispatcher``). The
run's addresses, tokens and paths reach the trainer through the environment
(``SWERL_MANAGER__REDIS_URL``, ``SWERL_PUBLISH__*``, ``SWERL_TRAIN__RUN_DIR``,
``SWERL_TRAINER__MODEL``); everything else is the config file's.
Metrics: ``DIR/train/metrics.jsonl``; service logs ``DIR/*.log``. See docs/training.md.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import yaml

from services.local_stack import LocalStack, StackError, start_toy_services
from services.tiny_model.warm_start import DEFAULT_DIR_NAME

DESCRIPTION = __doc__.split("\n\n")[1] if __doc__ else ""


def toy_model_dir() -> Path:
    """The warm-started toy model (built by ``deploy/dev/setup.sh model``)."""
    cache = Path(os.environ.get("SWERL_CACHE_DIR", Path.home() / ".cache" / "swerl"))
    model = cache / DEFAULT_DIR_NAME
    if not (model / "config.json").is_file():
        raise StackError(f"{model} is missing: build it with `deploy/dev/setup.sh model`")
    return model


def seed_overrides(seed: int) -> dict[str, str]:
    """The run seed as config overrides: every seed of a toy run derives from it
    (``trainer.seed``: initialisation and the trainer's sampling; ``train.dataset.seed``: the
    prompt order); the engine's sampling takes :func:`engine_seed_args`. Trajectories' codes
    are drawn from their task ids (services/protocol/toy.py), which the run id fixes. Runs with
    one seed are not bit-identical: asynchronous timing decides which version samples what."""
    if seed < 0:
        raise StackError(f"--seed must be >= 0, got {seed}")
    return {"SWERL_TRAINER__SEED": str(seed), "SWERL_TRAIN__DATASET__SEED": str(seed)}


def engine_seed_args(seed: int) -> tuple[str, ...]:
    """The reference engine's sampler seed for requests without ``sampling_seed`` (derived
    from the run seed, so the engine's stream differs from the trainer's)."""
    return ("--seed", str(1_000_003 * seed + 17))


def trainer_env(run_dir: Path, model: Path, redis_url: str, adapter_url: str,
                admin_token: str) -> dict[str, str]:  # fmt: skip
    """The run's addresses and paths as config overrides of ``python -m trainer train``."""
    return {
        **os.environ,
        "SWERL_TRAIN__RUN_DIR": str(run_dir / "train"),
        "SWERL_TRAINER__MODEL": str(model),
        "SWERL_MANAGER__REDIS_URL": redis_url,
        "SWERL_PUBLISH__ADAPTER_URL": adapter_url,
        "SWERL_PUBLISH__ADMIN_TOKEN": admin_token,
        "SWERL_PUBLISH__WEIGHTS_DIR": str(run_dir / "weights"),
    }


def configured_steps(config: Path) -> int | None:
    """``train.steps`` of the run's YAML, for the progress bar (None when it cannot be read:
    the trainer validates the file and says what is wrong)."""
    try:
        steps = yaml.safe_load(config.read_text())["train"]["steps"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return steps if isinstance(steps, int) and steps > 0 else None


def progress_line(row: dict[str, Any], total: int | None, width: int = 20) -> str:
    """One step of the run as a progress line: bar, step, reward, phase, lag, step time."""
    step = int(row["step"])
    done = min(width, round(width * step / total)) if total else 0
    bar = "#" * done + "." * (width - done) if total else ""
    reward = row.get("reward/mean")
    lag = row.get("lag/mean")
    seconds = row.get("time/step")
    parts = [
        f"[{bar}] step {step}/{total}" if total else f"step {step}",
        f"reward {reward:.3f}" if isinstance(reward, (int, float)) else "reward -",
        f"phase {row.get('phase', '?')}",
        f"lag {lag:.1f}" if isinstance(lag, (int, float)) else "lag -",
        f"{seconds:.1f} s" if isinstance(seconds, (int, float)) else "",
    ]
    return "  ".join(p for p in parts if p)


class MetricsFollower:
    """Prints a progress line for every complete line the trainer appends to metrics.jsonl."""

    def __init__(self, path: Path, total: int | None, out: TextIO) -> None:
        self.path, self.total, self.out = path, total, out
        self.offset = 0

    def poll(self) -> None:
        if not self.path.is_file():
            return
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # only complete lines; a half-written one waits
        self.offset += end
        for line in data[:end].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # not a metrics row: the trainer's file, never ours to judge
            if isinstance(row, dict) and "step" in row:
                print(progress_line(row, self.total), file=self.out, flush=True)


def run(config: Path, run_dir: Path, steps: int | None, slots: int,
        out: TextIO | None = None, nproc: int = 1, seed: int = 0) -> int:  # fmt: skip
    """Start the toy stack, run the trainer to its end (a progress line per step on ``out``),
    stop the stack; ``seed`` is the run seed (:func:`seed_overrides`). The trainer's exit
    code."""
    run_dir.mkdir(parents=True, exist_ok=True)
    model = toy_model_dir()
    worker_token, admin_token = secrets.token_hex(16), secrets.token_hex(16)
    stack = LocalStack(run_dir)
    try:
        svc = start_toy_services(stack, model, worker_token, slots=slots, admin_token=admin_token,
                                 engine_args=engine_seed_args(seed))  # fmt: skip
        env = trainer_env(run_dir, model, svc.redis_url, svc.adapter_url, admin_token)
        env.update(seed_overrides(seed))
        return run_trainer(config, run_dir, steps, env, out, nproc)
    finally:
        stack.stop_all()


def trainer_command(config: Path, nproc: int = 1) -> list[str]:
    """``python -m trainer train --config config``; with ``nproc > 1`` under torchrun
    (``--standalone``: a rendezvous on loopback), rank 0 driving and the others following."""
    if nproc < 1:
        raise StackError(f"--nproc must be >= 1, got {nproc}")
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    train = ["-m", "trainer", "train", "--config", str(config)]
    return [sys.executable, *(launcher if nproc > 1 else []), *train]


def run_trainer(config: Path, run_dir: Path, steps: int | None, env: dict[str, str],
                out: TextIO | None = None, nproc: int = 1) -> int:  # fmt: skip
    """``python -m trainer train --config config`` to its end with ``env`` (a progress line
    per step on ``out``; the log in ``run_dir/trainer.log``), under torchrun with ``nproc``
    ranks when ``nproc > 1``. Its exit code."""
    cmd = trainer_command(config, nproc)
    cmd += ["--steps", str(steps)] if steps is not None else []
    total = steps if steps is not None else configured_steps(config)
    follower = MetricsFollower(run_dir / "train" / "metrics.jsonl", total, out or sys.stdout)
    with open(run_dir / "trainer.log", "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                follower.poll()
                time.sleep(0.5)
        finally:
            if proc.poll() is None:  # interrupted: stop the trainer with the stack
                proc.terminate()
                proc.wait(timeout=60)
        follower.poll()
        return proc.returncode


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m services.toy_train", description=DESCRIPTION)
    p.add_argument("--config", required=True, type=Path, help="the run's YAML (trainer/configs/)")
    p.add_argument("--run-dir", required=True, type=Path, help="logs, metrics, weights of the run")
    p.add_argument("--steps", type=int, help="override train.steps")
    p.add_argument("--slots", type=int, default=8, help="toy worker slots (8)")
    p.add_argument("--nproc", type=int, default=1,
                   help="trainer ranks (1); N > 1 runs torchrun --standalone with N CPU ranks: "
                        "FSDP2 data parallel over gloo, rank 0 drives")  # fmt: skip
    p.add_argument("--seed", type=int, default=0,
                   help="the run seed (0): trainer.seed, train.dataset.seed and the engine's "
                        "sampler derive from it (docs/training.md)")  # fmt: skip
    args = p.parse_args(argv)
    if args.nproc < 1:
        p.error(f"--nproc must be >= 1, got {args.nproc}")
    if args.seed < 0:
        p.error(f"--seed must be >= 0, got {args.seed}")
    # SIGTERM (a job runner, a test's timeout) unwinds like Ctrl-C: the trainer and every
    # service of the stack are stopped by run()'s finally blocks, none is left running.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        code = run(args.config, args.run_dir, args.steps, args.slots, nproc=args.nproc,
                   seed=args.seed)  # fmt: skip
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"trainer exit {code}; metrics in {args.run_dir / 'train' / 'metrics.jsonl'}; "
          f"dashboard: python -m trainer report {args.run_dir}")  # fmt: skip
    return code


if __name__ == "__main__":
    sys.exit(main())
