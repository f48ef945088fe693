"""How the adapter turns a chat request's sampling fields into the engine's sampling params."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from adapter.errors import APIError
from adapter.openai_schema import parse_chat_request
from adapter.rendering import ContextLengthError
from adapter.service import AdapterService


def sampling(body: dict[str, Any], prompt_len: int = 10, context: int = 100) -> dict[str, Any]:
    """``AdapterService._sampling`` on a stand-in ``self`` holding only what it reads."""
    owner = SimpleNamespace(
        renderer=SimpleNamespace(context_length=context),
        config=SimpleNamespace(default_max_tokens=32),
    )
    request = parse_chat_request({"messages": [{"role": "user", "content": "hi"}], **body})
    params = AdapterService._sampling(owner, request, prompt_len)  # type: ignore[arg-type]
    return params.model_dump(exclude_defaults=True)


def test_every_honoured_sampling_field_reaches_the_engine() -> None:
    body = {"temperature": 0.5, "top_p": 0.9, "top_k": 7, "stop": ["END"], "seed": 4,
            "ignore_eos": True, "max_tokens": 20}  # fmt: skip
    assert sampling(body) == {
        "max_new_tokens": 20,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 7,
        "stop": ["END"],
        "sampling_seed": 4,
        "ignore_eos": True,
    }


def test_defaults_send_only_the_budget() -> None:
    assert sampling({}) == {"max_new_tokens": 32}
    assert sampling({"ignore_eos": False}) == {"max_new_tokens": 32}


def test_budget_is_cut_to_the_context_left_and_a_full_prompt_is_refused() -> None:
    assert sampling({"max_tokens": 500}, prompt_len=90, context=100)["max_new_tokens"] == 10
    with pytest.raises(ContextLengthError):
        sampling({}, prompt_len=100, context=100)


def test_ignore_eos_must_be_a_boolean() -> None:

    with pytest.raises(APIError) as info:
        parse_chat_request({"messages": [{"role": "user", "content": "x"}], "ignore_eos": "yes"})
    assert info.value.param == "ignore_eos"
