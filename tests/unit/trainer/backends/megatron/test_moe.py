"""The megatron backend against the torch backend on the tiny Qwen3-MoE model (4 experts,
top-2, fp32): the Megatron MoE layer (router, per-expert SwiGLU, HF's renormalised top-k, no
auxiliary loss, no dropped token) gives the same per-token logprobs, entropies and values, the
same step (metrics; exported router and expert weights after one AdamW step at lr 1e-2), the
critic's freezing rule on a MoE, an export transformers loads with the same logprobs, and
activation recompute through the MoE layers.

One pair of backends serves the forward and step checks (megatron-core's import is paid once
per process, each MoE backend a fraction of a second)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from tests.unit.trainer.backends.megatron.test_backend import (
    LR,
    adam_parity,
    close_metrics,
    make,
    parity_batch,
    recompute_parity,
)
from trainer.backends import BackendError, StepObjective
from trainer.backends.megatron.model import check_supported
from trainer.backends.torch_backend import PolicyScorer
from trainer.data import pack_inputs

pytestmark = pytest.mark.slow  # megatron-core's import and set-up take seconds

ROUTER = "model.layers.0.mlp.gate.weight"


def test_the_moe_backend_scores_and_steps_like_the_torch_backend(tiny_moe_dir: Path) -> None:
    lrs = {"actor": {"lr": LR}, "critic": {"optimizer": {"lr": LR}}, "batch": {"lane_factor": 4.0}}
    torch_b = make(tiny_moe_dir, "torch", **lrs)
    mega = make(tiny_moe_dir, "megatron", **lrs)
    start = load_file(tiny_moe_dir / "model.safetensors")
    names = {n for n, _ in mega.actor.named_parameters()}
    assert "decoder.layers.1.mlp.router.weight" in names  # a real Megatron MoE layer
    assert "decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight" in names
    fresh = dict(mega.named_weights())
    assert fresh.keys() == start.keys()  # per-expert checkpoint names, bit-exact
    assert all(torch.equal(fresh[n], start[n]) for n in start)

    batch = parity_batch(torch_b)
    assert any(len(lane) > 1 for m in mega._plan(batch) for lane in m.lanes)
    want, got = torch_b.logprobs_and_values(batch), mega.logprobs_and_values(batch)
    mask = batch.action_mask
    for part in ("logprobs", "entropy", "values"):
        diff = (getattr(want, part) - getattr(got, part))[mask].abs()
        assert float(diff.max()) < 1e-5, part
    assert float(got.logprobs[mask].abs().min()) > 0 and not bool(got.logprobs[~mask].any())

    objective = StepObjective(algorithm="li2sao", phase="bootstrap")
    critic_before = {n: p.detach().clone() for n, p in mega.critic.named_parameters()}
    want_m, got_m = torch_b.train_step(batch, objective), mega.train_step(batch, objective)
    close_metrics(want_m, got_m)
    torch_w, mega_w = dict(torch_b.named_weights()), dict(mega.named_weights())
    assert torch_w.keys() == mega_w.keys() == start.keys()
    for name, tensor in torch_w.items():
        # 3e-4 (3% of lr) where Adam's epsilon dominates: the MoE sums expert outputs in another
        # order and the CPU attention is PyTorch's fused kernel per packed row (sdpa_attention.py;
        # 2.67e-4 seen, 2e-4 held with the dense-mask softmax), so a gradient of ~1e-8 from
        # cancelling terms differs by a few percent (the gradients themselves agree: next test)
        adam_parity(tensor, mega_w[name], start[name], eps_tol=3e-4)
    for name in (ROUTER, "model.layers.1.mlp.experts.2.down_proj.weight"):
        assert float((mega_w[name] - start[name]).abs().max()) > 0.5 * LR, name  # they moved
    assert torch.allclose(torch_b.critic.value_head.weight, mega.critic.value_head.weight,
                          atol=1e-5, rtol=0)  # fmt: skip
    # the critic: attention and embeddings frozen, router and experts train
    changed = {n for n, p in mega.critic.named_parameters() if not torch.equal(critic_before[n], p)}
    frozen = set(mega.frozen_critic_params)
    assert "body.decoder.layers.0.self_attention.linear_qkv.weight" in frozen
    assert not changed & frozen
    expert = "body.decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.weight"
    assert {"body.decoder.layers.0.mlp.router.weight", expert} <= changed


def test_the_moe_gradients_equal_the_torch_backends(tiny_moe_dir: Path) -> None:
    # Adam's eps = 1 makes the first update ~ lr * grad: the weight deltas compare gradients
    sgd_like = {"lr": 1.0, "eps": 1.0, "grad_clip": 0.0}
    settings = {"actor": sgd_like, "critic": {"optimizer": sgd_like}}
    torch_b = make(tiny_moe_dir, "torch", **settings)
    mega = make(tiny_moe_dir, "megatron", **settings)
    batch = parity_batch(torch_b)
    start = load_file(tiny_moe_dir / "model.safetensors")
    objective = StepObjective(algorithm="li2sao", phase="bootstrap")
    close_metrics(torch_b.train_step(batch, objective), mega.train_step(batch, objective))
    torch_w = dict(torch_b.named_weights())
    for name, tensor in mega.named_weights():
        d_torch, d_mega = torch_w[name] - start[name], tensor - start[name]
        assert float(d_torch.abs().max()) > 0, name  # every tensor (router, experts) has a gradient
        assert torch.allclose(d_mega, d_torch, atol=3e-7, rtol=1e-3), name


def test_the_moe_export_loads_in_transformers_with_the_same_logprobs(
    tiny_moe_dir: Path, tmp_path: Path
) -> None:
    mega = make(tiny_moe_dir, "megatron", actor={"lr": LR})
    batch = parity_batch(make(tiny_moe_dir, "torch"))
    mega.train_step(batch, StepObjective(algorithm="grpo"))
    out = mega.export_hf(tmp_path / "export")
    exported = load_file(out / "model.safetensors")
    assert not torch.equal(exported[ROUTER], load_file(tiny_moe_dir / "model.safetensors")[ROUTER])
    lm = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    inputs = pack_inputs(batch, [(r,) for r in range(batch.num_rows)])
    with torch.no_grad():
        want = torch.log_softmax(PolicyScorer(lm)(inputs), -1)
        got = torch.log_softmax(mega.scorer(inputs), -1)
    assert float((want - got)[batch.action_mask].abs().max()) < 1e-5


def test_moe_shapes_and_parallel_settings_not_built_are_named(
    tiny_moe_dir: Path, tiny_model_dir: Path
) -> None:
    config = AutoConfig.from_pretrained(tiny_moe_dir)
    check_supported(config)  # the tiny MoE itself is fine
    config.norm_topk_prob = False
    with pytest.raises(BackendError, match="norm_topk_prob=False"):
        check_supported(config)
    config = AutoConfig.from_pretrained(tiny_moe_dir)
    config.mlp_only_layers = [1]
    with pytest.raises(BackendError, match=r"mlp_only_layers=\[1\]"):
        check_supported(config)
    with pytest.raises(BackendError, match="model_type 'llama'"):
        check_supported(LlamaConfig())
    # refused before any process group or parallel_state changes
    with pytest.raises(BackendError, match="expert parallel size 2 needs a MoE model"):
        make(tiny_model_dir, "megatron", megatron={"expert_parallel": 2})
    with pytest.raises(BackendError, match="num_experts=4 does not split over expert parallel"):
        make(tiny_moe_dir, "megatron", megatron={"expert_parallel": 3})
    with pytest.raises(BackendError, match="a MoE model under pipeline parallel is not built"):
        make(tiny_moe_dir, "megatron", megatron={"pipeline_parallel": 2})


def test_activation_recompute_through_the_moe_layers_takes_the_same_step(
    tiny_moe_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recompute_parity(tiny_moe_dir, monkeypatch)  # router and experts recomputed too
