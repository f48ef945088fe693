"""The toy stack for train-job tests: Redis, the reference engine on the warm-started toy
model, the adapter and a toy worker (``services.local_stack``), plus the job's spec and the
deployment's trainer environment, ready for ``start_job_services``."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from services.local_stack import LocalStack, start_toy_services
from services.toy_train import toy_model_dir
from services.toy_train_job import split_config
from tests.support.paths import REPO_ROOT


@dataclass
class ToyJobStack:
    stack: LocalStack
    run_dir: Path
    base: dict[str, Any]  # the trainer service's base run config
    spec: dict[str, Any]  # the job's spec: model, dataset, checkpoint dir, steps, batch
    env: dict[str, str]  # the deployment's trainer environment (Redis, adapter, weights)
    redis_url: str
    token: str  # the job API's token (scopes read, submit)

    @property
    def checkpoints(self) -> Path:
        return Path(self.spec["checkpoint_dir"])


@contextmanager
def toy_job_stack(
    tmp_path: Path, steps: int, train: dict[str, Any] | None = None
) -> Iterator[ToyJobStack]:
    """The toy Li2SAO run (``trainer/configs/toy_li2sao.yaml``, ``train`` laid over its train
    section) as a job of ``steps`` steps on a running toy stack; stopped at the end."""
    raw = yaml.safe_load((REPO_ROOT / "trainer" / "configs" / "toy_li2sao.yaml").read_text())
    raw["train"].update(train or {})
    base, ids, spec = split_config(raw, steps)
    run_dir = tmp_path / "toy"
    run_dir.mkdir()
    dataset = run_dir / "train-ids.txt"
    dataset.write_text("\n".join(ids) + "\n")
    model = toy_model_dir()
    worker, admin, token = (secrets.token_hex(16) for _ in range(3))
    stack = LocalStack(run_dir)
    try:
        svc = start_toy_services(stack, model, worker, slots=8, admin_token=admin)
        env = {"SWERL_MANAGER__REDIS_URL": svc.redis_url,
               "SWERL_PUBLISH__ADAPTER_URL": svc.adapter_url,
               "SWERL_PUBLISH__ADMIN_TOKEN": admin,
               "SWERL_PUBLISH__WEIGHTS_DIR": str(run_dir / "weights")}  # fmt: skip
        full = {**spec, "model": str(model), "dataset": str(dataset),
                "checkpoint_dir": str(run_dir / "checkpoints")}  # fmt: skip
        yield ToyJobStack(stack, run_dir, base, full, env, svc.redis_url, token)
    finally:
        stack.stop_all()
