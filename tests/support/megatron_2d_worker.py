"""One rank of the tensor x data parallel test: ``python -m tests.support.megatron_2d_worker``.

Arguments: RANK WORLD PORT MODEL_DIR BATCH_FILE OUT_FILE CKPT_DIR. Joins a gloo group of WORLD
(4) ranks on loopback and builds the megatron backend with TP=2: two replicas of two
tensor-parallel ranks, each replica training its share of the batch's groups. It scores the
batch, gathers the HF weights, takes one Li2SAO step and checks the resume from a checkpoint
(:func:`tests.support.megatron_resume.resume_check`). Rank 0 saves the outputs, the weights,
the step's metrics and each rank's (TP rank, DP rank) to OUT_FILE.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from tests.support.megatron_resume import resume_check, snapshot
from tests.support.megatron_tp_worker import CONFIG
from tests.support.ranks import rank_main
from trainer.backends import StepObjective
from trainer.backends.megatron.backend import MegatronBackend
from trainer.config import TrainerConfig

TP = 2


def make(model_dir: str, seed: int = 0) -> MegatronBackend:
    config = TrainerConfig(
        model=model_dir, backend="megatron", seed=seed, megatron={"tensor_parallel": TP}, **CONFIG
    )
    return MegatronBackend(config)


def run(world: int, args: list[str]) -> dict:
    model_dir, batch_file, _, ckpt = args
    backend = make(model_dir)
    batch = torch.load(batch_file, weights_only=False)
    coords: list = [None] * world
    dist.all_gather_object(coords, (backend.tp_rank, backend.dp.rank, backend.dp.world))
    rows: list = [None] * world
    dist.all_gather_object(rows, backend.dp.rows(batch))
    result = {
        "coords": coords,
        "rows_by_rank": rows,
        "forward": backend.logprobs_and_values(batch),
        "weights": snapshot(backend),
    }
    objective = StepObjective(algorithm="li2sao", phase="bootstrap")
    result["metrics"] = backend.train_step(batch, objective)
    result["stepped"] = snapshot(backend)
    result["value_head"] = backend.critic.value_head.weight.detach().clone()
    result["resume"] = resume_check(backend, lambda seed: make(model_dir, seed), batch, ckpt)
    return result


if __name__ == "__main__":
    raise SystemExit(rank_main(run, sys.argv[6]))
