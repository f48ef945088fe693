"""Context parallel in the megatron backend: CP=2 over two gloo processes against one process.

One process pair (:mod:`tests.support.megatron_cp_worker`) serves every check: the
all-gather attention module against a plain full-sequence attention (outputs and the
gradients of each rank's queries, keys and values), then the backend on the GQA tiny model
with packed lanes of uneven rows whose width is padded for the chunk layout: per-token
logprobs, entropies and values, the step's metrics and weights, activation recompute, an exact
resume at CP=2 and the CP=2 checkpoint loading into one process."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.megatron_cp_worker import ROWS, attention_inputs
from tests.support.megatron_resume import EXTRA, assert_resumed
from tests.support.ranks import run_ranks
from tests.unit.trainer.backends.megatron.test_backend import (
    LR,
    adam_parity,
    close_metrics,
    gqa_model_dir,
    make,
    parity_batch,
)
from trainer.backends import StepObjective

pytestmark = pytest.mark.slow  # two processes import megatron-core


def plain_attention(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whole-lane attention written out: block-diagonal causal over :data:`ROWS` (a lane's
    padding tail belongs to its last row), GQA by repeating each key/value group for its
    consecutive query heads; the output and the gradients of ``sum(out * grad)``."""
    q, k, v = (inputs[name].clone().requires_grad_() for name in ("query", "key", "value"))
    width, lanes, heads, dim = q.shape
    allowed = torch.zeros(lanes, width, width, dtype=torch.bool)
    for lane, lengths in enumerate(ROWS):
        start = 0
        for i, n in enumerate(lengths):
            stop = width if i == len(lengths) - 1 else start + n
            for query in range(start, stop):
                allowed[lane, query, start : query + 1] = True
            start += n
    repeat = heads // k.shape[2]
    keys, values = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
    scores = torch.einsum("qbhd,kbhd->bhqk", q, keys) / math.sqrt(dim)
    probs = scores.masked_fill(~allowed[:, None], float("-inf")).softmax(-1)
    out = torch.einsum("bhqk,kbhd->qbhd", probs, values).reshape(width, lanes, heads * dim)
    (out * inputs["grad"]).sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None
    return {"out": out.detach(), "grad_query": q.grad, "grad_key": k.grad, "grad_value": v.grad}


def check_attention(ranks: list[dict[str, torch.Tensor]]) -> None:
    """Each rank's queries: the whole-lane attention's rows; each rank's keys and values: the
    whole gradient (every rank's queries' share, reduce-scattered)."""
    want = plain_attention(attention_inputs())
    # width 12 in 4 chunks of 3: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert ranks[0]["columns"].tolist() == [0, 1, 2, 9, 10, 11]
    assert ranks[1]["columns"].tolist() == [3, 4, 5, 6, 7, 8]
    for got in ranks:
        columns = got["columns"]
        for name, tensor in want.items():
            diff = (tensor[columns] - got[name]).abs().max()
            assert float(diff) < 1e-5, name


def test_context_parallel_two_ranks_equal_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = gqa_model_dir(tiny_model_dir, tmp_path / "gqa")
    one = make(model, "megatron")
    batch = parity_batch(one, longer_first=1)
    lanes = [m.view(batch)[1].input_ids.shape for m in one._plan(batch)]
    assert lanes == [(3, 33)]  # three lanes of two rows; 33 columns: padded to 36 for CP=2
    torch.save(batch, tmp_path / "batch.pt")
    out, ckpt = tmp_path / "cp.pt", tmp_path / "cp-ckpt"
    run_ranks("tests.support.megatron_cp_worker", [str(model), str(tmp_path / "batch.pt"),
                                                   str(out), str(ckpt)])  # fmt: skip
    two = torch.load(out, weights_only=False)
    check_attention(two["attention"])
    assert two["dp_world"] == 1  # the CP ranks share the rows: one data-parallel replica
    # per-token outputs within 1e-5; 0 off the action tokens (each token summed from one rank)
    want, mask = one.logprobs_and_values(batch), batch.action_mask
    for part in ("logprobs", "values", "entropy"):
        diff = (getattr(two["forward"], part) - getattr(want, part))[mask].abs()
        assert float(diff.max()) < 1e-5, part
        assert not bool(getattr(two["forward"], part)[~mask].any()), part
    # one step at lr 1e-2: the same losses, grad norms, objective metrics and weights
    one = make(model, "megatron", actor={"lr": LR}, critic={"optimizer": {"lr": LR}})
    metrics = one.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
    close_metrics(metrics, two["metrics"])
    hf = load_file(model / "model.safetensors")
    for name, tensor in one.named_weights():
        # CP sums each gradient over the ranks in another order than one process does; on an
        # element where Adam's epsilon dominates that rounding is amplified: 3.8e-5 on one
        # machine, 1.3e-4 on another (Xeon, 2026-12-07) -- within 5e-4, 5% of the step, and
        # still at most 1 element in 1000 beyond 1e-5
        adam_parity(tensor, two["stepped"][name], hf[name], eps_tol=5e-4)
    assert torch.allclose(two["value_head"], one.critic.value_head.weight, atol=1e-5, rtol=0)
    # activation recompute under CP: the layers' K/V gathers run again in the backward
    close_metrics(two["metrics"], two["recomputed_metrics"])
    for name, tensor in two["stepped"].items():
        adam_parity(tensor, two["recomputed"][name], hf[name])
    # checkpoints: CP does not shard the weights (not part of the layout); an exact resume at
    # CP=2, and the CP=2 checkpoint loads into one process with the same next step
    assert two["parallel"] == {"tensor_parallel": 1, "pipeline_parallel": 1, "expert_parallel": 1}
    assert_resumed(two["resume"])
    alone = make(model, "megatron", actor={"lr": LR}, critic={"optimizer": {"lr": LR}})
    assert alone.load(ckpt) == EXTRA and alone.steps == 1
    resumed = alone.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
    close_metrics(two["resume"]["metrics"][0], resumed)
