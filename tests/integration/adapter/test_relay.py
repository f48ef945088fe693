"""The adapter in relay mode (``python -m adapter --upstream-url ...``) in front of a scripted
OpenAI chat-completions server (``tests.support.fake_llm``, the arbitrary endpoint): the
per-trajectory routes and tokens as in training, the upstream's key and address never handed
out, each turn recorded as text (the new messages only), an upstream failure recorded as an
infrastructure failure, and the record refused by the trainer."""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from services.processes import ManagedProcess, free_port, launch
from services.store.trajectories import load_trajectory
from tests.support.fake_llm import FakeLLM, Reply, call
from tests.support.paths import REPO_ROOT
from trainer.data import RecordError, check_record

WORKER = secrets.token_hex(16)
ADMIN = secrets.token_hex(16)
KEY = "sk-upstream-" + secrets.token_hex(8)
TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]


def replies(body: dict[str, Any]) -> Reply | None:
    text = json.dumps(body["messages"])
    if "FAIL-500" in text:
        return Reply(status=500, error_message="upstream overloaded")
    if "FAIL-400" in text:
        return Reply(status=400, error_message="context too long for gpt-x")
    return None


@pytest.fixture
def relay(redis_url: str, tmp_path: Path) -> Iterator[tuple[str, FakeLLM, ManagedProcess]]:
    with FakeLLM([Reply(tool_calls=[call("run", {"cmd": "ls"})]), Reply(content="done")],
                 choose=replies) as llm:  # fmt: skip
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "adapter", "--upstream-url",
                f"http://127.0.0.1:{llm.port}/v1", "--upstream-model", "gpt-x",
                "--upstream-key-env", "UPSTREAM_KEY", "--redis", redis_url, "--port", str(port),
                "--admin-token", ADMIN, "--log-level", "warning"]  # fmt: skip
        env = {"SWERL_ADAPTER__WORKER_TOKEN": WORKER, "UPSTREAM_KEY": KEY}
        proc = launch("relay adapter", argv, tmp_path / "adapter.log", ready=f"{url}/health",
                      timeout_s=300, env=env, cwd=REPO_ROOT, grace_s=20)  # fmt: skip
        try:
            yield url, llm, proc
        finally:
            proc.stop()


def open_trajectory(http: httpx.Client, tid: str) -> dict[str, str]:
    got = http.post("/trajectories", json={"trajectory_id": tid},
                    headers={"authorization": f"Bearer {WORKER}"})  # fmt: skip
    assert got.status_code == 201, got.text
    return {"authorization": f"Bearer {got.json()['token']}"}


def test_a_relayed_conversation_is_recorded_as_text_turns(
    relay: tuple[str, FakeLLM, ManagedProcess], redis_url: str
) -> None:
    url, llm, proc = relay
    with httpx.Client(base_url=url, timeout=60) as http:
        auth = open_trajectory(http, "relay-1")
        first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "fix it"}]
        got = http.post("/t/relay-1/v1/chat/completions", headers=auth,
                        json={"model": "anything", "messages": first, "tools": TOOLS,
                              "temperature": 0.5})  # fmt: skip
        assert got.status_code == 200, got.text
        answer = got.json()["choices"][0]
        assert answer["finish_reason"] == "tool_calls"
        tool_call = answer["message"]["tool_calls"][0]
        assert tool_call["function"]["name"] == "run"
        # the upstream got the agent's messages and tools, its own model name and the key
        sent = llm.requests[-1]
        assert sent.path == "/v1/chat/completions" and sent.authorization == f"Bearer {KEY}"
        assert sent.body["model"] == "gpt-x" and sent.body["stream"] is False
        assert sent.body["messages"] == first and sent.body["tools"] == TOOLS
        assert sent.body["temperature"] == 0.5
        second = [*first, answer["message"],
                  {"role": "tool", "tool_call_id": tool_call["id"], "content": "a.py"}]  # fmt: skip
        got = http.post("/t/relay-1/v1/chat/completions", headers=auth,
                        json={"messages": second, "tools": TOOLS, "stream": True})  # fmt: skip
        assert got.status_code == 200 and got.headers["content-type"].startswith(
            "text/event-stream"
        )
        events = [line[6:] for line in got.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert "done" in "".join(events[:-1])
        # a condensed history does not extend the recorded conversation: recorded whole
        condensed = [{"role": "user", "content": "summary: ls shows a.py; fix it"}]
        got = http.post("/t/relay-1/v1/chat/completions", headers=auth,
                        json={"messages": condensed, "tools": TOOLS})  # fmt: skip
        assert got.status_code == 200, got.text
        view = http.get("/trajectories/relay-1", headers={"authorization": f"Bearer {WORKER}"})
    assert view.status_code == 200, view.text
    turns = view.json()["text_turns"]
    assert view.json()["segments"] == [] and view.json()["n_turns"] == 3
    assert turns[2]["messages"] == condensed and turns[2]["history_reset"] is True
    assert view.json()["counters"]["history_resets"] == 1
    assert turns[0]["messages"] == first and turns[0]["history_reset"] is False
    # only what the first turn had not recorded: its request and its answer are there already
    assert turns[1]["messages"] == second[3:] and turns[1]["history_reset"] is False
    assert turns[1]["response"]["content"] == "done"
    assert turns[0]["model"] == "gpt-x" and turns[0]["usage"] == {
        "prompt_tokens": 1,
        "completion_tokens": 1,
    }
    # the record in Redis: text only, and the trainer refuses it
    client = redis.Redis.from_url(redis_url)
    record = load_trajectory(client, "relay-1")
    client.close()
    assert record.text_only and len(record.text_turns) == 3
    with pytest.raises(RecordError, match="text-only record of a relay-mode adapter"):
        check_record(record)
    assert KEY not in proc.log_tail()


def test_the_per_trajectory_boundary_holds_and_nothing_leaks(
    relay: tuple[str, FakeLLM, ManagedProcess],
) -> None:
    url, llm, _ = relay
    with httpx.Client(base_url=url, timeout=60) as http:
        auth = open_trajectory(http, "relay-2")
        other = open_trajectory(http, "relay-3")
        body = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
        calls = len(llm.requests)
        for headers in ({}, other, {"authorization": f"Bearer {KEY}"}):
            got = http.post("/t/relay-2/v1/chat/completions", headers=headers, json=body)
            assert got.status_code == 401, got.text
        # untracked completions are closed in training mode, as with engines
        assert http.post("/v1/chat/completions", json=body).status_code == 401
        assert len(llm.requests) == calls  # nothing reached the upstream
        refused = http.post("/t/relay-2/v1/chat/completions", headers=auth,
                            json={**body, "logprobs": True})  # fmt: skip
        assert refused.status_code == 400 and "relay mode records no logprobs" in refused.text
        ok = http.post("/t/relay-2/v1/chat/completions", headers=auth, json=body)
        assert ok.status_code == 200
        # no answer, header or view names the upstream or its key
        served = json.dumps([ok.json(), dict(ok.headers)])
        assert KEY not in served and str(llm.port) not in served
        admin = {"authorization": f"Bearer {ADMIN}"}
        weights = http.post("/admin/weights", headers=admin,
                            json={"model_path": "/x", "version": 1})  # fmt: skip
        assert weights.status_code == 409 and "relay mode" in weights.text
        models = http.get("/v1/models", headers=auth).json()["data"]
        assert [m["id"] for m in models] == ["gpt-x"]
        ready = http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["upstream"] == "ok", ready.text


def test_an_upstream_failure_is_an_infra_failure_and_a_refusal_is_the_agents(
    relay: tuple[str, FakeLLM, ManagedProcess], redis_url: str
) -> None:
    url, _, _ = relay
    with httpx.Client(base_url=url, timeout=60) as http:
        auth = open_trajectory(http, "relay-4")
        bad = {"messages": [{"role": "user", "content": "FAIL-400"}], "tools": TOOLS}
        got = http.post("/t/relay-4/v1/chat/completions", headers=auth, json=bad)
        assert got.status_code == 400 and "context too long for gpt-x" in got.text
        assert got.json()["error"]["code"] == "upstream_rejected"
        down = {"messages": [{"role": "user", "content": "FAIL-500"}], "tools": TOOLS}
        got = http.post("/t/relay-4/v1/chat/completions", headers=auth, json=down)
        assert got.status_code == 503 and got.json()["error"]["code"] == "upstream_unavailable"
    client = redis.Redis.from_url(redis_url)
    record = load_trajectory(client, "relay-4")
    client.close()
    assert record.counters.get("infra_failures", 0) == 1  # the rollout is aborted, never scored
    assert record.n_turns == 0  # neither failed request changed the record
