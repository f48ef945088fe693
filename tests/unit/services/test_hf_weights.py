"""Checkpoint names of a transformers model: a MoE's fused experts as per-expert views."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.hf_weights import checkpoint_tensors

pytestmark = pytest.mark.slow  # loads the tiny MoE model


def test_moe_state_dict_maps_to_the_saved_checkpoint_exactly(tiny_moe_dir: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_moe_dir), dtype=torch.float32)
    saved = load_file(str(tiny_moe_dir / "model.safetensors"))
    named = checkpoint_tensors(model.state_dict())
    named.pop("lm_head.weight")  # tied to the embeddings: not a tensor of the file
    assert set(named) == set(saved)
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in named
    for name, tensor in saved.items():
        assert torch.equal(named[name], tensor), name


def test_per_expert_tensors_are_views_that_write_through(tiny_moe_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_moe_dir), dtype=torch.float32)
    named = checkpoint_tensors(model.state_dict())
    with torch.no_grad():
        named["model.layers.1.mlp.experts.2.up_proj.weight"].fill_(0.5)
    fused = model.model.layers[1].mlp.experts.gate_up_proj
    half = fused.shape[1] // 2
    assert torch.all(fused[2, half:] == 0.5)
    assert not torch.any(fused[2, :half] == 0.5) and not torch.any(fused[1] == 0.5)


def test_dense_names_pass_through() -> None:
    state = {"a.weight": torch.zeros(2, 3), "b.experts.gate_up_proj": torch.zeros(2, 3)}
    assert checkpoint_tensors(state).keys() == state.keys()  # 2-D: not a fused expert tensor
