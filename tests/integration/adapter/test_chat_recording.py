"""Chat completions through the adapter with token-exact recording (real engines, real Redis)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from services.protocol import TrajectoryMeta, TrajectoryRecord
from services.protocol.raw_frames import decode_frames
from services.store import load_trajectory
from tests.integration.adapter.conftest import (
    BASH_TOOL,
    MALFORMED_CALL,
    AdapterFactory,
    EnginePool,
)

pytestmark = pytest.mark.engines("a", "scripted")


def segment_tokens(segment: dict[str, Any]) -> list[int]:
    ids = list(segment["prompt_ids"])
    for turn in segment["turns"]:
        ids += turn["observation_ids"] + turn["output_ids"]
    return ids


def test_tool_call_conversation_is_parsed_and_recorded_token_exactly(
    adapter: AdapterFactory, engines: EnginePool, model_dir: Path, redis_url: str
) -> None:
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    with adapter([engines.scripted.url]) as a:
        meta = {"trajectory_id": "tools-json", "task_id": "task-1", "group_id": "g1"}
        opened = a.http.post(f"{a.url}/trajectories", json=meta)
        assert opened.status_code == 201
        assert opened.json()["base_url"] == "/t/tools-json/v1"
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a careful engineer."},
            {"role": "user", "content": "TASK-JSON: look at the files."},
        ]
        answers = []
        for step in range(3):
            response = a.chat(
                "tools-json",
                {"model": "tiny", "messages": messages, "tools": [BASH_TOOL], "max_tokens": 64},
            )
            assert response.status_code == 200, response.text
            choice = response.json()["choices"][0]
            answers.append(choice)
            messages.append(choice["message"])
            for call in choice["message"].get("tool_calls") or []:
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call["id"],
                        "name": "bash",
                        "content": f"output of step {step}",
                    }
                )
        first, second, last = answers
        assert first["finish_reason"] == "tool_calls"
        assert first["message"]["content"] is None
        call = first["message"]["tool_calls"][0]
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] == "bash"
        assert json.loads(call["function"]["arguments"]) == {"command": "ls"}
        assert second["message"]["content"] == "Reading it."
        assert json.loads(second["message"]["tool_calls"][0]["function"]["arguments"]) == {
            "command": "cat a.py"
        }
        assert last["finish_reason"] == "stop"
        assert last["message"] == {"role": "assistant", "content": "All done."}

        record = a.record("tools-json")
        assert record["meta"]["task_id"] == "task-1"
        assert [s["reason"] for s in record["segments"]] == ["initial"]
        segment = record["segments"][0]
        assert len(segment["turns"]) == 3
        # The scripted outputs are exactly what the template renders for the returned messages,
        # so the recorded segment decodes to the template rendering of the whole conversation.
        rendered = tok.apply_chat_template(messages, tools=[BASH_TOOL], tokenize=False)
        assert tok.decode(segment_tokens(segment)) + "\n" == rendered
        eos = tok.convert_tokens_to_ids("<|im_end|>")
        assert all(t["output_ids"][-1] == eos for t in segment["turns"])
        # the scripted engine's answers are flagged (the trainer keeps them out of the loss)
        assert [t["scripted"] for t in segment["turns"]] == [True, True, True]
        assert record["counters"]["turns"] == 3
        assert record["counters"]["segments"] == 1

        closed = a.http.post(
            f"{a.url}/trajectories/tools-json/close",
            json={"outcome": {"status": "completed", "reward": 1.0, "n_turns": 3}},
        )
        assert closed.status_code == 200, closed.text
        assert closed.json()["outcome"]["reward"] == 1.0
        raw = a.http.get(f"{a.url}/trajectories/tools-json/raw")
        assert raw.headers["content-type"] == "application/octet-stream"
        entries = decode_frames(raw.content, expected_count=raw.headers["x-swerl-entries"])
        assert len(entries) == 4
        rebuilt = TrajectoryRecord.from_entries(TrajectoryMeta(trajectory_id="tools-json"), entries)
        assert rebuilt.segments[0].token_ids() == segment_tokens(segment)
    # Other services read the same record synchronously.
    loaded = load_trajectory(redis.Redis.from_url(redis_url), "tools-json")
    assert loaded.outcome is not None and loaded.outcome.reward == 1.0
    assert all(t.scripted for t in loaded.segments[0].turns)
    flat = loaded.segments[0].flatten()
    generated = sum(len(t["output_ids"]) for t in segment["turns"])
    assert sum(flat["action_mask"]) == generated


def test_qwen3_coder_tool_calls(
    adapter: AdapterFactory, engines: EnginePool, coder_model_dir: Path
) -> None:
    tok = AutoTokenizer.from_pretrained(str(coder_model_dir))
    with adapter([engines.scripted.url], model=str(coder_model_dir)) as a:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "TASK-CODER: list files"}]
        first = a.chat("coder", {"messages": messages, "tools": [BASH_TOOL], "max_tokens": 64})
        assert first.status_code == 200, first.text
        message = first.json()["choices"][0]["message"]
        args = json.loads(message["tool_calls"][0]["function"]["arguments"])
        assert args == {"command": "ls", "timeout": 30}  # integer per the tool's schema
        messages += [
            message,
            {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "a.py"},
        ]
        second = a.chat("coder", {"messages": messages, "tools": [BASH_TOOL], "max_tokens": 64})
        assert second.json()["choices"][0]["message"]["content"] == "Done."
        record = a.record("coder")
        assert len(record["segments"]) == 1
        messages.append(second.json()["choices"][0]["message"])
        rendered = tok.apply_chat_template(
            [
                {**m, "tool_calls": [{"function": {"name": "bash", "arguments": args}}]}
                if m.get("tool_calls")
                else m
                for m in messages
            ],
            tools=[BASH_TOOL],
            tokenize=False,
        )
        assert tok.decode(segment_tokens(record["segments"][0])) + "\n" == rendered


def test_malformed_tool_call_is_plain_content_and_recorded(
    adapter: AdapterFactory, engines: EnginePool, model_dir: Path
) -> None:
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    with adapter([engines.scripted.url]) as a:
        body = {
            "messages": [{"role": "user", "content": "TASK-MALFORMED"}],
            "tools": [BASH_TOOL],
            "max_tokens": 64,
        }
        response = a.chat("malformed", body)
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert choice["message"] == {"role": "assistant", "content": MALFORMED_CALL}
        turn = a.record("malformed")["segments"][0]["turns"][0]
        assert tok.decode(turn["output_ids"]) == MALFORMED_CALL + "<|im_end|>"
        assert len(turn["output_logprobs"]) == len(turn["output_ids"])


def test_recorded_outputs_are_the_engines_and_observations_are_appended(
    adapter: AdapterFactory, engines: EnginePool, model_dir: Path
) -> None:
    """Greedy decoding: replaying each recorded input directly on the engine gives the recorded
    output; observation tokens are exactly the new messages in the chat format."""
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    with adapter([engines.a.url]) as a:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in a.py"}]
        for step in range(3):
            response = a.chat("exact", {"messages": messages, "max_tokens": 12, "temperature": 0.0})
            assert response.status_code == 200, response.text
            messages += [
                response.json()["choices"][0]["message"],
                {"role": "user", "content": f"observation {step}"},
            ]
        record = a.record("exact")
    assert len(record["segments"]) == 1
    segment = record["segments"][0]
    assert not any(t["scripted"] for t in segment["turns"])  # a sampling engine's turns
    prompt = tok.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False)
    assert segment["prompt_ids"] == tok(prompt, add_special_tokens=False)["input_ids"]
    context = list(segment["prompt_ids"])
    previous_finish = None
    for step, turn in enumerate(segment["turns"]):
        if step:
            closing = "" if previous_finish == "stop" else "<|im_end|>"
            text = (
                f"{closing}\n<|im_start|>user\nobservation {step - 1}<|im_end|>\n"
                "<|im_start|>assistant\n"
            )
            assert turn["observation_ids"] == tok(text, add_special_tokens=False)["input_ids"]
        context += turn["observation_ids"]
        direct = httpx.post(
            f"{engines.a.url}/generate",
            json={
                "input_ids": context,
                "sampling_params": {"max_new_tokens": 12, "temperature": 0.0},
                "return_logprob": True,
            },
            timeout=60,
        ).json()
        assert [e[1] for e in direct["meta_info"]["output_token_logprobs"]] == turn["output_ids"]
        context += turn["output_ids"]
        previous_finish = turn["finish_reason"]
    assert context == segment_tokens(segment)


def test_rewritten_history_opens_a_counted_segment(
    adapter: AdapterFactory, engines: EnginePool
) -> None:
    with adapter([engines.a.url]) as a:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
        for step in range(2):
            r = a.chat("rewrite", {"messages": messages, "max_tokens": 6})
            assert r.headers["x-swerl-segment"] == "0"
            messages += [r.json()["choices"][0]["message"], {"role": "user", "content": f"o{step}"}]
        before = a.record("rewrite")["segments"][0]
        rewritten = [dict(m) for m in messages]
        rewritten[1] = {"role": "assistant", "content": "a condensed summary"}
        r = a.chat("rewrite", {"messages": rewritten, "max_tokens": 6})
        assert r.status_code == 200 and r.headers["x-swerl-segment"] == "1"
        rewritten += [r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
        r = a.chat("rewrite", {"messages": rewritten, "max_tokens": 6})
        assert r.headers["x-swerl-segment"] == "1"
        record = a.record("rewrite")
        assert [s["reason"] for s in record["segments"]] == ["initial", "history_mismatch"]
        assert record["segments"][0] == before  # the old segment is untouched
        assert [len(s["turns"]) for s in record["segments"]] == [2, 2]
        assert record["counters"]["history_mismatch"] == 1
        assert record["counters"]["segments"] == 2
        metrics = _samples(a.http.get(f"{a.url}/metrics").text)
        assert (
            metrics[("swerl_adapter_segments_opened_total", (("reason", "history_mismatch"),))] == 1
        )


def _sse(response: httpx.Response) -> list[Any]:
    events = []
    for line in response.text.split("\n\n"):
        if not line.strip():
            continue
        assert line.startswith("data: ")
        payload = line[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_streaming_answers_with_openai_chunks(adapter: AdapterFactory, engines: EnginePool) -> None:
    with adapter([engines.scripted.url]) as a:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "TASK-STREAM"}]
        body = {
            "messages": messages,
            "tools": [BASH_TOOL],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 64,
        }
        response = a.chat("stream", body)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _sse(response)
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert len({c["id"] for c in chunks}) == 1
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert deltas[0]["role"] == "assistant"
        assert "".join(d.get("content") or "" for d in deltas) == "Reading it."
        calls = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
        assert calls[0]["function"]["name"] == "bash"
        args = "".join(c["function"].get("arguments", "") for c in calls)
        assert json.loads(args) == {"command": "cat a.py"}
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert finishes[-1] == "tool_calls" and set(finishes[:-1]) == {None}
        usage = chunks[-1]["usage"]
        assert usage["completion_tokens"] > 0 and usage["prompt_tokens"] > 0
        # The client rebuilds the assistant message from the stream and continues.
        messages += [
            {
                "role": "assistant",
                "content": "Reading it.",
                "tool_calls": [
                    {
                        "id": calls[0]["id"],
                        "type": "function",
                        "function": {"name": "bash", "arguments": args},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "print(1)"},
        ]
        second = _sse(a.chat("stream", {**body, "messages": messages, "stream_options": None}))
        text = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in second[:-1] if c["choices"]
        )
        assert text == "Final answer."
        record = a.record("stream")
        assert [len(s["turns"]) for s in record["segments"]] == [2]


def test_untracked_calls_models_health_and_metrics(
    adapter: AdapterFactory, engines: EnginePool, redis_url: str
) -> None:
    with adapter([engines.a.url], served_model_name="tiny-policy") as a:
        r = a.chat(None, {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "chat.completion"
        assert body["model"] == "tiny-policy"
        assert 1 <= body["usage"]["completion_tokens"] <= 4
        assert body["usage"]["total_tokens"] == (
            body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
        )
        assert redis.Redis.from_url(redis_url).keys("swerl:*") == []  # nothing recorded
        for path in ("/v1/models", "/t/any-id/v1/models"):
            models = a.http.get(a.url + path).json()
            assert [m["id"] for m in models["data"]] == ["tiny-policy"]
        health = a.http.get(f"{a.url}/health")
        assert health.status_code == 200
        assert health.json()["engines"] == {engines.a.url: True}
        metrics = a.http.get(f"{a.url}/metrics")
        assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
        samples = _samples(metrics.text)
        ok = (("route", "untracked"), ("status", "ok"))
        generated = body["usage"]["completion_tokens"]
        assert samples[("swerl_adapter_requests_total", ok)] == 1
        assert samples[("swerl_adapter_engine_healthy", (("engine", engines.a.url),))] == 1
        assert samples[("swerl_adapter_request_seconds_count", (("route", "untracked"),))] == 1
        assert samples[("swerl_adapter_generated_tokens_total", ())] == generated
        r = a.chat(None, {"messages": [{"role": "user", "content": "again"}], "max_tokens": 2})
        assert r.status_code == 200, r.text
        again = _samples(a.http.get(f"{a.url}/metrics").text)
        assert again[("swerl_adapter_requests_total", ok)] == 2


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition, parsed by prometheus_client's own parser."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_trajectory_lifecycle_routes(adapter: AdapterFactory, engines: EnginePool) -> None:
    with adapter([engines.a.url], auto_open_trajectories=False) as a:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        unknown = a.chat("never-opened", body)
        assert unknown.status_code == 404
        assert "POST /trajectories" in unknown.json()["error"]["message"]
        assert (
            a.http.post(f"{a.url}/trajectories", json={"trajectory_id": "life"}).status_code == 201
        )
        again = a.http.post(f"{a.url}/trajectories", json={"trajectory_id": "life"})
        assert again.status_code == 409
        assert a.chat("life", body).status_code == 200
        closed = a.http.post(f"{a.url}/trajectories/life/close")
        assert closed.status_code == 200
        assert closed.json()["counters"]["turns"] == 1
        after = a.chat("life", body)
        assert after.status_code == 409
        assert after.json()["error"]["code"] == "trajectory_closed"
        assert a.record("life")["status"] == "closed"
        assert a.http.get(f"{a.url}/trajectories/nope").status_code == 404


def test_idle_trajectory_state_is_dropped_and_counted(
    adapter: AdapterFactory, engines: EnginePool
) -> None:
    with adapter([engines.a.url], trajectory_idle_ttl_s=0.2) as a:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
        r = a.chat("idle", {"messages": messages, "max_tokens": 4})
        messages += [r.json()["choices"][0]["message"], {"role": "user", "content": "again"}]
        deadline = time.monotonic() + 10
        while a.call(lambda: "idle" in a.service.trajectories):
            assert time.monotonic() < deadline, "idle state was never dropped"
            time.sleep(0.05)
        r = a.chat("idle", {"messages": messages, "max_tokens": 4})
        assert r.status_code == 200 and r.headers["x-swerl-segment"] == "1"
        record = a.record("idle")
        assert [s["reason"] for s in record["segments"]] == ["initial", "history_mismatch"]
        assert record["counters"]["history_mismatch"] == 1
