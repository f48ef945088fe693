"""Prompts are bounded before tokenising, tokenised exactly; long texts go to worker processes."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from adapter.config import AdapterConfig
from adapter.messages import canonical
from adapter.openai_schema import ChatMessage
from adapter.rendering import PROCESS_MIN_CHARS, ContextLengthError, Renderer
from adapter.tokenize_worker import TokenizerProcesses, TokenizerWorkerError

TEXTS = [
    "hello world",
    "def f(x):\n    return x + 1\n\n\n",
    "<|im_start|>user\nhi<|im_end|>\n<tool_call>{}</tool_call>",
    "é e\u0301 日本語 🙂 " * 5,
    " " * 300 + "-" * 300 + "=" * 300,
]


class CountingBackend:
    """Wraps the Rust tokenizer and counts encode calls (the rest is passed through)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.encoded = 0

    def encode_batch(self, *args: Any, **kwargs: Any) -> Any:
        self.encoded += 1
        return self.real.encode_batch(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.fixture(scope="module")
def renderer(tiny_model_dir: Path) -> Renderer:
    return Renderer(tiny_model_dir)


def test_no_text_has_more_bytes_per_token_than_the_bound(renderer: Renderer) -> None:
    """The byte bound never refuses a prompt that fits: for every token of the vocabulary
    repeated, and ordinary texts, bytes <= tokens * bytes_per_token."""
    vocab = renderer.tokenizer
    samples = [vocab.decode([i], skip_special_tokens=False) * 20 for i in range(len(vocab))]
    for text in [*samples, *TEXTS]:
        ids = vocab.encode(text, add_special_tokens=False)
        assert len(text.encode("utf-8", "surrogatepass")) <= len(ids) * renderer.bytes_per_token


def test_encode_prompt_matches_the_tokenizer(renderer: Renderer) -> None:
    for text in TEXTS:
        expected = renderer.tokenizer.encode(text, add_special_tokens=False)
        assert renderer.encode_prompt(text) == expected
        assert renderer.encode(text) == expected


def test_too_many_bytes_are_refused_without_tokenising(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = Renderer(tiny_model_dir, context_length=64)
    counting = CountingBackend(small._backend)
    monkeypatch.setattr(small, "_backend", counting)
    text = "x" * int(64 * small.bytes_per_token + 1)
    with pytest.raises(ContextLengthError) as caught:
        small.encode_prompt(text)
    assert counting.encoded == 0
    assert caught.value.status == 400
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length is 64 tokens" in caught.value.message
    assert f"{len(text)} bytes of text" in caught.value.message


def test_too_many_tokens_are_refused_after_tokenising(tiny_model_dir: Path) -> None:
    small = Renderer(tiny_model_dir, context_length=64)
    text = "word " * 100  # within the byte bound, but ~100 tokens
    assert len(text) < 64 * small.bytes_per_token
    with pytest.raises(ContextLengthError) as caught:
        small.encode_prompt(text)
    n = len(small.tokenizer.encode(text, add_special_tokens=False))
    assert f"the prompt is {n} tokens" in caught.value.message
    # Tokens already in the segment count too: 60 known + 4 new reach the window.
    with pytest.raises(ContextLengthError):
        small.encode_prompt("word word word word", known_tokens=60)
    assert small.encode_prompt("word", known_tokens=60) == small.encode("word")


def test_configured_bytes_per_token_tightens_the_bound(tiny_model_dir: Path) -> None:
    tight = Renderer(tiny_model_dir, context_length=64, max_bytes_per_token=2)
    with pytest.raises(ContextLengthError, match="at most 2 bytes per token"):
        tight.encode_prompt("x" * 129)


@pytest.mark.slow  # starts a tokenizer process
def test_long_texts_go_to_tokenizer_processes(tiny_model_dir: Path) -> None:
    big = Renderer(tiny_model_dir, context_length=200_000)
    processes = TokenizerProcesses(big.tokenizer_json() or "", 1)
    calls: list[int] = []

    def recorded(text: str, limit: int) -> tuple[int, list[int] | None]:
        calls.append(len(text))
        return processes.encode(text, limit)

    try:
        processes.warm_up()
        big.large_text_encoder = recorded
        text = "".join(TEXTS) * (PROCESS_MIN_CHARS // len("".join(TEXTS)) + 1)
        expected = big.tokenizer.encode(text, add_special_tokens=False)
        assert big.encode_prompt(text) == expected
        assert calls == [len(text)]
        assert processes.encode(text, len(expected)) == (len(expected), None)
        assert big.encode_prompt("short") == big.encode("short")  # stays in this process
        assert calls == [len(text)]
    finally:
        processes.close()


@pytest.mark.slow  # starts and kills tokenizer processes
def test_a_killed_tokenizer_process_is_a_clear_error_then_replaced(renderer: Renderer) -> None:
    processes = TokenizerProcesses(renderer.tokenizer_json() or "", 1)
    try:
        processes.warm_up()
        workers = [p for p in multiprocessing.active_children() if p.name.startswith("Spawn")]
        assert workers
        for worker in workers:
            os.kill(worker.pid or 0, signal.SIGKILL)
            worker.join(timeout=60)
        with pytest.raises(TokenizerWorkerError, match="tokenizer process died"):
            processes.encode("hello world", 100)
        ids = renderer.encode("hello world")
        assert processes.encode("hello world", 100) == (len(ids), ids)
    finally:
        processes.close()


def test_long_messages_compare_by_whitespace_normalised_text() -> None:
    """Long contents are normalised in slices (the GIL is released between them); the key is
    still the text with every whitespace run made one space."""
    texts = [
        ("word \n\t " * 40_000) + "end",
        "x" * 100_000 + " \u00a0\x1c " + "y" * 10,
        " " * 70_000,
        ("a" * 65_535 + "\n\n") * 3,
    ]
    for text in texts:
        key = canonical(ChatMessage(role="user", content=text))
        assert key[1] == " ".join(text.split())


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("redis_max_connections", 0),
        ("engine_max_connections", 0),
        ("engine_connect_timeout_s", 0),
        ("redis_pool_timeout_s", 0),
        ("tokenizer_threads", 0),
        ("tokenizer_processes", -1),
        ("max_bytes_per_token", 0),
        ("max_body_bytes", 100),
    ],
)
def test_limits_are_validated(key: str, value: float) -> None:
    with pytest.raises(ValidationError, match=key):
        AdapterConfig(engines=["http://e"], model="m", **{key: value})
