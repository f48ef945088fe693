"""The official ``openai`` client against the adapter: every request field honoured or refused.

Nothing a client sends is silently ignored: each field below either changes the answer as
OpenAI documents it, or the request fails with a 400 whose ``param`` names the field.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.integration.adapter.conftest import (
    BASH_TOOL,
    AdapterFactory,
    EnginePool,
    RunningAdapter,
)

pytestmark = pytest.mark.engines("a", "scripted")

USER = [{"role": "user", "content": "Say something."}]


def client(a: RunningAdapter, trajectory_id: str | None = None) -> openai.OpenAI:
    base = a.t(trajectory_id) if trajectory_id else f"{a.url}/v1"
    return openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)


def refused(call: Any, param: str) -> str:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    error = info.value.body
    assert isinstance(error, dict), error
    assert error["param"] == param, error
    assert param in error["message"]
    return str(error["message"])


def test_plain_and_streamed_completions_with_usage(
    adapter: AdapterFactory, engines: EnginePool
) -> None:
    with adapter([engines.a.url]) as a:
        c = client(a, "oc-plain")
        answer = c.chat.completions.create(model="m", messages=USER, max_tokens=5)
        choice = answer.choices[0]
        assert isinstance(choice.message.content, str) and choice.logprobs is None
        assert answer.usage is not None and 1 <= answer.usage.completion_tokens <= 5
        assert choice.finish_reason in ("stop", "length")

        chunks = list(
            c.chat.completions.create(
                model="m",
                messages=USER,
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens >= 1
        assert chunks[-2].choices[0].finish_reason in ("stop", "length")


def test_tool_calls_are_parsed(adapter: AdapterFactory, engines: EnginePool) -> None:
    with adapter([engines.scripted.url]) as a:
        answer = client(a, "oc-tools").chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "TASK-JSON: list the files"}],
            tools=[BASH_TOOL],  # type: ignore[list-item]
            max_tokens=64,
        )
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls"
        call = choice.message.tool_calls[0]  # type: ignore[index]
        assert call.function.name == "bash"  # type: ignore[union-attr]
        assert json.loads(call.function.arguments) == {"command": "ls"}  # type: ignore[union-attr]


def test_logprobs_are_the_recorded_behaviour_logprobs(
    adapter: AdapterFactory, engines: EnginePool
) -> None:
    with adapter([engines.a.url]) as a:
        answer = client(a, "oc-logprobs").chat.completions.create(
            model="m", messages=USER, max_tokens=6, logprobs=True
        )
        content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
        assert content is not None and all(item.top_logprobs == [] for item in content)
        turn = a.record("oc-logprobs")["segments"][0]["turns"][0]
        assert [item.logprob for item in content] == pytest.approx(
            turn["output_logprobs"], abs=1e-5
        )
        assert len(content) == len(turn["output_ids"])
        assert all(bytes(item.bytes or []).decode("utf-8") == item.token for item in content)


def test_top_logprobs_come_from_the_engine(adapter: AdapterFactory, engines: EnginePool) -> None:
    with adapter([engines.a.url]) as a:
        answer = client(a, "oc-top").chat.completions.create(
            model="m", messages=USER, max_tokens=6, logprobs=True, top_logprobs=3, temperature=0
        )
        content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
        assert content
        for item in content:
            top = item.top_logprobs
            assert len(top) == 3
            assert [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
            # Greedy: the chosen token is the most likely one, with the same logprob.
            assert top[0].token == item.token
            assert top[0].logprob == pytest.approx(item.logprob, abs=1e-5)

        streamed = client(a).chat.completions.create(
            model="m",
            messages=USER,
            max_tokens=6,
            logprobs=True,
            top_logprobs=2,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        items = []
        usage = None
        for chunk in streamed:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                if choice.logprobs and choice.logprobs.content:
                    items.extend(choice.logprobs.content)
        assert usage is not None and len(items) == usage.completion_tokens
        assert all(len(item.top_logprobs) == 2 for item in items)
        # Same prompt, greedy: the same tokens as the non-streamed answer.
        assert [i.token for i in items] == [i.token for i in content]


def test_seed_is_honoured(adapter: AdapterFactory, engines: EnginePool) -> None:
    with adapter([engines.a.url]) as a:
        c = client(a)
        runs = [
            c.chat.completions.create(
                model="m", messages=USER, max_tokens=8, temperature=1.0, seed=1234, logprobs=True
            )
            for _ in range(2)
        ]
        tokens = [[t.token for t in r.choices[0].logprobs.content] for r in runs]  # type: ignore[union-attr]
        assert tokens[0] == tokens[1]


def test_response_format_reaches_the_engine_untracked_and_is_refused_on_trajectories(
    adapter: AdapterFactory, engines: EnginePool
) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    formats: list[dict[str, Any]] = [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    ]
    with adapter([engines.a.url]) as a:
        for fmt in formats:
            message = refused(
                lambda fmt=fmt: client(a, "oc-format").chat.completions.create(
                    model="m",
                    messages=USER,
                    max_tokens=4,
                    response_format=fmt,  # type: ignore[arg-type]
                ),
                "response_format",
            )
            assert "recorded behaviour logprobs" in message
            # Untracked: sent to the engine as SGLang's json_schema constraint. The reference
            # engine has no grammar backend and says so, naming the field it received.
            message = refused(
                lambda fmt=fmt: client(a).chat.completions.create(
                    model="m",
                    messages=USER,
                    max_tokens=4,
                    response_format=fmt,  # type: ignore[arg-type]
                ),
                "response_format",
            )
            assert "json_schema" in message
        plain = client(a, "oc-format").chat.completions.create(
            model="m", messages=USER, max_tokens=2, response_format={"type": "text"}
        )
        assert plain.choices[0].message.content is not None
        assert len(a.record("oc-format")["segments"][0]["turns"]) == 1


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"n": 2}, "n"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs=True
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"logit_bias": {"10": 5}}, "logit_bias"),
        ({"parallel_tool_calls": False, "tools": [BASH_TOOL]}, "parallel_tool_calls"),
        ({"store": True}, "store"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"verbosity": "high"}, "verbosity"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"extra_body": {"top_k": "5"}}, "top_k"),
        ({"tool_choice": "required", "tools": [BASH_TOOL]}, "tool_choice"),
    ],
)
def test_fields_not_honoured_are_refused_by_name(
    adapter: AdapterFactory, engines: EnginePool, kwargs: dict[str, Any], param: str
) -> None:
    with adapter([engines.a.url]) as a:
        refused(
            lambda: client(a, "oc-refused").chat.completions.create(
                model="m", messages=USER, max_tokens=2, **kwargs
            ),
            param,
        )
        # Nothing was recorded by the refused request.
        assert a.http.get(f"{a.url}/trajectories/oc-refused").status_code == 404


def test_metadata_fields_are_accepted(adapter: AdapterFactory, engines: EnginePool) -> None:
    with adapter([engines.a.url]) as a:
        answer = client(a, "oc-meta").chat.completions.create(
            model="m",
            messages=USER,
            max_completion_tokens=3,
            user="agent-1",
            metadata={"run": "7"},
            prompt_cache_key="conv-1",
            safety_identifier="s-1",
            service_tier="auto",
            store=False,
            parallel_tool_calls=True,
            tools=[BASH_TOOL],  # type: ignore[list-item]
            extra_body={"top_k": 20},
        )
        assert answer.usage is not None and answer.usage.completion_tokens <= 3
