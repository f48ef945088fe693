"""Relay mode's pure parts: the upstream request built from the agent's, the upstream answer
read defensively (a malformed one is the upstream's failure, never the agent's), and the mode
chosen by the configuration."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from adapter.config import AdapterConfig
from adapter.openai_schema import parse_chat_request
from adapter.relay import UpstreamClient, UpstreamUnavailableError, parse_answer, upstream_body

TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]


def answer(message: dict[str, Any], reason: str = "stop", **extra: Any) -> dict[str, Any]:
    return {"choices": [{"message": message, "finish_reason": reason}], **extra}


def test_the_upstream_gets_the_agents_request_with_its_own_model_and_no_stream() -> None:
    request = parse_chat_request(
        {"model": "agent-side", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
         "stream": True, "temperature": 0.2, "seed": 7, "top_k": 5, "max_tokens": 64},
        tracked=True,
    )  # fmt: skip
    body = upstream_body(request, "gpt-x", max_tokens=1024)
    assert body == {
        "model": "gpt-x",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": TOOLS,
        "stream": False,
        "temperature": 0.2,
        "seed": 7,
        "max_tokens": 64,
    }  # fmt: skip  (top_k: not an OpenAI field, dropped)
    plain = upstream_body(parse_chat_request({"messages": [{"role": "user", "content": "x"}]}),
                          "m", max_tokens=99)  # fmt: skip
    assert plain["max_tokens"] == 99 and "tools" not in plain


def test_answers_are_read_defensively() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    message, reason, counts = parse_answer(
        answer({"role": "assistant", "content": None, "tool_calls": [call]}, "stop",
               usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
    )  # fmt: skip
    assert reason == "tool_calls" and message["tool_calls"] == [call]
    assert counts == {"prompt_tokens": 3, "completion_tokens": 2}
    message, reason, counts = parse_answer(answer({"role": "assistant", "content": None}, "odd"))
    assert message == {"role": "assistant", "content": ""} and reason == "stop" and counts == {}
    no_id = {"type": "function", "function": {"name": "run", "arguments": "{}"}}
    message, _, _ = parse_answer(answer({"content": "", "tool_calls": [no_id]}))
    assert message["tool_calls"][0]["id"].startswith("call_")  # the agent needs an id to answer
    for bad in (
        {},
        {"choices": []},
        {"choices": ["x"]},
        answer("text"),  # type: ignore[arg-type]
        answer({"content": 3}),
        answer({"content": "", "tool_calls": [{"function": {"arguments": "{}"}}]}),
        answer({"content": "", "tool_calls": [{"function": {"name": "r", "arguments": {}}}]}),
    ):
        with pytest.raises(UpstreamUnavailableError):
            parse_answer(bad)


def test_the_configuration_picks_one_mode() -> None:
    relay = AdapterConfig(upstream={"url": "https://llm.internal/v1/", "model": "gpt-x"})
    assert relay.relay and relay.upstream is not None and relay.upstream.url.endswith("/v1")
    assert not AdapterConfig(engines=["http://e:1"], model="/m").relay
    problems = {
        "engines and upstream exclude each other": {
            "engines": ["http://e:1"], "upstream": {"url": "http://u/v1", "model": "m"}},
        "engines\n  Field required": {"model": "/m"},
        "model\n  Field required": {"engines": ["http://e:1"]},
        "at least one engine URL (or upstream": {"engines": [], "model": "/m"},
        "the model directory is required": {"engines": ["http://e:1"], "model": ""},
        "upstream URL must start with http": {"upstream": {"url": "ftp://u", "model": "m"}},
        "api_key_env": {"upstream": {"url": "http://u", "model": "m", "api_key_env": "A B"}},
    }  # fmt: skip
    for message, raw in problems.items():
        with pytest.raises(ValidationError, match=re.escape(message)):
            AdapterConfig(**raw)


def test_a_missing_api_key_is_named_not_sent_empty() -> None:
    config = AdapterConfig(upstream={"url": "http://u/v1", "model": "m", "api_key_env": "K"})
    assert config.upstream is not None
    with pytest.raises(ValueError, match=r"\$K is not set"):
        UpstreamClient(config.upstream, environ={})
