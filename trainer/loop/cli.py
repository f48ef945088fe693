"""``python -m trainer train --config FILE [--resume]``: run the training loop (see --help)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import redis
import yaml

from services.cli import configure_logging, service_parser
from services.config import ConfigError, load_config
from services.manager.client import RolloutManager
from services.manager.config import ManagerConfig
from trainer.config import TrainerConfig
from trainer.loop.config import DatasetConfig, EvalSet, TrainConfig, resolve_schedule
from trainer.publish import PublishConfig

if TYPE_CHECKING:
    from trainer.loop.ranks import Ranks

DESCRIPTION = """\
The training loop of swerl: rollouts through the rollout manager, Li2SAO (or a baseline) on the
trainer backend, each new version published to the adapter.

One YAML file configures it, four sections: train (phases, batch shapes, dataset, rollouts,
run directory; trainer.loop.config.TrainConfig), trainer (model, algorithm, objective,
batch.max_policy_lag, checkpoint dir), manager (redis_url, queue prefix) and publish (the
adapter; read only when train.publish is true). Environment overrides: SWERL_TRAIN__STEPS=5.
Per-step metrics go to RUN_DIR/metrics.jsonl and RUN_DIR/tensorboard/. See docs/training.md.
"""

EPILOG = """\
exit status: 0 done, 1 the run failed, 2 bad configuration (or launcher environment).

under torchrun (WORLD_SIZE > 1) rank 0 drives the run and the other ranks follow its backend
calls (docs/training.md "Several ranks").

examples:
  python -m trainer train --config run.yaml
  python -m trainer train --config run.yaml --resume        # continue from the last checkpoint
  python -m trainer train --config run.yaml --print-config  # the effective sections
  torchrun --nproc-per-node=8 -m trainer train --config run.yaml  # 8 ranks, one driver
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = service_parser("python -m trainer train", DESCRIPTION, EPILOG)
    p.add_argument("--config", metavar="FILE", help="YAML file with train/trainer/manager/publish")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--steps", type=int, metavar="N", help="override train.steps")
    p.add_argument("--log-level", default="INFO", metavar="LEVEL", help="log level (INFO)")
    p.add_argument("--print-config", action="store_true", help="print the effective config, exit")
    return p.parse_args(argv)


@dataclass(frozen=True)
class RunConfig:
    """The four sections of a training run's file."""

    train: TrainConfig
    trainer: TrainerConfig
    manager: ManagerConfig
    publish: PublishConfig | None

    def dump(self) -> str:
        data = {
            "train": self.train.model_dump(mode="json"),
            "trainer": self.trainer.model_dump(mode="json"),
            "manager": self.manager.model_dump(mode="json"),
        }
        if self.publish is not None:
            data["publish"] = {**self.publish.model_dump(mode="json"), "admin_token": "***"}
        return yaml.safe_dump(data, sort_keys=True)


def load_run_config(
    path: str | None, steps: int | None = None, environ: Mapping[str, str] | None = None
) -> RunConfig:
    """Every section the run needs, validated (ConfigError names every problem); ``environ``:
    the environment the run will see (default: this process's)."""
    overrides = {"steps": steps} if steps is not None else None
    env = {"path": path, "environ": environ}
    train = load_config(TrainConfig, section="train", overrides=overrides, **env)
    trainer = load_config(TrainerConfig, section="trainer", **env)
    manager = load_config(ManagerConfig, section="manager", **env)
    publish = load_config(PublishConfig, section="publish", **env) if train.publish else None
    try:
        resolve_schedule(train, trainer.algorithm)
    except ValueError as exc:
        raise ConfigError(f"invalid configuration [train]:\n  - train.schedule: {exc}") from None
    if train.dataset.mixture:  # every row of every file, before anything starts
        from trainer.loop.prompts import make_cursor

        try:
            make_cursor(train.dataset)
        except ValueError as exc:
            raise ConfigError(f"invalid configuration [train]:\n  - train.{exc}") from None
    return RunConfig(train, trainer, manager, publish)


MODEL_FIX = "set trainer.model (or $SWERL_TRAINER__MODEL) to a Hugging Face model directory"


def model_problems(model: str) -> list[str]:
    """``trainer.model`` as the backends will read it: a local directory with a config.json."""
    if not model:
        return [f"trainer.model is not set: {MODEL_FIX}"]
    path = Path(model)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        return [f"trainer.model {model} {what}: {MODEL_FIX}"]
    if not (path / "config.json").is_file():
        return [f"trainer.model {model} has no config.json (not a Hugging Face model "
                f"directory): {MODEL_FIX}"]  # fmt: skip
    return []


def _id_problems(ids: DatasetConfig | EvalSet, section: str) -> list[str]:
    """The instance-id files of one set (instances_file, deny_file), read as the run reads them."""
    from trainer.loop.prompts import load_instance_ids

    try:
        load_instance_ids(ids, section)
    except ValueError as exc:
        return [f"{exc} (fix the path or the file in the config)"]
    return []


def path_problems(cfg: RunConfig) -> list[str]:
    """What on this host the run would trip over only after it started (the model directory,
    the instance-id files of the dataset and of the held-out sets), each naming its key and
    the fix; a mixture's files are read by :func:`load_run_config` already."""
    problems = model_problems(cfg.trainer.model)
    if not cfg.train.dataset.mixture:
        problems += _id_problems(cfg.train.dataset, "train.dataset")
    sets = [("train.eval", cfg.train.eval), ("train.eval.shifted", cfg.train.eval.shifted)]
    for section, held_out in sets:
        if cfg.train.eval_interval and held_out is not None and not held_out.is_empty():
            problems += _id_problems(held_out, section)
    return problems


def _report(problems: list[str]) -> int:
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_run_config(args.config, args.steps)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problems = path_problems(cfg)
    if args.print_config:
        if problems:
            return _report(problems)
        print(cfg.dump(), end="")
        return 0
    from trainer.loop.ranks import RankError, init_ranks

    try:
        ranks = init_ranks(cfg.trainer.device)
    except RankError as exc:  # the launcher's environment first: it is wrong for any config
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if problems:
        return _report(problems)
    configure_logging(args.log_level)
    if ranks is None:
        return _drive(cfg, args.resume, None)
    code = _drive(cfg, args.resume, ranks) if ranks.leader else _follow(cfg, ranks)
    if code == 0:
        ranks.close()  # after a failure a rank may sit in a collective: torchrun ends the group
    return code


def _follow(cfg: RunConfig, ranks: Ranks) -> int:
    """A rank > 0: its backend makes rank 0's calls (trainer.loop.ranks); no Redis, no adapter."""
    from trainer.backends import create_backend
    from trainer.loop.ranks import follow

    log = logging.getLogger("swerl.train")
    log.info("rank %d of %d: following rank 0", ranks.rank, ranks.world)
    try:
        return 0 if follow(create_backend(cfg.trainer), ranks) else 1
    except Exception as exc:
        log.exception("rank %d failed", ranks.rank)
        print(f"error: rank {ranks.rank}: {exc}", file=sys.stderr)
        return 1


def _drive(cfg: RunConfig, resume: bool, ranks: Ranks | None) -> int:
    """The driver (the only process, or rank 0 of a group)."""
    from trainer.backends import create_backend
    from trainer.loop.driver import LoopParts, TrainLoop
    from trainer.loop.ranks import LeaderBackend
    from trainer.publish import make_publisher
    from trainer.publish.base import AdminClient

    manager = RolloutManager(cfg.manager.redis_url, cfg.manager)
    store = redis.Redis.from_url(cfg.manager.redis_url, decode_responses=False)
    publisher = make_publisher(cfg.publish) if cfg.publish is not None else None
    admin = None
    if cfg.publish is not None:
        admin = AdminClient(cfg.publish.adapter_url, cfg.publish.admin_token, cfg.publish.timeout_s)
    leader: LeaderBackend | None = None
    failed = True
    try:
        backend = create_backend(cfg.trainer)
        if ranks is not None:
            backend = leader = LeaderBackend(backend, ranks)  # type: ignore[assignment]
            log = logging.getLogger("swerl.train")
            log.info("rank 0 of %d: driving; the other ranks follow", ranks.world)
        if cfg.train.run_dispatcher:
            manager.start()
        served = (lambda: max(admin.served_versions())) if admin is not None else None
        parts = LoopParts(backend, manager, store, publisher, served)
        state = TrainLoop(cfg.train, cfg.trainer, parts, resume=resume).run()
        failed = False
    except Exception as exc:
        logging.getLogger("swerl.train").exception("training failed")
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if leader is not None:
            leader.stop(failed=failed)
        if publisher is not None:
            publisher.close()
        if admin is not None:
            admin.close()
        manager.close()
        store.close()
    print(json.dumps({"step": state["step"], "version": state["version"],
                      "phase": state["phases"]["phase"]}))  # fmt: skip
    return 0
