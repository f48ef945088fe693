"""One rank of the context-parallel test: ``python -m tests.support.megatron_cp_worker``.

Arguments: RANK WORLD PORT MODEL_DIR BATCH_FILE OUT_FILE CKPT_DIR. Joins a gloo group on
loopback and builds the megatron backend with CP = WORLD (:data:`CONFIG`). First the
attention module alone (:func:`attention_run`): each rank's slice of :func:`attention_inputs`
through :class:`~trainer.backends.megatron.cp_attention.AllGatherContextAttention`, forward
and backward, its outputs and its slices' gradients kept for the test's plain full-sequence
attention. Then the backend: it scores the batch, takes one Li2SAO step, saves a checkpoint
and checks that a fresh CP backend resumes from it with the identical next step (the
checkpoint stays at CKPT_DIR for the one-process load in the test), and a backend with
activation recompute takes the same step. Rank 0 saves the results to OUT_FILE; the
attention results of every rank are gathered. One process pair serves every check.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import torch
import torch.distributed as dist

from tests.support.megatron_resume import resume_check, snapshot
from tests.support.ranks import rank_main
from trainer.backends import StepObjective
from trainer.backends.megatron.backend import MegatronBackend
from trainer.config import TrainerConfig

LR = 1e-2  # the parity step's learning rate (actor and critic)
CONFIG = {"actor": {"lr": LR}, "critic": {"optimizer": {"lr": LR}}}
ROWS = ((5, 7), (3, 4, 5))  # the attention check's lanes: row lengths (the second pads to 12)
HEADS, GROUPS, DIM = 4, 2, 16  # query heads, key/value groups (GQA), head size


def make(model_dir: str, cp: int, seed: int = 0, **settings: Any) -> MegatronBackend:
    layout = {"megatron": {"context_parallel": cp}}
    config = TrainerConfig(model=model_dir, backend="megatron", seed=seed, **layout, **settings)
    return MegatronBackend(config)


def attention_inputs() -> dict[str, torch.Tensor]:
    """Whole-lane queries ``[w, lanes, HEADS, DIM]``, keys and values ``[w, lanes, GROUPS,
    DIM]``, the output gradient ``[w, lanes, HEADS * DIM]`` and the position ids ``[lanes,
    w]`` of :data:`ROWS` (positions restart per row; a short lane's tail continues its last
    row), ``w`` a multiple of 4 (CP = 2 needs no padding of its own here)."""
    width = 12
    positions = torch.zeros(len(ROWS), width, dtype=torch.long)
    for lane, lengths in enumerate(ROWS):
        at = 0
        for n in lengths:
            positions[lane, at : at + n] = torch.arange(n)
            at += n
        positions[lane, at:] = torch.arange(lengths[-1], lengths[-1] + width - at)
    generator = torch.Generator().manual_seed(11)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    lanes = len(ROWS)
    return {
        "query": draw(width, lanes, HEADS, DIM),
        "key": draw(width, lanes, GROUPS, DIM),
        "value": draw(width, lanes, GROUPS, DIM),
        "grad": draw(width, lanes, HEADS * DIM),
        "positions": positions,
    }


def attention_run(backend: MegatronBackend) -> dict[str, Any]:
    """This rank's slice of :func:`attention_inputs` through the CP attention module: its
    output, the gradients of its query / key / value slices, its columns."""
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import AttnMaskType

    from trainer.backends.megatron.cp_attention import AllGatherContextAttention
    from trainer.backends.megatron.cp_layout import (
        local_columns,
        packed_attention_mask,
        slice_sequence,
    )
    from trainer.backends.megatron.model import transformer_config

    cp, rank = backend.cp, parallel_state.get_context_parallel_rank()
    hf = copy.deepcopy(backend.hf_config)
    hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim = HEADS, GROUPS, DIM
    module = AllGatherContextAttention(
        transformer_config(hf), layer_number=1, attn_mask_type=AttnMaskType.causal,
        attention_type="self",
    )  # fmt: skip
    whole = attention_inputs()
    mine = {
        k: slice_sequence(whole[k], cp, rank).requires_grad_() for k in ("query", "key", "value")
    }
    columns = local_columns(whole["positions"].shape[1], cp, rank)
    mask = packed_attention_mask(whole["positions"], columns)
    out = module(mine["query"], mine["key"], mine["value"], mask)
    (out * slice_sequence(whole["grad"], cp, rank)).sum().backward()
    return {
        "columns": columns,
        "out": out.detach(),
        **{f"grad_{k}": v.grad for k, v in mine.items()},
    }


def run(world: int, args: list[str]) -> dict[str, Any]:
    model_dir, batch_file, _, ckpt_dir = args
    backend = make(model_dir, world, **CONFIG)
    attention: list[Any] = [None] * world
    dist.all_gather_object(attention, attention_run(backend))
    batch = torch.load(batch_file, weights_only=False)
    fwd = backend.logprobs_and_values(batch)
    objective = StepObjective(algorithm="li2sao", phase="bootstrap")
    metrics = backend.train_step(batch, objective)
    recomputed = make(model_dir, world, activation_checkpointing=True, **CONFIG)
    result = {
        "attention": attention,
        "dp_world": backend.dp.world,
        "forward": fwd,
        "metrics": metrics,
        "stepped": snapshot(backend),
        "value_head": backend.critic.value_head.weight.detach().clone(),
        "recomputed_metrics": recomputed.train_step(batch, objective),
        "recomputed": snapshot(recomputed),
        "parallel": backend.checkpoint_parallel(),
    }
    result["resume"] = resume_check(
        backend, lambda seed: make(model_dir, world, seed, **CONFIG), batch, ckpt_dir
    )
    return result


if __name__ == "__main__":
    raise SystemExit(rank_main(run, sys.argv[6]))
