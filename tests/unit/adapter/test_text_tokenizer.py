"""The tokenizers-only tokenizer gives transformers' ids, texts and special-token facts."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapter.text_tokenizer import TextTokenizer

TEXTS = [
    "hello world",
    "def f(x):\n    return x + 1\n\n\n",
    "<|im_start|>user\nhi<|im_end|>\n<tool_call>{}</tool_call><think>\n</think>",
    "<|endoftext|><|im_end|><|im_end|> <|im_start|>",
    "é e\u0301 日本語 🙂 " * 5,
    " " * 300 + "-" * 300 + "=" * 300,
    "it 's a test , isn't it ? yes !",
    "<|new_marker|> and <|new_marker|>x",
    "",
]


def _copy_tokenizer(source: Path, target: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    target.mkdir()
    for name in ("tokenizer.json", "chat_template.jinja", "config.json"):
        if (source / name).is_file():
            shutil.copy(source / name, target / name)
    config = json.loads((source / "tokenizer_config.json").read_text())
    edit(config)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


def _qwen2_class(config: dict[str, Any]) -> None:
    """transformers rebuilds a Qwen2Tokenizer from the vocabulary and merges (real Qwen3)."""
    config["tokenizer_class"] = "Qwen2Tokenizer"


def _declared_tokens(config: dict[str, Any]) -> None:
    """Special tokens tokenizer_config.json declares and tokenizer.json lacks."""
    config["additional_special_tokens"] = ["<|new_marker|>"]
    config["bos_token"] = {"content": "<|new_bos|>", "special": True, "__type": "AddedToken"}
    config["clean_up_tokenization_spaces"] = True
    del config["model_max_length"]


@pytest.fixture(scope="module", params=["tiny", "tiny_coder", "qwen2_class", "declared_tokens"])
def model_dir(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    tiny_coder_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "tiny":
        return tiny_model_dir
    if request.param == "tiny_coder":
        return tiny_coder_dir
    edit = _qwen2_class if request.param == "qwen2_class" else _declared_tokens
    return _copy_tokenizer(tiny_model_dir, root / "model", edit)


@pytest.fixture(scope="module")
def pair(model_dir: Path) -> tuple[TextTokenizer, Any]:
    transformers = pytest.importorskip("transformers")
    return TextTokenizer(model_dir), transformers.AutoTokenizer.from_pretrained(str(model_dir))


def test_special_tokens_and_vocabulary_match_transformers(pair: tuple[TextTokenizer, Any]) -> None:
    ours, hf = pair
    assert len(ours) == len(hf)
    assert ours.special_tokens_map == hf.special_tokens_map
    assert ours.eos_token == hf.eos_token
    assert ours.eos_token_id == hf.eos_token_id
    assert ours.pad_token_id == hf.pad_token_id
    assert ours.model_max_length == hf.model_max_length
    for token in [*hf.all_special_tokens, "<tool_call>", "hello", "<|not a token|>"]:
        assert ours.convert_tokens_to_ids(token) == hf.convert_tokens_to_ids(token), token


def test_encode_matches_transformers(pair: tuple[TextTokenizer, Any]) -> None:
    ours, hf = pair
    for text in TEXTS:
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False), text
        assert (
            ours.encode(text, add_special_tokens=False)
            == ours.backend.encode(text, add_special_tokens=False).ids
        )


def test_decode_matches_transformers(pair: tuple[TextTokenizer, Any]) -> None:
    ours, hf = pair
    rng = random.Random(0)
    sequences = [ours.encode(text) for text in TEXTS]
    sequences += [[rng.randrange(len(ours)) for _ in range(40)] for _ in range(20)]
    for ids in sequences:
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip
            ), (ids, skip)


def test_the_tokenizer_definition_round_trips(pair: tuple[TextTokenizer, Any]) -> None:
    """What tokenizer processes load (to_str) encodes like the tokenizer itself."""
    from tokenizers import Tokenizer

    ours, _ = pair
    child = Tokenizer.from_str(ours.to_str())
    for text in TEXTS:
        assert child.encode(text, add_special_tokens=False).ids == ours.encode(text)


def test_a_model_without_tokenizer_json_names_the_fix(tmp_path: Path, tiny_model_dir: Path) -> None:
    shutil.copy(tiny_model_dir / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        TextTokenizer(tmp_path)
