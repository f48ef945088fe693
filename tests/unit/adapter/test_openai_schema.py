"""Request validation (what OpenHands/litellm sends, and what must be refused) and SSE chunks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from adapter.errors import APIError
from adapter.messages import canonical, template_messages
from adapter.openai_schema import ChatMessage, parse_chat_request, stream_chunks
from tests.support.paths import TEST_DATA

TOOL = {
    "type": "function",
    "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}},
}


def openhands_like_body() -> dict[str, Any]:
    """Shape of a litellm request from the OpenHands SDK (second step of a conversation)."""
    return {
        "model": "litellm_proxy/tiny",
        "messages": [
            {
                "role": "system",
                "content": [{"type": "text", "text": "You are OpenHands.", "cache_control": {}}],
            },
            {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "name": "bash", "content": "a.py"},
        ],
        "tools": [TOOL],
        "tool_choice": "auto",
        "max_completion_tokens": 64,
        "prompt_cache_key": "conv-1",
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20.0,  # litellm sends top_k as a float
        "seed": 3,
        "presence_penalty": 0.0,
        "parallel_tool_calls": True,
        "user": "agent-7",
    }


def test_openhands_request_is_accepted() -> None:
    request = parse_chat_request(openhands_like_body())
    assert request.requested_max_tokens() == 64
    assert request.parse_tools_enabled()
    assert request.messages[0].text() == "You are OpenHands."
    assert request.messages[3].tool_call_id == "call_1"
    assert request.messages[3].name == "bash"


def test_max_tokens_alias_and_precedence() -> None:
    body = openhands_like_body()
    body.pop("max_completion_tokens")
    body["max_tokens"] = 12
    assert parse_chat_request(body).requested_max_tokens() == 12
    body["max_completion_tokens"] = 30
    assert parse_chat_request(body).requested_max_tokens() == 30


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": None}, "messages"),
        ({"n": 2}, "n=2 is not supported"),
        ({"tool_choice": "required"}, "tool_choice 'required' is not supported"),
        ({"tool_choice": {"type": "function", "function": {"name": "bash"}}}, "tool_choice"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"stop": ["", "x"]}, "stop strings must not be empty"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "only text parts are supported",
        ),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ],
)
def test_bad_requests_are_400_with_a_clear_message(patch: dict[str, Any], fragment: str) -> None:
    body = {**openhands_like_body(), **patch}
    with pytest.raises(APIError) as info:
        parse_chat_request(body)
    assert info.value.status == 400
    assert fragment in info.value.message
    assert set(info.value.body()["error"]) == {"message", "type", "code", "param"}


def test_missing_messages_named() -> None:
    with pytest.raises(APIError) as info:
        parse_chat_request({"model": "x"})
    assert info.value.message == "messages: field required"


def test_body_must_be_an_object() -> None:
    with pytest.raises(APIError) as info:
        parse_chat_request([1, 2])
    assert info.value.status == 400


def test_template_messages_flatten_parts_and_map_developer() -> None:
    msgs = [
        ChatMessage(
            role="developer", content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
        ),
        ChatMessage.model_validate(openhands_like_body()["messages"][2]),
    ]
    out = template_messages(msgs)
    assert out[0] == {"role": "system", "content": "ab"}
    assert out[1]["tool_calls"][0]["function"]["arguments"] == '{"command": "ls"}'
    as_obj = template_messages(msgs, arguments_as_object=True)
    assert as_obj[1]["tool_calls"][0]["function"]["arguments"] == {"command": "ls"}


def test_template_messages_reject_non_json_arguments_for_object_templates() -> None:
    bad = ChatMessage.model_validate(
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}
    )
    with pytest.raises(APIError) as info:
        template_messages([bad], arguments_as_object=True)
    assert info.value.status == 400
    assert "not valid JSON" in info.value.message


def _assistant(content: Any, args: Any, call_id: str = "call_a") -> ChatMessage:
    return ChatMessage.model_validate(
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [{"id": call_id, "function": {"name": "bash", "arguments": args}}],
        }
    )


def test_canonical_ignores_whitespace_key_order_and_ids() -> None:
    ours = _assistant("Let me  look.", '{"command": "ls", "timeout": 5}')
    echoed = _assistant(
        [{"type": "text", "text": " Let me look.\n"}], '{"timeout":5,"command":"ls"}', "call_b"
    )
    assert canonical(ours) == canonical(echoed)


def test_canonical_sees_real_changes() -> None:
    ours = _assistant("Let me look.", '{"command": "ls"}')
    assert canonical(ours) != canonical(_assistant("Let me look.", '{"command": "pwd"}'))
    assert canonical(ours) != canonical(_assistant("Something else.", '{"command": "ls"}'))
    plain = ChatMessage(role="assistant", content="Let me look.")
    assert canonical(ours) != canonical(plain)


def test_stream_chunks_follow_openai_format() -> None:
    message = {
        "role": "assistant",
        "content": "x" * 70,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"a": 1}'},
            }
        ],
    }
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    chunks = stream_chunks(
        cid="c1", model="m", message=message, finish_reason="tool_calls", usage_=usage
    )
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "c1" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content", "") for d in deltas) == "x" * 70
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["id"] == "call_1" and calls[0]["function"]["name"] == "bash"
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"a": 1}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == usage


SAMPLES = TEST_DATA / "openhands_requests"


@pytest.mark.parametrize("name", ["basic_00", "basic_01", "basic_02", "errors_04"])
def test_captured_openhands_requests_are_accepted(name: str) -> None:
    """What the SDK really sends with swerl's capability overrides passes the strict schema."""
    body = json.loads((SAMPLES / f"{name}.json").read_text())["request"]["body"]
    request = parse_chat_request(body, tracked=True)
    assert request.top_k == 20 and request.prompt_cache_key


def test_sdk_without_overrides_is_told_about_reasoning_effort() -> None:
    body = json.loads((SAMPLES / "no_overrides_00.json").read_text())["request"]["body"]
    with pytest.raises(APIError) as info:
        parse_chat_request(body)
    assert info.value.param == "reasoning_effort"
    assert "reasoning_effort" in info.value.message


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 5.5}, "max_tokens"),
        ({"temperature": "0.5"}, "temperature"),
        ({"top_k": "20"}, "top_k"),
        ({"stream": 1}, "stream"),
        ({"stream": "true"}, "stream"),
        ({"logprobs": 1}, "logprobs"),
        ({"n": "1"}, "n"),
        ({"seed": -1}, "seed"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),  # needs logprobs=true
        ({"frobnicate": 1}, "frobnicate"),
        ({"extra_body": {"top_k": 5}}, "extra_body"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"presence_penalty": 0.1}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"logit_bias": {"42": 5}}, "logit_bias"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"store": True}, "store"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"verbosity": "low"}, "verbosity"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
        ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
    ],
)
def test_every_field_is_honoured_or_refused_by_name(patch: dict[str, Any], param: str) -> None:
    body = {**openhands_like_body(), **patch}
    with pytest.raises(APIError) as info:
        parse_chat_request(body)
    assert info.value.status == 400
    assert info.value.param == param
    assert param in info.value.message


def test_neutral_values_and_metadata_are_accepted() -> None:
    body = {
        **openhands_like_body(),
        "frequency_penalty": 0,
        "logit_bias": {},
        "store": False,
        "modalities": ["text"],
        "metadata": {"run": "1"},
        "safety_identifier": "u1",
        "service_tier": "auto",
        "max_tokens": 5.0,  # a JSON number with a zero fraction is an integer
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
        "top_logprobs": 3,
        "response_format": {"type": "text"},
    }
    request = parse_chat_request(body, tracked=True)
    assert request.max_tokens == 5 and request.top_logprobs_num == 3


def test_response_format_maps_to_sglang_json_schema_on_untracked_routes_only() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    request = parse_chat_request({**openhands_like_body(), "response_format": fmt})
    assert request.response_format is not None
    assert json.loads(request.response_format.engine_json_schema() or "") == schema
    as_object = parse_chat_request(
        {**openhands_like_body(), "response_format": {"type": "json_object"}}
    )
    assert as_object.response_format is not None
    assert as_object.response_format.engine_json_schema() == '{"type": "object"}'
    for constrained in (fmt, {"type": "json_object"}):
        with pytest.raises(APIError) as info:
            parse_chat_request({**openhands_like_body(), "response_format": constrained}, True)
        assert info.value.param == "response_format"
        assert "recorded behaviour logprobs" in info.value.message
