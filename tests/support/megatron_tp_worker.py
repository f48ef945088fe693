"""One rank of the megatron parallel test: ``python -m tests.support.megatron_tp_worker``.

Arguments: RANK WORLD PORT MODEL_DIR BATCH_FILE OUT_FILE EXPORT_DIR. Joins a gloo group on
loopback, builds the megatron backend with TP = WORLD (:data:`CONFIG`), scores the batch,
gathers the HF weights and exports the actor (every rank calls; rank 0 writes), takes one
Li2SAO step, tries a checkpoint (refused under TP), and rank 0 saves the outputs, the weights
before and after the step, the step's metrics and its own shard's shapes to OUT_FILE. Then
the same ranks re-initialise megatron's ``parallel_state`` with TP=1 (data parallel over the
world) and score and step the same global batch again (key ``dp``). One process pair serves
every check (each process pays seconds of megatron-core import).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from tests.support.ranks import join_group
from trainer.backends import BackendError, StepObjective
from trainer.backends.megatron.backend import MegatronBackend
from trainer.config import TrainerConfig

LR = 1e-2  # the parity step's learning rate (actor and critic)
CONFIG = {"actor": {"lr": LR}, "critic": {"optimizer": {"lr": LR}}}


def run(model_dir: str, batch_file: str, export_dir: str, world: int) -> dict:
    config = TrainerConfig(
        model=model_dir, backend="megatron", megatron={"tensor_parallel": world}, **CONFIG
    )
    backend = MegatronBackend(config)
    batch = torch.load(batch_file, weights_only=False)
    fwd = backend.logprobs_and_values(batch)
    weights = dict(backend.named_weights())
    backend.export_hf(export_dir)
    metrics = backend.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
    try:
        backend.save(f"{export_dir}-ckpt")
        refused = ""
    except BackendError as exc:
        refused = str(exc)
    return {
        "forward": fwd,
        "weights": weights,
        "shard": {n: tuple(p.shape) for n, p in backend.actor.named_parameters()},
        "metrics": metrics,
        "stepped": dict(backend.named_weights()),
        "value_head": backend.critic.value_head.weight.detach().clone(),
        "save_refused": refused,
        "checkpoint_problem": backend.checkpoint_problem(),  # known before any save
    }


def run_data_parallel(model_dir: str, batch_file: str) -> dict:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    backend = MegatronBackend(TrainerConfig(model=model_dir, backend="megatron", **CONFIG))
    batch = torch.load(batch_file, weights_only=False)
    fwd = backend.logprobs_and_values(batch)
    metrics = backend.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
    return {
        "forward": fwd,
        "metrics": metrics,
        "stepped": dict(backend.named_weights()),
        "value_head": backend.critic.value_head.weight.detach().clone(),
        "world": backend.dp.world,
        "checkpoint_problem": backend.checkpoint_problem(),
    }


def main() -> int:
    rank, world, port, model_dir, batch_file, out_file, export_dir = sys.argv[1:8]
    join_group(rank, world, port)
    try:
        result = run(model_dir, batch_file, export_dir, int(world))
        result["dp"] = run_data_parallel(model_dir, batch_file)
        if int(rank) == 0:
            torch.save(result, out_file)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
