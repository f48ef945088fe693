"""HF <-> Megatron weight conversion: bit-exact round trips (the tiny model, a grouped-query
shape over two tensor-parallel ranks, the tiny MoE whole and over two expert ranks, a
2-KV-head MoE over two tensor-parallel ranks), the fused layouts, and clear errors."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from trainer.backends.base import BackendError
from trainer.backends.megatron.convert import hf_to_megatron, megatron_to_hf, merge_expert_parallel


def gqa_config(tie: bool = False) -> SimpleNamespace:
    # 4 query heads in 2 groups of head_dim 3, hidden 5, MLP 4, vocab 6: every tensor distinct
    return SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, head_dim=3,
                           hidden_size=5, intermediate_size=4, vocab_size=6,
                           num_hidden_layers=1, tie_word_embeddings=tie)  # fmt: skip


def gqa_weights(tie: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {
        "model.embed_tokens.weight": (6, 5),
        "model.norm.weight": (5,),
        "model.layers.0.input_layernorm.weight": (5,),
        "model.layers.0.post_attention_layernorm.weight": (5,),
        "model.layers.0.self_attn.q_proj.weight": (12, 5),
        "model.layers.0.self_attn.k_proj.weight": (6, 5),
        "model.layers.0.self_attn.v_proj.weight": (6, 5),
        "model.layers.0.self_attn.o_proj.weight": (5, 12),
        "model.layers.0.self_attn.q_norm.weight": (3,),
        "model.layers.0.self_attn.k_norm.weight": (3,),
        "model.layers.0.mlp.gate_proj.weight": (4, 5),
        "model.layers.0.mlp.up_proj.weight": (4, 5),
        "model.layers.0.mlp.down_proj.weight": (5, 4),
    }
    if not tie:
        shapes["lm_head.weight"] = (6, 5)
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def test_the_tiny_model_round_trips_bit_exactly(tiny_model_dir: Path) -> None:
    config = AutoConfig.from_pretrained(tiny_model_dir)
    hf = load_file(tiny_model_dir / "model.safetensors")
    megatron = hf_to_megatron(hf, config)
    assert "decoder.layers.1.self_attention.linear_qkv.weight" in megatron
    back = megatron_to_hf([megatron], config)
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[name], hf[name]) for name in hf)


@pytest.mark.parametrize("tie", [False, True])
def test_two_tensor_parallel_shards_round_trip_bit_exactly(tie: bool) -> None:
    config, hf = gqa_config(tie), gqa_weights(tie)
    shards = [hf_to_megatron(hf, config, rank, tp=2) for rank in range(2)]
    back = megatron_to_hf(shards, config)
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[name], hf[name]) for name in hf)
    assert ("output_layer.weight" in shards[0]) is not tie


def test_fused_layouts_follow_megatron_per_group_and_rank() -> None:
    config, hf = gqa_config(), gqa_weights()
    q, k, v = (hf[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    whole = hf_to_megatron(hf, config)
    # group 0: query heads 0 and 1 (rows 0-5), key head 0, value head 0; then group 1
    expected_qkv = torch.cat([q[0:6], k[0:3], v[0:3], q[6:12], k[3:6], v[3:6]])
    assert torch.equal(whole["decoder.layers.0.self_attention.linear_qkv.weight"], expected_qkv)
    assert torch.equal(whole["decoder.layers.0.mlp.linear_fc1.weight"], torch.cat([gate, up]))
    rank1 = hf_to_megatron(hf, config, rank=1, tp=2)
    assert torch.equal(rank1["decoder.layers.0.self_attention.linear_qkv.weight"],
                       torch.cat([q[6:12], k[3:6], v[3:6]]))  # fmt: skip
    assert torch.equal(rank1["decoder.layers.0.mlp.linear_fc1.weight"],
                       torch.cat([gate[2:4], up[2:4]]))  # fmt: skip
    o = hf["model.layers.0.self_attn.o_proj.weight"]
    assert torch.equal(rank1["decoder.layers.0.self_attention.linear_proj.weight"], o[:, 6:12])
    embed = hf["model.embed_tokens.weight"]
    assert torch.equal(rank1["embedding.word_embeddings.weight"], embed[3:6])
    assert torch.equal(rank1["decoder.layers.0.self_attention.q_layernorm.weight"],
                       hf["model.layers.0.self_attn.q_norm.weight"])  # fmt: skip


def test_bad_weights_and_splits_are_named() -> None:
    config, hf = gqa_config(), gqa_weights()
    del hf["model.layers.0.mlp.up_proj.weight"]
    with pytest.raises(BackendError, match=r"model\.layers\.0\.mlp\.up_proj\.weight"):
        hf_to_megatron(hf, config)
    with pytest.raises(BackendError, match="num_key_value_heads=2 does not split over tensor"):
        hf_to_megatron(gqa_weights(), config, rank=0, tp=4)
    with pytest.raises(BackendError, match="no Megatron weight shards"):
        megatron_to_hf([], config)


def test_the_tiny_moe_round_trips_bit_exactly_whole_and_over_two_expert_ranks(
    tiny_moe_dir: Path,
) -> None:
    config = AutoConfig.from_pretrained(tiny_moe_dir)
    hf = load_file(tiny_moe_dir / "model.safetensors")
    whole = hf_to_megatron(hf, config)
    router = "decoder.layers.1.mlp.router.weight"
    assert torch.equal(whole[router], hf["model.layers.1.mlp.gate.weight"])
    fc1 = whole["decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight"]
    expert = "model.layers.0.mlp.experts.2."
    gate, up = hf[f"{expert}gate_proj.weight"], hf[f"{expert}up_proj.weight"]
    assert torch.equal(fc1, torch.cat([gate, up]))
    back = megatron_to_hf([whole], config)
    assert back.keys() == hf.keys() and all(torch.equal(back[n], hf[n]) for n in hf)
    # expert parallel: rank 1 of 2 holds experts 2 and 3 as its local experts 0 and 1
    ranks = [hf_to_megatron(hf, config, ep_rank=r, ep=2) for r in range(2)]
    local = "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"
    assert torch.equal(ranks[1][local], fc1)
    assert not any("local_experts.2" in n for n in ranks[1])
    merged = merge_expert_parallel(ranks, config)
    assert merged.keys() == whole.keys() and all(torch.equal(merged[n], whole[n]) for n in whole)
    with pytest.raises(BackendError, match="num_experts=4 does not split over expert parallel"):
        hf_to_megatron(hf, config, ep=3)


def test_a_moe_over_two_tensor_parallel_shards_round_trips_bit_exactly(
    tiny_moe_dir: Path, tmp_path: Path
) -> None:
    from tests.unit.trainer.backends.megatron.test_backend import gqa_model_dir

    model = gqa_model_dir(tiny_moe_dir, tmp_path / "moe-gqa", tied=True)  # 2 key/value heads
    config = AutoConfig.from_pretrained(model)
    hf = load_file(model / "model.safetensors")
    shards = [hf_to_megatron(hf, config, rank, tp=2) for rank in range(2)]
    # TP rank 1: the second half of every expert's gate and up rows, of its down columns
    expert, local = "model.layers.1.mlp.experts.3.", "decoder.layers.1.mlp.experts.local_experts.3."
    gate, up = (hf[f"{expert}{x}_proj.weight"][32:] for x in ("gate", "up"))
    assert torch.equal(shards[1][f"{local}linear_fc1.weight"], torch.cat([gate, up]))
    down = hf[f"{expert}down_proj.weight"][:, 32:]
    assert torch.equal(shards[1][f"{local}linear_fc2.weight"], down)
    router = "decoder.layers.1.mlp.router.weight"  # whole on every rank
    assert all(torch.equal(s[router], hf["model.layers.1.mlp.gate.weight"]) for s in shards)
    back = megatron_to_hf(shards, config)
    assert back.keys() == hf.keys() and all(torch.equal(back[n], hf[n]) for n in hf)
