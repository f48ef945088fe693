"""One rank of the megatron parallel test: ``python -m tests.support.megatron_tp_worker``.

Arguments: RANK WORLD PORT MODEL_DIR BATCH_FILE OUT_FILE EXPORT_DIR. Joins a gloo group on
loopback, builds the megatron backend with TP = WORLD (:data:`CONFIG`), scores the batch,
gathers the HF weights and exports the actor (every rank calls; rank 0 writes), takes one
Li2SAO step, then saves a checkpoint and checks that a fresh TP=2 backend resumes from it with
the identical next step (:func:`tests.support.megatron_resume.resume_check`, key ``resume``).
Rank 0 saves the outputs, the weights before and after the step, the step's metrics and its
own shard's shapes to OUT_FILE. Then the same ranks re-initialise megatron's
``parallel_state`` with TP=1 (data parallel over the world): the TP=2 checkpoint is refused
by layout, the same global batch is scored and stepped again, and the data-parallel resume is
checked too (key ``dp``; its checkpoint is left at EXPORT_DIR-dp-ckpt for the one-process
load in the test), and once more with the distributed optimizer (key ``dp.zero``). One
process pair serves every check (each process pays seconds of megatron-core import).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from tests.support.megatron_resume import resume_check, snapshot
from tests.support.ranks import rank_main
from trainer.backends import StepObjective
from trainer.backends.megatron.backend import MegatronBackend
from trainer.checkpoint import CheckpointError
from trainer.config import TrainerConfig

LR = 1e-2  # the parity step's learning rate (actor and critic)
CONFIG = {"actor": {"lr": LR}, "critic": {"optimizer": {"lr": LR}}}


def make(model_dir: str, seed: int = 0, **settings: object) -> MegatronBackend:
    config = TrainerConfig(model=model_dir, backend="megatron", seed=seed, **settings, **CONFIG)
    return MegatronBackend(config)


def run(model_dir: str, batch_file: str, export_dir: str, world: int) -> dict:
    layout = {"megatron": {"tensor_parallel": world}}
    backend = make(model_dir, **layout)
    batch = torch.load(batch_file, weights_only=False)
    fwd = backend.logprobs_and_values(batch)
    weights = snapshot(backend)
    backend.export_hf(export_dir)
    metrics = backend.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
    result = {
        "forward": fwd,
        "weights": weights,
        "shard": {n: tuple(p.shape) for n, p in backend.actor.named_parameters()},
        "metrics": metrics,
        "stepped": snapshot(backend),
        "value_head": backend.critic.value_head.weight.detach().clone(),
        "checkpoint_problem": backend.checkpoint_problem(),  # known before any save
    }
    result["resume"] = resume_check(
        backend, lambda seed: make(model_dir, seed, **layout), batch, f"{export_dir}-ckpt"
    )
    return result


def run_data_parallel(model_dir: str, batch_file: str, export_dir: str) -> dict:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    backend = make(model_dir)
    try:
        backend.load(f"{export_dir}-ckpt")  # saved under TP=2
        layout_refused = ""
    except CheckpointError as exc:
        layout_refused = str(exc)
    batch = torch.load(batch_file, weights_only=False)
    fwd = backend.logprobs_and_values(batch)
    metrics = backend.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
    result = {
        "forward": fwd,
        "metrics": metrics,
        "stepped": snapshot(backend),
        "value_head": backend.critic.value_head.weight.detach().clone(),
        "world": backend.dp.world,
        "checkpoint_problem": backend.checkpoint_problem(),
        "layout_refused": layout_refused,
    }
    result["resume"] = resume_check(
        backend, lambda seed: make(model_dir, seed), batch, f"{export_dir}-dp-ckpt"
    )
    result["zero"] = run_distributed_optimizer(model_dir, batch, export_dir, backend)
    return result


def run_distributed_optimizer(
    model_dir: str, batch: object, export_dir: str, plain: MegatronBackend
) -> dict:
    """The same data-parallel step with the AdamW states sharded over the ranks (ZeRO-1),
    each rank's share of the states, the resume check, and the plain backend refusing the
    sharded checkpoint."""
    sharded = {"megatron": {"distributed_optimizer": True}}
    zero = make(model_dir, **sharded)
    metrics = zero.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
    local = zero.checkpoint_optimizer(zero.actor_optimizer)
    mine = sum(t.numel() for st in local.state.values() for t in st.values() if t.dim() > 0)
    shares: list = [None] * dist.get_world_size()
    dist.all_gather_object(shares, mine)
    result = {
        "metrics": metrics,
        "stepped": snapshot(zero),
        "state_shares": shares,
        "actor_numel": sum(p.numel() for p in zero.actor.parameters()),
    }
    ckpt = f"{export_dir}-zero-ckpt"

    def fresh(seed: int) -> MegatronBackend:
        return make(model_dir, seed, **sharded)

    result["resume"] = resume_check(zero, fresh, batch, ckpt)
    try:
        plain.load(ckpt)
        result["plain_refused"] = ""
    except CheckpointError as exc:
        result["plain_refused"] = str(exc)
    return result


def run_all(world: int, args: list[str]) -> dict:
    model_dir, batch_file, _, export_dir = args
    result = run(model_dir, batch_file, export_dir, world)
    result["dp"] = run_data_parallel(model_dir, batch_file, export_dir)
    return result


if __name__ == "__main__":
    raise SystemExit(rank_main(run_all, sys.argv[6]))
