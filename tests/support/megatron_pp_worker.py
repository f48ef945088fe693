"""One rank of the megatron pipeline-parallel test: ``python -m tests.support.megatron_pp_worker``.

Arguments: RANK WORLD PORT MODEL_DIR BATCH_FILE MOE_DIR MOE_BATCH_FILE OUT_FILE. Joins a gloo
group on loopback, builds the megatron backend with PP = WORLD stages (the tiny model's layers
split evenly), scores the batch through megatron's 1F1B schedule (forward only), gathers the HF
weights from every stage and takes one Li2SAO step, then checks that a fresh PP backend resumes
from its checkpoint with the identical next step (key ``resume``); a PP backend in
``precision: bf16`` (:func:`bf16`: CPU autocast) scores and steps the same batch (key
``bf16``). Then the same ranks
re-initialise megatron's ``parallel_state`` with EP = WORLD and score, step and resume the
tiny MoE (key ``ep``), and once more as plain data parallel on the MoE (key ``moe_dp``). Rank
0 saves the outputs, the gathered weights before and after the steps, each rank's parameter
names and the last stage's value head to OUT_FILE. One process
pair serves every check (each process pays seconds of megatron-core import).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from tests.support.megatron_resume import resume_check, snapshot
from tests.support.ranks import rank_main
from trainer.backends import StepObjective
from trainer.backends.megatron.backend import MegatronBackend
from trainer.config import TrainerConfig

# Small micro-batches: several are in flight through the 1F1B schedule at once.
BATCH = {"micro_batch_tokens": 32, "lane_factor": 0}
LR = 1e-2  # the parallel steps' learning rate (actor and critic)
STEP = {"actor": {"lr": LR}, "critic": {"optimizer": {"lr": LR}}}


def make(model_dir: str, seed: int = 0, **settings: object) -> MegatronBackend:
    config = TrainerConfig(model=model_dir, backend="megatron", seed=seed, **settings, **STEP)
    return MegatronBackend(config)


def bf16(config: TrainerConfig) -> TrainerConfig:
    """``config`` with ``precision: bf16`` on its CPU device: the config refuses bf16 off a
    GPU (the users' rule); torch's CPU autocast runs bfloat16, so the tests bypass only that
    check to compare the backend's bf16 paths on the CPU."""
    return config.model_copy(update={"precision": "bf16"})


def run_bf16(model_dir: str, batch_file: str, world: int) -> dict:
    """A PP = WORLD backend in ``precision: bf16`` (:func:`bf16`): the batch's logprobs and
    values through the stages, one Li2SAO step's metrics and the gathered weights after it."""
    layout = {"megatron": {"pipeline_parallel": world}, "batch": BATCH}
    config = TrainerConfig(model=model_dir, backend="megatron", **layout, **STEP)
    backend = MegatronBackend(bf16(config))
    batch = torch.load(batch_file, weights_only=False)
    result = {"forward": backend.logprobs_and_values(batch)}
    objective = StepObjective(algorithm="li2sao", phase="bootstrap")
    result["metrics"] = backend.train_step(batch, objective)
    result["stepped"] = snapshot(backend)
    return result


def run(model_dir: str, batch_file: str, world: int) -> dict:
    layout = {"megatron": {"pipeline_parallel": world}, "batch": BATCH}
    backend = make(model_dir, **layout)
    batch = torch.load(batch_file, weights_only=False)
    names: list = [None] * world
    dist.all_gather_object(names, sorted(n for n, _ in backend.actor.named_parameters()))
    result = {
        "forward": backend.logprobs_and_values(batch),
        "weights": snapshot(backend),
        "stage_names": names,
    }
    objective = StepObjective(algorithm="li2sao", phase="bootstrap")
    result["metrics"] = backend.train_step(batch, objective)
    result["stepped"] = snapshot(backend)
    heads: list = [None] * world
    dist.all_gather_object(heads, backend.critic.value_head.weight.detach().clone())
    result["value_head"] = heads[-1]  # the last stage applies the value head
    result["resume"] = resume_check(
        backend, lambda seed: make(model_dir, seed, **layout), batch, f"{batch_file}-ckpt"
    )
    return result


def run_expert_parallel(moe_dir: str, batch_file: str, world: int) -> dict:
    """The same ranks re-initialised as EP = WORLD on the tiny MoE: each holds its share of
    the experts, every rank scores the whole batch, then one Li2SAO step (:data:`STEP`)."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    layout = {"megatron": {"expert_parallel": world}}
    backend = make(moe_dir, **layout)
    batch = torch.load(batch_file, weights_only=False)
    names: list = [None] * world
    dist.all_gather_object(names, sorted(n for n, _ in backend.actor.named_parameters()))
    result = {
        "forward": backend.logprobs_and_values(batch),
        "weights": snapshot(backend),
        "rank_names": names,
    }
    objective = StepObjective(algorithm="li2sao", phase="bootstrap")
    result["metrics"] = backend.train_step(batch, objective)
    result["stepped"] = snapshot(backend)
    result["value_head"] = backend.critic.value_head.weight.detach().clone()
    result["resume"] = resume_check(
        backend, lambda seed: make(moe_dir, seed, **layout), batch, f"{batch_file}-ckpt"
    )
    return result


def run_moe_data_parallel(moe_dir: str, batch_file: str) -> dict:
    """The same ranks once more, TP=PP=EP=1 on the tiny MoE: data parallel (rows by group,
    experts replicated, gradients summed), one Li2SAO step (:data:`STEP`)."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    backend = MegatronBackend(TrainerConfig(model=moe_dir, backend="megatron", **STEP))
    batch = torch.load(batch_file, weights_only=False)
    forward = backend.logprobs_and_values(batch)
    objective = StepObjective(algorithm="li2sao", phase="bootstrap")
    return {
        "world": backend.dp.world,
        "forward": forward,
        "metrics": backend.train_step(batch, objective),
        "stepped": snapshot(backend),
    }


def run_all(world: int, args: list[str]) -> dict:
    model_dir, batch_file, moe_dir, moe_batch_file, _ = args
    result = run(model_dir, batch_file, world)
    result["bf16"] = run_bf16(model_dir, batch_file, world)
    result["ep"] = run_expert_parallel(moe_dir, moe_batch_file, world)
    result["moe_dp"] = run_moe_data_parallel(moe_dir, moe_batch_file)
    return result


if __name__ == "__main__":
    raise SystemExit(rank_main(run_all, sys.argv[8]))
