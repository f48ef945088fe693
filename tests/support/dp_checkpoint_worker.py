"""One rank of the data-parallel resume test: ``python -m tests.support.dp_checkpoint_worker``.

Arguments: RANK WORLD PORT MODEL_DIR BATCH_FILE CKPT_DIR OUT_DIR. Backend ``a`` takes a step
on the batch, saves a sharded checkpoint (every rank writes its shards), draws from every RNG,
and takes a second step on the batch with flipped rewards; backend ``b`` (another seed) loads
the checkpoint, draws, and takes the same second step. Each rank writes to
``OUT_DIR/rank-R.pt``: both runs' RNG draws, metrics and whole weights after the second step,
the extra state ``b`` got back, and the whole weights at the save.
"""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from tests.support.ranks import join_group
from trainer.backends import StepObjective
from trainer.backends.parallel import full_tensor
from trainer.backends.torch_backend import TorchBackend
from trainer.config import TrainerConfig

CONFIG = {
    "actor": {"lr": 1e-3, "warmup_steps": 3},
    "critic": {"optimizer": {"lr": 1e-3}, "updates_per_step": 2},
}
EXTRA = {"gate": {"ready": False, "window": [0.5, 0.25]}, "cursor": {"batch": 7}}


def draws() -> list[float]:
    """One draw from each RNG a step could use (torch, Python, numpy)."""
    return [float(torch.rand(())), random.random(), float(np.random.rand())]


def weights(b: TorchBackend) -> dict[str, dict[str, torch.Tensor]]:
    critic = {k: full_tensor(v.detach()) for k, v in b.critic.state_dict().items()}
    return {"actor": dict(b.named_weights()), "critic": critic}


def main() -> int:
    rank, world, port, model_dir, batch_file, ckpt, out_dir = sys.argv[1:8]
    join_group(rank, world, port)
    try:
        batch = torch.load(batch_file, weights_only=False)
        flipped = replace(batch, rewards=1.0 - batch.rewards)
        a = TorchBackend(TrainerConfig(model=model_dir, **CONFIG))
        a.train_step(batch, StepObjective())
        a.save(ckpt, extra=EXTRA)
        at_save = weights(a)
        draws_a = draws()
        metrics_a = a.train_step(flipped, StepObjective())
        after_a = weights(a)
        b = TorchBackend(TrainerConfig(model=model_dir, seed=7, **CONFIG))
        extra = b.load(ckpt)
        draws_b = draws()
        counters = (b.version, b.steps)
        metrics_b = b.train_step(flipped, StepObjective())
        result = {
            "draws": (draws_a, draws_b),
            "metrics": (metrics_a, metrics_b),
            "weights": (after_a, weights(b)),
            "at_save": at_save,
            "extra": extra,
            "counters": counters,
        }
        torch.save(result, Path(out_dir) / f"rank-{rank}.pt")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
