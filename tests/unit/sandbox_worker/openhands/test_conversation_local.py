"""run_agent with a real OpenHands LocalConversation against a scripted OpenAI server.

The server (:mod:`tests.support.fake_llm`) stands in for the adapter so that every end
reason can be provoked: finish, plain reply, step limit, wall time, cancel, endpoint down,
5xx, an over-long prompt and other 4xx. The tools really run in a temporary directory.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from sandbox_worker.openhands.config import CondenserConfig, OpenHandsConfig
from sandbox_worker.openhands.conversation import LocalTarget, RemoteTarget, run_agent
from sandbox_worker.openhands.result import EndReason
from services.protocol.tasks import AgentLimits, SamplingConfig
from services.protocol.trajectory import OutcomeStatus
from tests.support.fake_llm import FakeLLM, Reply, call
from tests.support.paths import TEST_DATA

pytestmark = pytest.mark.slow  # real OpenHands conversations against a scripted LLM server

SAMPLES = TEST_DATA / "openhands_requests"
CFG = OpenHandsConfig(num_retries=0, stop_grace_s=5)
SAMPLING = SamplingConfig(temperature=0.7, top_p=0.9, top_k=20, max_tokens=99)
FINISH = Reply(tool_calls=[call("finish", {"message": "done"})])


def limits(max_steps: int = 10, wall_time_s: float = 120.0) -> AgentLimits:
    return AgentLimits(max_steps=max_steps, wall_time_s=wall_time_s)


def run(llm_url: str, workspace: Path, **kw: object) -> object:
    return run_agent(
        LocalTarget(workspace),
        llm_url,
        str(kw.pop("prompt", "Do the task.")),
        kw.pop("limits", limits()),  # type: ignore[arg-type]
        SAMPLING,
        config=CFG,
        **kw,  # type: ignore[arg-type]
    )


def test_finished_run_executes_tools_and_sends_the_task_sampling(tmp_path: Path) -> None:
    replies = [
        Reply(
            content="Writing the file.",
            tool_calls=[call("terminal", {"command": "printf 'hi\\n' > a.txt && cat a.txt"})],
        ),
        Reply(tool_calls=[call("file_editor", {"command": "view", "path": str(tmp_path)})]),
        FINISH,
    ]
    with FakeLLM(replies) as llm:
        result = run(llm.url("traj-7"), tmp_path, prompt="Please write a.txt")
    assert result.end_reason is EndReason.FINISHED, result
    assert result.outcome_status is OutcomeStatus.COMPLETED
    assert result.n_steps == 3
    assert result.summary.tools_called == ("terminal", "file_editor", "finish")
    assert (tmp_path / "a.txt").read_text() == "hi\n"

    assert len(llm.requests) == 3
    assert {r.path for r in llm.requests} == {"/t/traj-7/v1/chat/completions"}
    first = llm.requests[0].body
    assert first["temperature"] == 0.7 and first["top_p"] == 0.9 and first["top_k"] == 20
    assert first["max_completion_tokens"] == 99
    assert first["model"] == "swerl-policy"
    assert "reasoning_effort" not in first
    assert [t["function"]["name"] for t in first["tools"]] == [
        "terminal",
        "file_editor",
        "finish",
        "think",
    ]
    assert first["messages"][1]["content"][0]["text"] == "Please write a.txt"
    # The terminal's observation is clean text (no bracketed-paste escape codes).
    tool_message = llm.requests[1].body["messages"][3]
    assert tool_message["role"] == "tool" and tool_message["name"] == "terminal"
    text = tool_message["content"][0]["text"]
    assert "hi" in text and "\x1b" not in text


def test_captured_request_samples_still_describe_the_sdk(tmp_path: Path) -> None:
    """tests/data/openhands_requests documents what the SDK sends; fail when it drifts."""
    sample = json.loads((SAMPLES / "basic_00.json").read_text())["request"]["body"]
    with FakeLLM([FINISH]) as llm:
        run(llm.url(), tmp_path)
    body = llm.requests[0].body
    assert set(body) == set(sample)
    assert [m["role"] for m in body["messages"]] == [m["role"] for m in sample["messages"]]
    # Tool schemas must match; descriptions mention the workspace path, so they differ.
    assert [t["function"]["parameters"] for t in body["tools"]] == [
        t["function"]["parameters"] for t in sample["tools"]
    ]


def test_plain_reply_ends_the_run_as_agent_message(tmp_path: Path) -> None:
    with FakeLLM([Reply(content="I think it is fine.")]) as llm:
        result = run(llm.url(), tmp_path)
    assert result.end_reason is EndReason.AGENT_MESSAGE
    assert result.outcome_status is OutcomeStatus.COMPLETED
    assert result.n_steps == 1
    assert result.summary.last_agent_message == "I think it is fine."


def test_invalid_tool_call_is_reported_to_the_agent_not_fatal(tmp_path: Path) -> None:
    replies = [Reply(tool_calls=[call("terminal", {"comand": "ls"})]), FINISH]
    with FakeLLM(replies) as llm:
        result = run(llm.url(), tmp_path)
    assert result.end_reason is EndReason.FINISHED
    assert result.summary.n_agent_errors == 1
    error_message = llm.requests[1].body["messages"][-1]
    assert error_message["role"] == "tool" and "command" in error_message["content"][0]["text"]


def test_step_limit(tmp_path: Path) -> None:
    with FakeLLM([Reply(tool_calls=[call("terminal", {"command": "echo step"})])]) as llm:
        result = run(llm.url(), tmp_path, limits=limits(max_steps=2))
    assert result.end_reason is EndReason.MAX_STEPS
    assert result.outcome_status is OutcomeStatus.TIMEOUT
    assert result.n_steps == 2 and len(llm.requests) == 2


def test_wall_time_limit_pauses_between_steps(tmp_path: Path) -> None:
    slow = Reply(tool_calls=[call("terminal", {"command": "sleep 1.5"})])
    with FakeLLM([slow]) as llm:
        t0 = time.monotonic()
        result = run(llm.url(), tmp_path, limits=limits(max_steps=50, wall_time_s=2.0))
        elapsed = time.monotonic() - t0
    assert result.end_reason is EndReason.TIMEOUT
    assert result.outcome_status is OutcomeStatus.TIMEOUT
    assert 1 <= result.n_steps <= 3
    assert elapsed < 20, elapsed


def test_cancel_stops_a_running_conversation(tmp_path: Path) -> None:
    cancel = threading.Event()
    timer = threading.Timer(2.0, cancel.set)
    with FakeLLM([Reply(tool_calls=[call("terminal", {"command": "sleep 1"})])]) as llm:
        timer.start()
        try:
            result = run(llm.url(), tmp_path, limits=limits(max_steps=100), cancel=cancel)
        finally:
            timer.cancel()
    assert result.end_reason is EndReason.CANCELLED
    assert result.is_infrastructure
    assert result.n_steps < 10


def test_cancelled_before_start_makes_no_call(tmp_path: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    with FakeLLM([FINISH]) as llm:
        result = run(llm.url(), tmp_path, cancel=cancel)
    assert result.end_reason is EndReason.CANCELLED
    assert result.n_steps == 0 and llm.requests == []


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_llm_endpoint_is_infrastructure(tmp_path: Path) -> None:
    result = run(f"http://127.0.0.1:{closed_port()}/t/x/v1", tmp_path)
    assert result.end_reason is EndReason.LLM_UNAVAILABLE
    assert result.is_infrastructure
    assert result.outcome_status is OutcomeStatus.ABORTED
    assert result.error


@pytest.mark.parametrize(
    ("reply", "end_reason"),
    [
        (
            Reply(
                status=503, error_message="all engines are down", error_code="engine_unavailable"
            ),
            EndReason.LLM_UNAVAILABLE,
        ),
        (
            Reply(status=400, error_message="n > 1 is not supported", error_code="invalid_request"),
            EndReason.LLM_REJECTED,
        ),
    ],
    ids=["engine_down_503", "other_client_error"],
)
def test_engine_error_reply_is_infrastructure(
    reply: Reply, end_reason: EndReason, tmp_path: Path
) -> None:
    with FakeLLM([reply]) as llm:
        result = run(llm.url(), tmp_path)
    assert result.end_reason is end_reason
    assert result.is_infrastructure


def test_over_long_prompt_is_a_context_limit(tmp_path: Path) -> None:
    too_long = Reply(
        status=400,
        error_message="the prompt is 40000 tokens but the model's context window is 32768 "
        "tokens; shorten the conversation",
        error_code="context_length_exceeded",
    )
    with FakeLLM([Reply(tool_calls=[call("terminal", {"command": "echo 1"})]), too_long]) as llm:
        result = run(llm.url(), tmp_path)
    assert result.end_reason is EndReason.CONTEXT_LIMIT
    assert result.outcome_status is OutcomeStatus.TIMEOUT
    assert result.n_steps == 1


def test_bad_arguments_raise(tmp_path: Path) -> None:
    url = "http://127.0.0.1:1/t/x/v1"
    with pytest.raises(ValueError, match="task_prompt"):
        run_agent(LocalTarget(tmp_path), url, "  ", limits(), SAMPLING)
    with pytest.raises(ValueError, match="not a directory"):
        run_agent(LocalTarget(tmp_path / "missing"), url, "x", limits(), SAMPLING)
    with pytest.raises(ValueError, match="/v1"):
        run_agent(LocalTarget(tmp_path), "http://127.0.0.1:1/t/x", "x", limits(), SAMPLING)
    with pytest.raises(ValueError, match="http"):
        run_agent(LocalTarget(tmp_path), "127.0.0.1:1/v1", "x", limits(), SAMPLING)
    with pytest.raises(TypeError, match="AgentLimits"):
        run_agent(LocalTarget(tmp_path), url, "x", {"max_steps": 3}, SAMPLING)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="LocalTarget or RemoteTarget"):
        run_agent(str(tmp_path), url, "x", limits(), SAMPLING)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="server_url"):
        run_agent(RemoteTarget("localhost:8000"), url, "x", limits(), SAMPLING)
    # a credential given to a remote agent would be sent into the sandbox
    with pytest.raises(ValueError, match="local runs only"):
        run_agent(
            RemoteTarget("http://127.0.0.1:1"), url, "x", limits(), SAMPLING, llm_api_key="swt_x"
        )


def test_local_run_sends_the_trajectory_token_as_its_bearer(tmp_path: Path) -> None:
    with FakeLLM([FINISH]) as llm:
        result = run(llm.url("traj-8"), tmp_path, llm_api_key="swt_local-token")
    assert result.end_reason is EndReason.FINISHED, result
    assert [r.authorization for r in llm.requests] == ["Bearer swt_local-token"]


def test_unreachable_agent_server_is_infrastructure(tmp_path: Path) -> None:
    with FakeLLM([FINISH]) as llm:
        result = run_agent(
            RemoteTarget(f"http://127.0.0.1:{closed_port()}"),
            llm.url(),
            "x",
            limits(),
            SAMPLING,
            config=CFG,
        )
    assert result.end_reason is EndReason.AGENT_SERVER_ERROR
    assert result.is_infrastructure
    assert llm.requests == []


def test_condenser_summarises_through_the_trajectory_url(tmp_path: Path) -> None:
    """Condensation (off by default) rewrites history; its summary call is a policy call."""
    step = Reply(tool_calls=[call("terminal", {"command": "echo working"})])
    cfg = OpenHandsConfig(
        num_retries=0, condenser=CondenserConfig(enabled=True, max_size=8, keep_first=1)
    )
    summary = "SUMMARY: echoed several times."

    def finish_once_condensed(body: dict[str, object]) -> Reply | None:
        return FINISH if summary in json.dumps(body["messages"]) else None

    with FakeLLM([step], summary=summary, choose=finish_once_condensed) as llm:
        result = run_agent(
            LocalTarget(tmp_path),
            llm.url("traj-c"),
            "Echo a lot.",
            limits(20),
            SAMPLING,
            config=cfg,
        )
    assert result.end_reason is EndReason.FINISHED, result
    assert result.summary.n_condensations >= 1
    summary_calls = [r for r in llm.requests if not r.body.get("tools")]
    assert summary_calls and {r.path for r in llm.requests} == {"/t/traj-c/v1/chat/completions"}
    # After condensation the agent's prompt carries the summary instead of the old turns.
    later = [r.body for r in llm.requests if r.body.get("tools")][-1]
    assert summary in json.dumps(later["messages"])


def test_a_step_that_ignores_the_pause_is_forced_to_end(tmp_path: Path) -> None:
    """A tool call longer than the wall time: pause cannot act, closing the tools ends it."""
    stuck = Reply(tool_calls=[call("terminal", {"command": "sleep 60", "timeout": 120})])
    cfg = OpenHandsConfig(num_retries=0, stop_grace_s=2)
    with FakeLLM([stuck]) as llm:
        t0 = time.monotonic()
        result = run_agent(
            LocalTarget(tmp_path), llm.url(), "x", limits(10, wall_time_s=1.0), SAMPLING, config=cfg
        )
        elapsed = time.monotonic() - t0
    assert result.end_reason is EndReason.TIMEOUT
    assert elapsed < 30, elapsed
