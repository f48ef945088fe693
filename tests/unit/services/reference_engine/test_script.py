"""Scripted-mode script files: parsing, validation and turn selection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.reference_engine.script import ScriptBook, ScriptError, count_assistant_turns


def write(scratch: Path, lines: list[Any]) -> Path:
    path = scratch / "script.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def load(path: Path, tokenizer: Any) -> ScriptBook:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return ScriptBook.load(path, tokenizer, eos, len(tokenizer))


def test_text_turns_are_tokenised_with_end_of_turn(scratch: Path, tokenizer: Any) -> None:
    book = load(
        write(scratch, [{"match": "T1", "turns": ["hello world", "bye<|im_end|>"]}]), tokenizer
    )
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    first, second = book.scripts[0].turns
    assert first[-1] == eos and first.count(eos) == 1
    assert tokenizer.decode(list(first[:-1])) == "hello world"
    assert second[-1] == eos and second.count(eos) == 1


def test_token_id_turns_are_used_verbatim(scratch: Path, tokenizer: Any) -> None:
    book = load(write(scratch, [[[5, 6, 7]]]), tokenizer)
    assert book.scripts[0].match == ""
    assert book.scripts[0].turns == ((5, 6, 7),)


def test_selection_by_marker_and_turn(scratch: Path, tokenizer: Any) -> None:
    book = load(
        write(
            scratch,
            [{"match": "task-A", "turns": ["a0", "a1"]}, {"match": "task-B", "turns": ["b0"]}],
        ),
        tokenizer,
    )
    first = "<|im_start|>user\ntask-A please<|im_end|>\n<|im_start|>assistant\n"
    script, turn, ids = book.select(first)
    assert (script.match, turn) == ("task-A", 0)
    assert tokenizer.decode(list(ids), skip_special_tokens=True) == "a0"
    second = first + "a0<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    _, turn, ids = book.select(second)
    assert turn == 1 and tokenizer.decode(list(ids), skip_special_tokens=True) == "a1"
    _, turn, ids = book.select("<|im_start|>user\ntask-B<|im_end|>\n<|im_start|>assistant\n")
    assert turn == 0 and tokenizer.decode(list(ids), skip_special_tokens=True) == "b0"


def test_no_match_and_exhausted_script_are_clear_errors(scratch: Path, tokenizer: Any) -> None:
    book = load(write(scratch, [{"match": "task-A", "turns": ["a0"]}]), tokenizer)
    with pytest.raises(ScriptError, match="no script"):
        book.select("<|im_start|>user\nother<|im_end|>\n<|im_start|>assistant\n")
    exhausted = "<|im_start|>user\ntask-A<|im_end|>\n<|im_start|>assistant\na0<|im_end|>\n" * 1
    with pytest.raises(ScriptError, match="has 1 turns"):
        book.select(exhausted + "<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('"just a string"', "JSON list or object"),
        ('{"match": "x", "turns": []}', "non-empty list"),
        ('{"match": 3, "turns": ["a"]}', "'match' must be a string"),
        ('{"match": "x", "turns": ["a"], "extra": 1}', "unknown keys"),
        ("[[1, 999999]]", "outside the vocabulary"),
        ("[[]]", "string or a non-empty list"),
        ("\n\n", "holds no scripts"),
    ],
)
def test_malformed_script_files_are_rejected(
    scratch: Path, tokenizer: Any, content: str, message: str
) -> None:
    path = scratch / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ScriptError, match=message):
        load(path, tokenizer)


def test_missing_script_file(scratch: Path, tokenizer: Any) -> None:
    with pytest.raises(ScriptError, match="cannot read"):
        load(scratch / "missing.jsonl", tokenizer)


@pytest.mark.parametrize(
    ("prompt", "turns"),
    [
        ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", 0),
        (
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nx<|im_end|>\n<|im_start|>assistant\n",
            1,
        ),
        ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nx<|im_end|>\n", 1),
        ("no chat markup at all", 0),
    ],
)
def test_count_assistant_turns(prompt: str, turns: int) -> None:
    assert count_assistant_turns(prompt) == turns
