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
