"""The tiny model: deterministic, small, offline, loadable by transformers with Qwen tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.tiny_model.build import (
    build_tiny_model,
    ensure_tiny_model,
    main,
    model_spec,
    read_stamp,
)

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "swerl_tiny_model.json",
}


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_same_seed_gives_identical_bytes(scratch: Path) -> None:
    first = _files(build_tiny_model(scratch / "a", seed=3))
    second = _files(build_tiny_model(scratch / "b", seed=3))
    assert set(first) == EXPECTED_FILES
    assert first == second


def test_seed_changes_weights_but_not_tokenizer(scratch: Path, tiny_model_dir: Path) -> None:
    other = _files(build_tiny_model(scratch / "seed5", seed=5))
    base = _files(tiny_model_dir)
    assert other["tokenizer.json"] == base["tokenizer.json"]
    assert other["model.safetensors"] != base["model.safetensors"]


def test_directory_is_small(tiny_model_dir: Path) -> None:
    total = sum(p.stat().st_size for p in tiny_model_dir.iterdir())
    assert total < 2_000_000, f"tiny model is {total} bytes"


def test_loads_as_qwen3_with_matching_vocab(tiny_model_dir: Path, tokenizer: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    config = model.config
    assert config.model_type == "qwen3"
    assert config.num_hidden_layers == 2
    assert config.hidden_size == 64
    assert config.vocab_size == len(tokenizer)
    assert 2000 <= len(tokenizer) <= 4096
    assert model.dtype == torch.float32
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert GenerationConfig.from_pretrained(str(tiny_model_dir)).eos_token_id == im_end
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    logits = model(torch.tensor([[1, 2, 3, im_end]])).logits
    assert logits.shape == (1, 4, config.vocab_size)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize(
    "token",
    [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
    ],
)
def test_qwen_tokens_are_single_tokens(tokenizer: Any, token: str) -> None:
    ids = tokenizer.encode("a" + token + "b", add_special_tokens=False)
    assert tokenizer.convert_tokens_to_ids(token) in ids
    assert len(tokenizer.encode(token, add_special_tokens=False)) == 1


def test_control_tokens_are_special_but_tool_markers_survive_decoding(tokenizer: Any) -> None:
    text = "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert (
        tokenizer.decode(ids, skip_special_tokens=True)
        == "assistant\n<tool_call>\n{}\n</tool_call>"
    )
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize(
    "text",
    [
        "def f(x):\n    return x + 1\n",
        '{"name": "execute_bash", "arguments": {"command": "ls -la"}}',
        "Ünïcödé — emoji 🚀 and CJK 漢字, tabs\tand  double  spaces\r\n",
        "$ git diff --stat && echo 'done'",
    ],
)
def test_byte_level_tokenizer_round_trips(tokenizer: Any, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_ensure_builds_once_and_reuses(scratch: Path) -> None:
    target = scratch / "cached"
    ensure_tiny_model(target)
    before = (target / "model.safetensors").stat().st_mtime_ns
    ensure_tiny_model(target)
    assert (target / "model.safetensors").stat().st_mtime_ns == before


def test_ensure_refuses_another_variant(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="different tiny model variant"):
        ensure_tiny_model(tiny_model_dir, coder=True)
    with pytest.raises(ValueError, match="different tiny model variant"):
        ensure_tiny_model(tiny_model_dir, seed=1)


def test_sizes_build_a_larger_model_of_the_same_family(scratch: Path, tiny_model_dir: Path) -> None:
    sizes = {"hidden_size": 96, "intermediate_size": 160, "num_hidden_layers": 3}
    target = build_tiny_model(scratch / "wider", sizes=sizes)
    config = json.loads((target / "config.json").read_text())
    assert {k: config[k] for k in sizes} == sizes
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert _files(target)["tokenizer.json"] == _files(tiny_model_dir)["tokenizer.json"]
    assert read_stamp(target)["hidden_size"] == 96  # type: ignore[index]
    assert ensure_tiny_model(target, sizes=sizes) == target  # the cached build is reused
    with pytest.raises(ValueError, match="different tiny model variant"):
        ensure_tiny_model(target)  # the default shape is another variant
    with pytest.raises(ValueError, match="different tiny model variant"):
        ensure_tiny_model(tiny_model_dir, sizes=sizes)


def test_unknown_or_bad_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"unknown model sizes \['hiden_size'\]"):
        model_spec(sizes={"hiden_size": 96})
    with pytest.raises(ValueError, match="unknown model sizes"):
        model_spec(sizes={"seed": 3})  # not a size
    with pytest.raises(ValueError, match="positive"):
        model_spec(sizes={"num_hidden_layers": 0})


def test_ensure_refuses_a_foreign_directory(scratch: Path) -> None:
    (scratch / "foreign").mkdir()
    (scratch / "foreign" / "notes.txt").write_text("not a model")
    with pytest.raises(FileExistsError):
        ensure_tiny_model(scratch / "foreign")


def test_negative_seed_is_rejected(scratch: Path) -> None:
    with pytest.raises(ValueError, match="seed"):
        build_tiny_model(scratch / "x", seed=-1)
    with pytest.raises(SystemExit):
        main([str(scratch / "y"), "--seed", "-2"])


def test_cli_builds_the_coder_variant(scratch: Path) -> None:
    assert main([str(scratch / "coder"), "--coder", "--seed", "2"]) == 0
    stamp = read_stamp(scratch / "coder")
    assert stamp is not None and stamp["coder"] is True and stamp["seed"] == 2
    template = (scratch / "coder" / "chat_template.jinja").read_text()
    assert "<function=" in template
    config = json.loads((scratch / "coder" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]


def _swiglu(x: Any, gate: Any, up: Any, down: Any) -> Any:
    import torch

    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


def test_moe_variant_is_qwen3_moe_with_renormalised_top2_routing(
    tiny_moe_dir: Path, tiny_model_dir: Path
) -> None:
    """The MoE variant: Qwen3-MoE, 4 experts, top-2, aux loss off; and its sparse block computes
    what docs and build.py state (softmax over experts, top-2 renormalised to sum 1, no token
    dropped), recomputed here from the saved per-expert matrices."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    config = json.loads((tiny_moe_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert config["num_experts"] == 4 and config["num_experts_per_tok"] == 2
    assert config["norm_topk_prob"] is True
    assert config["router_aux_loss_coef"] == 0.0 and config["output_router_logits"] is False
    assert _files(tiny_moe_dir)["tokenizer.json"] == _files(tiny_model_dir)["tokenizer.json"]
    assert sum(p.stat().st_size for p in tiny_moe_dir.iterdir()) < 2_000_000
    assert read_stamp(tiny_moe_dir)["moe"] is True  # type: ignore[index]

    model = AutoModelForCausalLM.from_pretrained(str(tiny_moe_dir)).eval()
    weights = load_file(str(tiny_moe_dir / "model.safetensors"))
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    prefix = "model.layers.1.mlp."
    probs = torch.softmax(x @ weights[prefix + "gate.weight"].T, dim=-1)
    top, chosen = torch.topk(probs, 2, dim=-1)
    top = top / top.sum(-1, keepdim=True)
    expected = torch.zeros_like(x)
    for token in range(x.shape[0]):  # every token reaches its two experts: nothing dropped
        for k in range(2):
            e = f"{prefix}experts.{int(chosen[token, k])}."
            out = _swiglu(
                x[token],
                weights[e + "gate_proj.weight"],
                weights[e + "up_proj.weight"],
                weights[e + "down_proj.weight"],
            )
            expected[token] += top[token, k] * out
    with torch.no_grad():
        got = model.model.layers[1].mlp(x[None])[0]
    assert torch.allclose(got, expected, atol=1e-6, rtol=0)
    assert len(set(chosen.flatten().tolist())) == 4  # a random router uses every expert
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, config["vocab_size"]) and torch.isfinite(logits).all()


def test_moe_variant_is_its_own_cache_entry(tiny_moe_dir: Path, tiny_model_dir: Path) -> None:
    assert ensure_tiny_model(tiny_moe_dir, moe=True) == tiny_moe_dir
    with pytest.raises(ValueError, match="different tiny model variant"):
        ensure_tiny_model(tiny_moe_dir)
    with pytest.raises(ValueError, match="different tiny model variant"):
        ensure_tiny_model(tiny_model_dir, moe=True)
    with pytest.raises(ValueError, match="exceeds num_experts"):
        model_spec(moe=True, sizes={"num_experts": 2, "num_experts_per_tok": 3})


def test_stamps_from_before_the_moe_fields_still_match(scratch: Path) -> None:
    """A cached dense build stamped before ``moe`` existed is the dense variant, not a mismatch."""
    target = build_tiny_model(scratch / "old")
    stamp = json.loads((target / "swerl_tiny_model.json").read_text())
    for key in ("moe", "num_experts", "num_experts_per_tok", "moe_intermediate_size"):
        del stamp[key]
    (target / "swerl_tiny_model.json").write_text(json.dumps(stamp))
    assert ensure_tiny_model(target) == target
    with pytest.raises(ValueError, match="different tiny model variant"):
        ensure_tiny_model(target, moe=True)


def test_cli_builds_the_moe_variant(scratch: Path) -> None:
    assert main([str(scratch / "moe"), "--moe", "--seed", "1"]) == 0
    config = json.loads((scratch / "moe" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert read_stamp(scratch / "moe")["seed"] == 1  # type: ignore[index]
