"""Pipeline and expert parallel on CPU: the megatron backend with PP=2 (two gloo processes, one
layer of the tiny model per stage) scores a batch through megatron's 1F1B schedule like one
process, gathers the HF weights from both stages bit-exactly and takes the same Li2SAO step
(backward through the schedule), and in ``precision: bf16`` (CPU autocast) scores bit-equally
with one bf16 process and takes its step; the same processes as EP=2 on the tiny MoE (two
experts per rank) score like one process, gather every expert bit-exactly and take the same
step, and so does plain data parallel on the MoE; under PP=2 and EP=2 a fresh backend resumes
from a checkpoint with the identical next step.

One process pair serves every check (each process pays seconds of megatron-core import)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.megatron_pp_worker import BATCH, STEP, bf16
from tests.support.megatron_resume import assert_resumed
from tests.support.ranks import run_ranks
from tests.unit.trainer.backends.megatron.test_backend import (
    LR,
    adam_parity,
    close_metrics,
    make,
    parity_batch,
)
from trainer.backends import BackendError, StepObjective
from trainer.backends.megatron.backend import MegatronBackend
from trainer.backends.megatron.convert import (
    hf_to_megatron,
    merge_pipeline_stages,
    pipeline_stage,
)
from trainer.config import TrainerConfig
from trainer.data import TrainBatch

BOOTSTRAP = StepObjective(algorithm="li2sao", phase="bootstrap")

pytestmark = pytest.mark.slow  # two processes importing megatron-core


def test_pipeline_stages_split_and_merge_the_weights_bit_exactly(tiny_model_dir: Path) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)
    whole = hf_to_megatron(load_file(tiny_model_dir / "model.safetensors"), config)
    first, last = (pipeline_stage(whole, config, s, 2) for s in range(2))
    layer1 = "decoder.layers.1.mlp.linear_fc1.weight"
    assert torch.equal(last["decoder.layers.0.mlp.linear_fc1.weight"], whole[layer1])
    assert "embedding.word_embeddings.weight" in first and "decoder.layers.1." not in str(first)
    assert (
        "decoder.final_layernorm.weight" in last and "decoder.final_layernorm.weight" not in first
    )
    tied = whole["embedding.word_embeddings.weight"]
    assert torch.equal(last["output_layer.weight"], tied)  # the last stage's tied copy
    merged = merge_pipeline_stages([first, last], config)
    assert merged.keys() == whole.keys() and all(torch.equal(merged[n], whole[n]) for n in whole)
    with pytest.raises(BackendError, match="num_hidden_layers=2 does not split over pipeline"):
        pipeline_stage(whole, config, 0, 3)


def assert_bf16_stages_equal_one_process(
    model_dir: Path, batch: TrainBatch, two: dict, fp32: dict
) -> None:
    """PP=2 in ``precision: bf16`` (``two``) against one bf16 process: every stage's forward
    and the last stage's heads autocast as one process's do and the stages exchange the fp32
    residual stream, so the logprobs, entropies and values are bit-equal; the step's metrics
    and weights agree as the fp32 PP step's do (only gradient sums differ in order: the tied
    embeddings' over the stages). ``fp32``: the fp32 PP=2 results, off by bf16 rounding (the
    stages did run bf16)."""
    config = TrainerConfig(model=str(model_dir), backend="megatron", batch=BATCH, **STEP)
    one = MegatronBackend(bf16(config))
    want, mask = one.logprobs_and_values(batch), batch.action_mask
    for part in ("logprobs", "values", "entropy"):
        got = getattr(two["forward"], part)
        assert torch.equal(got, getattr(want, part)), part
        # bf16 rounding: beyond the fp32 parity's 1e-5 (logprobs 2e-3, entropy 3e-5 seen)
        assert float((got - getattr(fp32["forward"], part))[mask].abs().max()) > 1e-5, part
    metrics = one.train_step(batch, BOOTSTRAP)
    close_metrics(metrics, two["metrics"])
    with pytest.raises(AssertionError):  # the fp32 step is told apart by the same check
        close_metrics(fp32["metrics"], two["metrics"])
    start = load_file(model_dir / "model.safetensors")
    for name, tensor in one.named_weights():
        adam_parity(tensor, two["stepped"][name], start[name])


def test_two_pipeline_stages_and_two_expert_ranks_score_like_one_process(
    tiny_model_dir: Path, tiny_moe_dir: Path, tmp_path: Path
) -> None:
    one = make(tiny_model_dir, "megatron", batch=BATCH)
    batch = parity_batch(one)
    assert len(one._plan(batch)) > 2  # several micro-batches in flight through the 1F1B schedule
    torch.save(batch, tmp_path / "batch.pt")
    one_moe = make(tiny_moe_dir, "megatron")
    moe_batch = parity_batch(one_moe)
    torch.save(moe_batch, tmp_path / "moe_batch.pt")
    out = tmp_path / "pp.pt"
    args = [str(tiny_model_dir), str(tmp_path / "batch.pt"), str(tiny_moe_dir)]
    run_ranks("tests.support.megatron_pp_worker", [*args, str(tmp_path / "moe_batch.pt"), str(out)])
    two = torch.load(out, weights_only=False)
    first, last = two["stage_names"]
    assert "embedding.word_embeddings.weight" in first and "output_layer.weight" not in first
    assert (
        "decoder.final_layernorm.weight" in last and "embedding.word_embeddings.weight" not in last
    )
    assert not any(n.startswith("decoder.layers.1.") for n in first + last)  # one layer each
    want, mask = one.logprobs_and_values(batch), batch.action_mask
    for part in ("logprobs", "values", "entropy"):
        diff = (getattr(two["forward"], part) - getattr(want, part))[mask].abs()
        assert float(diff.max()) < 1e-5, part
    assert float(two["forward"].logprobs[mask].abs().min()) > 0
    hf = load_file(tiny_model_dir / "model.safetensors")
    assert two["weights"].keys() == hf.keys()
    assert all(torch.equal(two["weights"][n], hf[n]) for n in hf)  # gathered bit-exactly
    # one Li2SAO step at lr 1e-2 through the 1F1B schedule (forward and backward)
    one = make(tiny_model_dir, "megatron", batch=BATCH, **STEP)
    metrics = one.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
    close_metrics(metrics, two["metrics"])
    moved = 0
    for name, tensor in one.named_weights():
        adam_parity(tensor, two["stepped"][name], hf[name])
        moved += int((tensor - hf[name]).abs().gt(0.5 * LR).sum())
    assert moved > 10_000
    assert torch.allclose(two["value_head"], one.critic.value_head.weight, atol=1e-5, rtol=0)
    assert_resumed(two["resume"])  # a fresh PP=2 backend resumes with the identical step
    assert_bf16_stages_equal_one_process(tiny_model_dir, batch, two["bf16"], two)
    # expert parallel: each rank holds two of the four experts, yet scores every token
    ep = two["ep"]
    for names in ep["rank_names"]:
        experts = {
            n.split("local_experts.")[1].split(".")[0] for n in names if "local_experts" in n
        }
        assert experts == {"0", "1"} and "decoder.layers.1.mlp.router.weight" in names
    want, mask = one_moe.logprobs_and_values(moe_batch), moe_batch.action_mask
    for part in ("logprobs", "values", "entropy"):
        diff = (getattr(ep["forward"], part) - getattr(want, part))[mask].abs()
        assert float(diff.max()) < 1e-5, part
    hf = load_file(tiny_moe_dir / "model.safetensors")
    assert ep["weights"].keys() == hf.keys()
    assert all(torch.equal(ep["weights"][n], hf[n]) for n in hf)  # every expert, bit-exactly
    # one Li2SAO step at lr 1e-2: the same metrics, weights and value head as one process
    one_moe = make(tiny_moe_dir, "megatron", **STEP)
    metrics = one_moe.train_step(moe_batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
    close_metrics(metrics, ep["metrics"])
    moved = 0
    for name, tensor in one_moe.named_weights():
        # 2e-4 where Adam's epsilon dominates: expert sums in another order and the fused
        # attention kernel per packed row round a ~1e-8 gradient differently (1.23e-4 seen)
        adam_parity(tensor, ep["stepped"][name], hf[name], eps_tol=2e-4)
        moved += int((tensor - hf[name]).abs().gt(0.5 * LR).sum())
    assert moved > 10_000
    head = one_moe.critic.value_head.weight
    assert torch.allclose(ep["value_head"], head, atol=1e-5, rtol=0)
    assert_resumed(ep["resume"])  # each EP rank's experts saved and restored
    # the MoE under plain data parallel (TP=PP=EP=1, rows by group, experts replicated)
    dp = two["moe_dp"]
    assert dp["world"] == 2
    for part in ("logprobs", "values", "entropy"):
        diff = (getattr(dp["forward"], part) - getattr(want, part))[mask].abs()
        assert float(diff.max()) < 1e-5, part
    close_metrics(metrics, dp["metrics"])
    for name, tensor in one_moe.named_weights():
        adam_parity(tensor, dp["stepped"][name], hf[name], eps_tol=2e-4)
