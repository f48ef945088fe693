"""The toy runner's agent loop against a scripted OpenAI server (tests/support/fake_llm.py, a
real HTTP server standing in for the adapter's per-trajectory route) and the record double."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sandbox_worker.adapter_client import AdapterUnavailableError
from sandbox_worker.config import ToyToolLatencyConfig
from sandbox_worker.progress import RunProgress
from sandbox_worker.runner import CancelToken
from sandbox_worker.toy import ChatEndpoint, ToyTrajectoryRunner
from sandbox_worker.toy.runner import latency_sigma, lookup_call, tool_latency_s
from services.processes import free_port
from services.protocol import AgentLimits, RolloutTask, SamplingConfig
from services.protocol.progress import ProgressPhase
from services.protocol.toy import CODES, SYSTEM_PROMPT, TOOL_NAME, draw_code
from services.protocol.trajectory import Outcome, OutcomeStatus
from tests.support.fake_llm import FakeLLM, Reply, call
from tests.unit.sandbox_worker.conftest import FakeAdapter, make_ctx

LOOKUP = call("lookup", {}, "call_1")


def toy_task(**kw: Any) -> RolloutTask:
    return RolloutTask(
        task_id=kw.pop("task_id", "b1:0:0"),
        batch_id="b1",
        group_id="b1:0",
        instance_id="toy-lookup-5",
        kind="toy",
        **kw,
    )


def observed_code(body: dict[str, Any]) -> str | None:
    """The code in the request's tool message, as the policy would see it."""
    tools = [m for m in body["messages"] if m["role"] == "tool"]
    return tools[-1]["content"].split("\n")[0] if tools else None


def copy_the_code(body: dict[str, Any]) -> Reply | None:
    code = observed_code(body)
    return Reply(content=code) if code else None


def wrong_code(body: dict[str, Any]) -> Reply | None:
    code = observed_code(body)
    return Reply(content=next(c for c in CODES if c != code)) if code else None


@pytest.fixture
def adapter() -> FakeAdapter:
    return FakeAdapter()


def play(llm: FakeLLM, adapter: FakeAdapter, task: RolloutTask, **ctx: Any) -> Outcome:
    runner = ToyTrajectoryRunner(adapter, ChatEndpoint(f"http://127.0.0.1:{llm.port}"))
    return runner.run(task, make_ctx(**ctx))


@pytest.fixture
def copier() -> Iterator[FakeLLM]:
    with FakeLLM([Reply(tool_calls=[LOOKUP])], choose=copy_the_code) as llm:
        yield llm


def test_a_correct_answer_earns_1_through_two_tool_turns(
    copier: FakeLLM, adapter: FakeAdapter
) -> None:
    task = toy_task(sampling=SamplingConfig(temperature=0.7, top_p=0.9, max_tokens=24))
    outcome = play(copier, adapter, task)
    assert outcome.status is OutcomeStatus.COMPLETED and outcome.reward == 1.0
    assert outcome.test_report["ending"] == "answered"
    first, second = copier.requests
    path = f"/t/{task.trajectory_id}/v1/chat/completions"
    assert first.path == second.path == path
    assert first.authorization == second.authorization == f"Bearer {adapter.token}"
    assert [m["role"] for m in first.body["messages"]] == ["system", "user"]
    assert first.body["messages"][0]["content"] == SYSTEM_PROMPT
    assert [t["function"]["name"] for t in first.body["tools"]] == ["lookup"]
    assert (first.body["temperature"], first.body["top_p"], first.body["max_tokens"]) == (
        0.7,
        0.9,
        24,
    )
    assert "top_k" not in first.body  # -1: engine default, not sent
    roles = [m["role"] for m in second.body["messages"]]
    assert roles == ["system", "user", "assistant", "tool"]
    assistant, tool = second.body["messages"][2:]
    assert assistant["tool_calls"] == [LOOKUP] and tool["tool_call_id"] == "call_1"
    code = tool["content"].split("\n")[0]
    assert tool["content"].split("\n") == [code] * 32 and code in CODES
    # The code is the task's reproducible draw; the record is opened and closed with the outcome.
    assert code == outcome.test_report["code"] == draw_code(task.task_id, task.attempt)
    [meta] = adapter.opened
    assert meta.trajectory_id == task.trajectory_id and meta.extra["kind"] == "toy"
    [(closed_id, closed)] = adapter.closes
    assert closed_id == task.trajectory_id and closed is not None and closed.reward == 1.0
    assert outcome.n_turns == adapter.counters["turns"]
    assert {"turn1", "turn2", "total"} <= set(outcome.durations)


def test_codes_differ_between_tasks_and_a_wrong_answer_earns_0(adapter: FakeAdapter) -> None:
    with FakeLLM([Reply(tool_calls=[LOOKUP])], choose=wrong_code) as llm:
        outcomes = [play(llm, adapter, toy_task(task_id=f"b1:0:{s}")) for s in range(12)]
        seen = {observed_code(r.body) for r in llm.requests if observed_code(r.body)}
    assert all(o.status is OutcomeStatus.COMPLETED and o.reward == 0.0 for o in outcomes)
    assert len(seen) > 1  # one draw per task, not one code for all


@pytest.mark.parametrize(
    "first",
    [
        Reply(content="red"),  # answers without looking up
        Reply(tool_calls=[call("search", {}, "c1")]),  # another tool
        Reply(tool_calls=[LOOKUP, call("lookup", {}, "c2")]),  # two calls
    ],
)
def test_a_malformed_first_turn_is_the_policys_fault_reward_0(
    first: Reply, adapter: FakeAdapter
) -> None:
    with FakeLLM([first, Reply(content="red")]) as llm:
        outcome = play(llm, adapter, toy_task())
        assert len(llm.requests) == 1  # no second turn
    assert outcome.status is OutcomeStatus.ERROR and outcome.reward == 0.0
    assert outcome.test_report["ending"] == "no_tool_call" and outcome.trainable


def test_a_tool_call_instead_of_an_answer_earns_0(adapter: FakeAdapter) -> None:
    with FakeLLM([Reply(tool_calls=[LOOKUP])]) as llm:  # calls lookup again and again
        outcome = play(llm, adapter, toy_task())
    assert outcome.status is OutcomeStatus.ERROR and outcome.reward == 0.0
    assert outcome.test_report["ending"] == "tool_call_as_answer"


def test_an_engine_failure_is_an_abort_never_a_0(adapter: FakeAdapter) -> None:
    replies = [Reply(tool_calls=[LOOKUP]), Reply(status=503, error_message="no engine")]
    with FakeLLM(replies) as llm:
        outcome = play(llm, adapter, toy_task())
    assert outcome.status is OutcomeStatus.ABORTED and outcome.reward is None
    assert outcome.abort_reason is not None and "503" in outcome.abort_reason
    assert outcome.retryable  # another attempt may find an engine
    [(_, closed)] = adapter.closes
    assert closed is not None and closed.status is OutcomeStatus.ABORTED


def test_an_unreachable_adapter_is_an_abort(adapter: FakeAdapter) -> None:
    runner = ToyTrajectoryRunner(adapter, ChatEndpoint(f"http://127.0.0.1:{free_port()}"))
    outcome = runner.run(toy_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED
    assert outcome.abort_reason is not None and "chat completion failed" in outcome.abort_reason


def test_a_refused_request_is_an_abort(adapter: FakeAdapter) -> None:
    refused = Reply(status=400, error_message="prompt exceeds the context", error_code="ctx")
    with FakeLLM([refused]) as llm:
        outcome = play(llm, adapter, toy_task())
    assert outcome.status is OutcomeStatus.ABORTED and "400" in (outcome.abort_reason or "")


class _NotJSON(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "8")
        self.end_headers()
        self.wfile.write(b"not json")

    def log_message(self, *args: object) -> None:
        pass


def test_an_unreadable_answer_is_an_abort(adapter: FakeAdapter) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotJSON)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = ChatEndpoint(f"http://127.0.0.1:{server.server_address[1]}")
        outcome = ToyTrajectoryRunner(adapter, endpoint).run(toy_task(), make_ctx())
    finally:
        server.shutdown()
        server.server_close()
    assert outcome.status is OutcomeStatus.ABORTED
    assert "unreadable chat completion" in (outcome.abort_reason or "")


def test_a_cancelled_task_stops_before_calling_the_model(
    copier: FakeLLM, adapter: FakeAdapter
) -> None:
    cancel = CancelToken()
    cancel.cancel("cancelled")
    outcome = play(copier, adapter, toy_task(), cancel=cancel)
    assert outcome.status is OutcomeStatus.ABORTED and outcome.abort_reason == "cancelled"
    assert copier.requests == [] and len(adapter.closes) == 1


def test_a_single_step_budget_ends_after_the_tool_call_as_a_timeout(
    copier: FakeLLM, adapter: FakeAdapter
) -> None:
    outcome = play(copier, adapter, toy_task(limits=AgentLimits(max_steps=1)))
    assert outcome.status is OutcomeStatus.TIMEOUT and outcome.reward == 0.0
    assert len(copier.requests) == 1


def test_a_failed_open_is_an_abort_without_model_calls(copier: FakeLLM) -> None:
    adapter = FakeAdapter(open_error=AdapterUnavailableError("adapter down"))
    outcome = play(copier, adapter, toy_task())
    assert outcome.status is OutcomeStatus.ABORTED and "adapter down" in (
        outcome.abort_reason or ""
    )
    assert copier.requests == [] and adapter.closes == []


def test_a_swe_task_is_refused_for_good(copier: FakeLLM, adapter: FakeAdapter) -> None:
    swe = RolloutTask(task_id="t", batch_id="b", group_id="g", instance_id="swerl__spanlib-1")
    outcome = play(copier, adapter, swe)
    assert outcome.status is OutcomeStatus.ABORTED and outcome.retryable is False
    assert copier.requests == [] and adapter.opened == []


@pytest.mark.parametrize(
    ("message", "ok"),
    [
        ({"tool_calls": [LOOKUP]}, True),
        ({"tool_calls": [call("lookup", {"q": "x"}, "c")]}, True),
        ({"tool_calls": []}, False),
        ({"content": "lookup"}, False),
        ({"tool_calls": [{**LOOKUP, "id": ""}]}, False),
        ({"tool_calls": [{"id": "c", "function": {"name": "lookup", "arguments": "{"}}]}, False),
        ({"tool_calls": [{"id": "c", "function": {"name": "lookup", "arguments": "[1]"}}]}, False),
    ],
)
def test_lookup_call_accepts_exactly_one_well_formed_lookup(
    message: dict[str, Any], ok: bool
) -> None:
    assert (lookup_call(message) is not None) is ok, json.dumps(message)


# -- the tool latency model ----------------------------------------------------------------


def latency(**kw: Any) -> ToyToolLatencyConfig:
    return ToyToolLatencyConfig(**kw)


def test_tool_latency_is_zero_when_off_and_deterministic_per_task() -> None:
    assert tool_latency_s("b1:0:0", 1, latency()) == 0.0
    on = latency(median_s=3.0, p99_s=30.0)
    first = tool_latency_s("b1:0:0", 1, on)
    assert first > 0.0 and tool_latency_s("b1:0:0", 1, on) == first  # reproducible
    assert tool_latency_s("b1:0:0", 2, on) != first  # a retry draws afresh
    assert len({tool_latency_s(f"b1:0:{s}", 1, on) for s in range(20)}) == 20
    # independent of the code's draw: each code sees short and long waits
    by_code: dict[str, list[float]] = {c: [] for c in CODES}
    for s in range(400):
        by_code[draw_code(f"t{s}", 1)].append(tool_latency_s(f"t{s}", 1, on))
    assert all(min(v) < 3.0 < max(v) for v in by_code.values())


def test_tool_latency_quantiles_match_the_configured_median_and_p99() -> None:
    on = latency(median_s=3.0, p99_s=30.0, max_s=1000.0)
    draws = sorted(tool_latency_s(f"q:{i}", 1, on) for i in range(20_000))
    median, p99 = draws[len(draws) // 2], draws[int(0.99 * len(draws))]
    assert 2.8 < median < 3.2, median
    assert 26.0 < p99 < 34.0, p99
    assert latency_sigma(on) == pytest.approx(0.99, abs=0.01)  # ln(10) / 2.326
    # the cap holds every draw; no p99 given: 10 x the median
    capped = latency(median_s=3.0, max_s=5.0)
    assert max(tool_latency_s(f"q:{i}", 1, capped) for i in range(2_000)) == 5.0
    assert latency_sigma(capped) == latency_sigma(on)


def slow_task(task_id: str) -> RolloutTask:
    return toy_task(task_id=task_id, limits=AgentLimits(max_steps=2, wall_time_s=30))


def test_the_tool_latency_is_waited_before_the_second_turn_and_recorded(
    copier: FakeLLM, adapter: FakeAdapter
) -> None:
    on = latency(median_s=0.2, p99_s=0.4)
    task = slow_task("b1:0:0")
    runner = ToyTrajectoryRunner(
        adapter, ChatEndpoint(f"http://127.0.0.1:{copier.port}"), latency=on
    )
    t0 = time.monotonic()
    outcome = runner.run(task, make_ctx())
    drawn = tool_latency_s(task.task_id, task.attempt, on)
    assert time.monotonic() - t0 >= drawn
    assert outcome.status is OutcomeStatus.COMPLETED and outcome.reward == 1.0
    assert outcome.durations["tool"] == round(drawn, 3)
    # off: no wait, no "tool" duration
    assert "tool" not in play(copier, adapter, task).durations


def test_a_cancel_ends_the_tool_wait_promptly(copier: FakeLLM, adapter: FakeAdapter) -> None:
    on = latency(median_s=20.0, p99_s=40.0)  # every draw far longer than the test
    runner = ToyTrajectoryRunner(
        adapter, ChatEndpoint(f"http://127.0.0.1:{copier.port}"), latency=on
    )
    cancel = CancelToken()
    timer = threading.Timer(0.3, cancel.cancel, args=("worker stopping",))
    timer.start()
    t0 = time.monotonic()
    try:
        outcome = runner.run(slow_task("b1:0:0"), make_ctx(cancel=cancel))
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 5.0
    assert outcome.status is OutcomeStatus.ABORTED and outcome.abort_reason == "worker stopping"
    assert len(copier.requests) == 1  # the tool call, never the answer


def test_a_tool_wait_past_the_wall_time_is_a_timeout(copier: FakeLLM, adapter: FakeAdapter) -> None:
    on = latency(median_s=20.0, p99_s=40.0)
    runner = ToyTrajectoryRunner(
        adapter, ChatEndpoint(f"http://127.0.0.1:{copier.port}"), latency=on
    )
    task = toy_task(limits=AgentLimits(max_steps=2, wall_time_s=1))
    t0 = time.monotonic()
    outcome = runner.run(task, make_ctx())
    assert time.monotonic() - t0 < 5.0
    assert outcome.status is OutcomeStatus.TIMEOUT and outcome.reward == 0.0
    assert outcome.test_report["ending"] == "out_of_time" and len(copier.requests) == 1


def test_the_factory_wires_the_configured_latency_into_the_toy_runner() -> None:
    from sandbox_worker.config import WorkerConfig
    from sandbox_worker.factory import build_runner

    cfg = WorkerConfig(
        backend="bwrap", kinds=["toy"], rollout={"toy_tool_latency": {"median_s": 3}}
    )
    router, _ = build_runner(cfg)
    runner = router.runner_for("toy")
    assert isinstance(runner, ToyTrajectoryRunner)
    assert runner.latency.median_s == 3.0 and runner.latency.p99 == 30.0


class ToldProgress(RunProgress):
    """Records what the runner tells its progress: phases and the running tool."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[tuple[str, str | None]] = []

    def phase(self, phase: ProgressPhase) -> None:
        super().phase(phase)
        self.told.append(("phase", phase.value))

    def tool(self, name: str | None) -> None:
        super().tool(name)
        self.told.append(("tool", name))


def test_the_runner_tells_its_phase_and_the_tool_it_waits_for(
    copier: FakeLLM, adapter: FakeAdapter
) -> None:
    on = latency(median_s=0.05, p99_s=0.1)
    runner = ToyTrajectoryRunner(
        adapter, ChatEndpoint(f"http://127.0.0.1:{copier.port}"), latency=on
    )
    ctx = make_ctx()
    ctx.progress = progress = ToldProgress()
    outcome = runner.run(slow_task("b1:0:0"), ctx)
    assert outcome.status is OutcomeStatus.COMPLETED
    assert progress.told == [("phase", "agent"), ("tool", TOOL_NAME), ("tool", None)]
