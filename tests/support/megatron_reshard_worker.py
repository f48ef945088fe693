"""Two ranks of the checkpoint resharding test: ``python -m tests.support.megatron_reshard_worker``.

Arguments: RANK WORLD PORT GQA_DIR TINY_DIR BATCH_FILE TINY_BATCH_FILE DIR OUT_FILE. One process
pair (megatron-core's import costs seconds per process) serves three checks of
``tests/unit/trainer/backends/megatron/test_reshard.py``:

* ``tp2``: TP=2 on the 2-KV-head model takes a step, saves ``DIR/tp2`` and takes the next step
  (its metrics and whole weights: what the checkpoint resharded to TP=1 must continue with);
* ``from_tp1``: a fresh TP=2 backend loads ``DIR/tp1-as-tp2`` (a one-process checkpoint the
  test resharded to TP=2 before starting the ranks) and takes the next step;
* ``pp2``: PP=2 on the tiny model (one layer per stage) takes a step, saves ``DIR/pp2`` and
  takes the next step.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from tests.support.megatron_pp_worker import BATCH as PP_BATCH
from tests.support.megatron_resume import snapshot
from tests.support.ranks import rank_main
from trainer.backends import StepObjective
from trainer.backends.megatron.backend import MegatronBackend
from trainer.config import TrainerConfig

LR = 1e-3
CONFIG = {"actor": {"lr": LR}, "critic": {"optimizer": {"lr": LR}}}
OBJECTIVE = StepObjective(algorithm="li2sao", phase="bootstrap")


def make(model_dir: str, seed: int = 0, **settings: Any) -> MegatronBackend:
    config = TrainerConfig(model=model_dir, backend="megatron", seed=seed, **settings, **CONFIG)
    return MegatronBackend(config)


def save_and_continue(backend: MegatronBackend, batch: Any, directory: Path) -> dict[str, Any]:
    """A step, a checkpoint, the next step: its metrics and whole weights."""
    backend.train_step(batch, OBJECTIVE)
    backend.save(directory, extra={"cursor": 1})
    return {"metrics": backend.train_step(batch, OBJECTIVE), "weights": snapshot(backend)}


def run(world: int, args: list[str]) -> dict[str, Any]:
    from megatron.core import parallel_state

    gqa, tiny, batch_file, tiny_batch_file, directory = args[:5]
    root = Path(directory)
    batch = torch.load(batch_file, weights_only=False)
    tensor = {"megatron": {"tensor_parallel": world}}
    result = {"tp2": save_and_continue(make(gqa, **tensor), batch, root / "tp2")}
    fresh = make(gqa, 7, **tensor)
    fresh.load(root / "tp1-as-tp2")
    metrics = fresh.train_step(batch, OBJECTIVE)
    result["from_tp1"] = {"metrics": metrics, "weights": snapshot(fresh)}
    parallel_state.destroy_model_parallel()
    tiny_batch = torch.load(tiny_batch_file, weights_only=False)
    pipeline = make(tiny, megatron={"pipeline_parallel": world}, batch=PP_BATCH)
    result["pp2"] = save_and_continue(pipeline, tiny_batch, root / "pp2")
    return result


if __name__ == "__main__":
    raise SystemExit(rank_main(run, sys.argv[-1]))
