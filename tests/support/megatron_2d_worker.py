"""One rank of the tensor x data parallel test: ``python -m tests.support.megatron_2d_worker``.

Arguments: RANK WORLD PORT MODEL_DIR BATCH_FILE OUT_FILE CKPT_DIR TINY_DIR TINY_BATCH_FILE
TIED_DIR TIED_BATCH_FILE MOE_DIR MOE_BATCH_FILE. Joins a gloo group of WORLD (4) ranks on
loopback and builds the megatron backend with TP=2 on MODEL_DIR (key ``tp``): two replicas of
two tensor-parallel ranks, each replica training its share of the batch's groups; then,
re-initialised, with PP=2 on TINY_DIR (key ``pp``): two replicas of two pipeline stages; then
both again with the distributed optimizer; then with CP=2 on MODEL_DIR (key ``cp``): two
replicas of two context-parallel ranks, and with TP=2 x CP=2 (key ``tp_cp``): one replica;
then TP=2 x PP=2 (one replica) on MODEL_DIR with a KL reference (key ``tp_pp``) and on
TIED_DIR, the same shape with tied embeddings (key ``tp_pp_tied``); then TP=2 x DP=2 on the
MoE MOE_DIR (key ``tp_moe``: sequence parallel). On each it scores the batch, gathers the HF
weights, takes one Li2SAO step, records each rank's share of the AdamW states and checks the
resume from a checkpoint (:func:`tests.support.megatron_resume.resume_check`). Rank 0 saves
the outputs, the weights, the step's metrics, each rank's (model-parallel or CP rank, DP rank,
DP size), (TP rank, CP rank), (TP rank, PP rank) and actor parameter shapes to OUT_FILE.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from tests.support.megatron_pp_worker import BATCH as PP_BATCH
from tests.support.megatron_resume import resume_check, snapshot
from tests.support.megatron_tp_worker import CONFIG
from tests.support.ranks import rank_main
from trainer.backends import StepObjective
from trainer.backends.megatron.backend import MegatronBackend
from trainer.config import TrainerConfig

TP = 2
KL = 0.1  # the KL coefficient of the TP x PP phase (its reference pipelined like the actor)


def make(model_dir: str, seed: int = 0, **layout: object) -> MegatronBackend:
    layout = layout or {"megatron": {"tensor_parallel": TP}}
    config = TrainerConfig(model=model_dir, backend="megatron", seed=seed, **layout, **CONFIG)
    return MegatronBackend(config)


def run_layout(world: int, model_dir: str, batch_file: str, ckpt: str, **layout: object) -> dict:
    """Score, gather, step and resume on this layout (every rank)."""
    backend = make(model_dir, **layout)
    batch = torch.load(batch_file, weights_only=False)
    coords: list = [None] * world
    model_rank = backend.tp_rank if backend.pp == 1 else backend._pp_rank()
    if backend.cp > 1 and backend.config.megatron.tensor_parallel == 1:
        from megatron.core import parallel_state

        model_rank = parallel_state.get_context_parallel_rank()
    dist.all_gather_object(coords, (model_rank, backend.dp.rank, backend.dp.world))
    rows: list = [None] * world
    dist.all_gather_object(rows, backend.dp.rows(batch))
    from megatron.core import parallel_state

    tp_cp: list = [None] * world
    cp_rank = parallel_state.get_context_parallel_rank()
    dist.all_gather_object(tp_cp, (backend.tp_rank, cp_rank))
    tp_pp: list = [None] * world
    dist.all_gather_object(tp_pp, (backend.tp_rank, backend._pp_rank()))
    shapes: list = [None] * world
    dist.all_gather_object(shapes, {n: tuple(p.shape) for n, p in backend.actor.named_parameters()})
    result = {
        "coords": coords,
        "tp_cp": tp_cp,
        "tp_pp": tp_pp,
        "shapes": shapes,
        "rows_by_rank": rows,
        "forward": backend.logprobs_and_values(batch),
        "weights": snapshot(backend),
    }
    objective = StepObjective(algorithm="li2sao", phase="bootstrap")
    result["metrics"] = backend.train_step(batch, objective)
    result["stepped"] = snapshot(backend)
    local = backend.checkpoint_optimizer(backend.actor_optimizer)  # this rank's AdamW states
    held = sum(t.numel() for st in local.state.values() for t in st.values() if t.dim() > 0)
    shares: list = [None] * world
    dist.all_gather_object(shares, (held, sum(p.numel() for p in backend.actor.parameters())))
    result["state_shares"] = shares  # per rank: (AdamW state elements, local actor elements)
    heads: list = [None] * world
    dist.all_gather_object(heads, backend.critic.value_head.weight.detach().clone())
    result["value_heads"] = heads

    def fresh(seed: int) -> MegatronBackend:
        return make(model_dir, seed, **layout)

    result["resume"] = resume_check(backend, fresh, batch, ckpt)
    return result


def run(world: int, args: list[str]) -> dict:
    """TP=2 x DP=2 on the 2-KV-head model, then the same ranks as PP=2 x DP=2 on the tiny
    model (its two layers one stage each); each again with the distributed optimizer (keys
    ``tp_zero``, ``pp_zero``: the AdamW states sharded over the data-parallel group); then
    CP=2 x DP=2 and TP=2 x CP=2 on the 2-KV-head model (keys ``cp``, ``tp_cp``); then TP=2 x
    PP=2 on it with a KL reference (key ``tp_pp``) and on its tied variant (``tp_pp_tied``);
    then TP=2 x DP=2 on a MoE with 2 key/value heads (``tp_moe``)."""
    from megatron.core import parallel_state

    model_dir, batch_file, _, ckpt, tiny_dir, tiny_batch_file, *rest = args
    tied_dir, tied_batch_file, moe_dir, moe_batch_file = rest
    tensor = {"megatron": {"tensor_parallel": TP}}
    pipeline = {"megatron": {"pipeline_parallel": 2}, "batch": PP_BATCH}
    both = {"megatron": {"tensor_parallel": TP, "pipeline_parallel": 2}, "batch": PP_BATCH}
    runs = {
        "tp": (model_dir, batch_file, tensor),
        "pp": (tiny_dir, tiny_batch_file, pipeline),
        "tp_zero": (model_dir, batch_file, tensor),
        "pp_zero": (tiny_dir, tiny_batch_file, pipeline),
        "cp": (model_dir, batch_file, {"megatron": {"context_parallel": 2}}),
        "tp_cp": (
            model_dir,
            batch_file,
            {"megatron": {"tensor_parallel": TP, "context_parallel": 2}},
        ),
        "tp_pp": (model_dir, batch_file, {**both, "kl_coef": KL}),
        "tp_pp_tied": (tied_dir, tied_batch_file, both),
        "tp_moe": (moe_dir, moe_batch_file, tensor),
    }
    result = {}
    for key, (model, batch, layout) in runs.items():
        if key.endswith("_zero"):
            layout = {**layout, "megatron": {**layout["megatron"], "distributed_optimizer": True}}
        result[key] = run_layout(world, model, batch, f"{ckpt}-{key}", **layout)
        parallel_state.destroy_model_parallel()
    return result


if __name__ == "__main__":
    raise SystemExit(rank_main(run, sys.argv[6]))
