"""One rank of the megatron tensor-parallel test: ``python -m tests.support.megatron_tp_worker``.

Arguments: RANK WORLD PORT MODEL_DIR BATCH_FILE OUT_FILE EXPORT_DIR. Joins a gloo group on
loopback, builds the megatron backend with TP = WORLD, scores the batch, gathers the HF weights
and exports the actor (every rank calls; rank 0 writes), and rank 0 saves the outputs, the
gathered weights and its own shard's shapes to OUT_FILE. One process pair serves every check
(each process pays seconds of megatron-core import).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from tests.support.ranks import join_group
from trainer.backends import StepObjective
from trainer.backends.base import BackendError
from trainer.backends.megatron.backend import MegatronBackend
from trainer.config import TrainerConfig


def run(model_dir: str, batch_file: str, export_dir: str, world: int) -> dict:
    config = TrainerConfig(model=model_dir, backend="megatron", megatron={"tensor_parallel": world})
    backend = MegatronBackend(config)
    batch = torch.load(batch_file, weights_only=False)
    fwd = backend.logprobs_and_values(batch)
    weights = dict(backend.named_weights())
    backend.export_hf(export_dir)
    try:
        backend.train_step(batch, StepObjective())
        refused = ""
    except BackendError as exc:
        refused = str(exc)
    shard = {n: tuple(p.shape) for n, p in backend.actor.named_parameters()}
    return {"forward": fwd, "weights": weights, "shard": shard, "train_refused": refused}


def main() -> int:
    rank, world, port, model_dir, batch_file, out_file, export_dir = sys.argv[1:8]
    join_group(rank, world, port)
    try:
        result = run(model_dir, batch_file, export_dir, int(world))
        if int(rank) == 0:
            torch.save(result, out_file)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
