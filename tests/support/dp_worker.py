"""One rank of the data-parallel test: ``python -m tests.support.dp_worker``.

Arguments: RANK WORLD PORT MODEL_DIR BATCH_FILE OUT_FILE EXPORT_DIR. Joins a gloo group on loopback,
builds the torch backend (FSDP2 over the group), takes one step on the global batch, and rank 0
writes the whole actor and critic weights, the forward outputs and the metrics to OUT_FILE;
the actor is also exported as a HF directory to EXPORT_DIR.
"""

from __future__ import annotations

import sys

import torch

from tests.support.ranks import rank_main
from trainer.backends import StepObjective
from trainer.backends.parallel import full_tensor
from trainer.backends.torch_backend import TorchBackend
from trainer.config import TrainerConfig

# Adam's eps = 1: the first update is ~ lr * grad, so weights compare gradients.
SGD_LIKE = {"lr": 1.0, "eps": 1.0, "grad_clip": 0.0}
CONFIG = {"actor": SGD_LIKE, "critic": {"optimizer": SGD_LIKE, "updates_per_step": 2}}


def run(model_dir: str, batch_file: str, export_dir: str | None = None) -> dict:
    backend = TorchBackend(TrainerConfig(model=model_dir, **CONFIG))
    batch = torch.load(batch_file, weights_only=False)
    before = backend.logprobs_and_values(batch)
    metrics = backend.train_step(batch, StepObjective(algorithm="li2sao"))
    critic = {k: full_tensor(v.detach()) for k, v in backend.critic.state_dict().items()}
    if export_dir is not None:
        backend.export_hf(export_dir)  # every rank calls; rank 0 writes
    return {
        "logprobs": before.logprobs,
        "values": before.values,
        "metrics": metrics,
        "actor": dict(backend.named_weights()),
        "critic": critic,
    }


def run_all(world: int, args: list[str]) -> dict:
    model_dir, batch_file, _, export_dir = args
    return run(model_dir, batch_file, export_dir)


if __name__ == "__main__":
    raise SystemExit(rank_main(run_all, sys.argv[6]))
