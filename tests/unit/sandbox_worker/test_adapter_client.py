"""The worker's adapter client against a scripted HTTP transport (``httpx.MockTransport``)."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from sandbox_worker.adapter_client import (
    AdapterClient,
    AdapterError,
    AdapterUnavailableError,
    OpenReplyLostError,
    TrajectoryExistsError,
)
from services.protocol.trajectory import Outcome, OutcomeStatus, TrajectoryMeta

META = TrajectoryMeta(trajectory_id="b:0:0.a1", task_id="b:0:0", batch_id="b", group_id="b:0")


def client(handler: Callable[[httpx.Request], httpx.Response], attempts: int = 3) -> AdapterClient:
    return AdapterClient(
        "http://adapter:8100/",
        attempts=attempts,
        backoff_s=0.0,
        transport=httpx.MockTransport(handler),
    )


def error(status: int, code: str, message: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": message, "code": code}})


def test_open_posts_the_meta_and_returns_the_trajectory_token() -> None:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json={"trajectory_id": META.trajectory_id, "token": "swt_t"})

    assert client(handle).open(META) == "swt_t"
    [request] = seen
    assert (request.method, str(request.url)) == ("POST", "http://adapter:8100/trajectories")
    assert "authorization" not in request.headers  # no worker token configured
    body = json.loads(request.content)
    assert (body["trajectory_id"], body["batch_id"], body["group_id"]) == ("b:0:0.a1", "b", "b:0")


def test_open_of_an_existing_record_is_refused() -> None:
    c = client(lambda _r: error(409, "trajectory_exists", "exists"))
    with pytest.raises(TrajectoryExistsError, match="already has a record"):
        c.open(META)


def test_every_call_carries_the_worker_token() -> None:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/trajectories":
            return httpx.Response(201, json={"token": "swt_t"})
        return httpx.Response(200, json={"outcome": None, "counters": {}})

    c = AdapterClient("http://adapter:8100", token="w" * 20, transport=httpx.MockTransport(handle))
    c.open(META)
    c.close(META.trajectory_id)
    assert [r.headers["authorization"] for r in seen] == [f"Bearer {'w' * 20}"] * 2


def test_open_answer_without_a_string_token_is_an_error() -> None:
    with pytest.raises(AdapterError, match="token is not a string"):
        client(lambda _r: httpx.Response(201, json={"token": 5})).open(META)


def test_open_409_after_its_own_reply_was_lost_is_reported() -> None:
    """The record is ours, but the answer carrying its token is gone (only a digest is
    stored): the run cannot use it and must close it as aborted."""
    calls = iter([httpx.ReadError("reset"), error(409, "trajectory_exists", "exists")])

    def handle(_request: httpx.Request) -> httpx.Response:
        step = next(calls)
        if isinstance(step, Exception):
            raise step
        return step

    with pytest.raises(OpenReplyLostError, match="token was lost"):
        client(handle).open(META)  # the first try created it
    assert next(calls, None) is None  # exactly two tries: the lost one and the 409


def test_unreachable_adapter_is_retried_then_unavailable() -> None:
    n = 0

    def handle(_request: httpx.Request) -> httpx.Response:
        nonlocal n
        n += 1
        raise httpx.ConnectError("connection refused")

    with pytest.raises(AdapterUnavailableError, match=r"3 attempts\): ConnectError"):
        client(handle).open(META)
    assert n == 3


def test_503_is_retried_and_can_recover() -> None:
    seen: list[httpx.Request] = []
    answers = iter(
        [
            error(503, "store_unavailable", "redis down"),
            httpx.Response(201, json={"token": "swt_2"}),
        ]
    )

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return next(answers)

    assert client(handle).open(META) == "swt_2"  # the retried answer is the one used
    assert len(seen) == 2
    assert seen[0].content == seen[1].content  # the same request, sent again


def test_other_errors_are_not_retried() -> None:
    n = 0

    def handle(_request: httpx.Request) -> httpx.Response:
        nonlocal n
        n += 1
        return error(400, "invalid_request", "bad meta")

    with pytest.raises(AdapterError, match="400 invalid_request: bad meta"):
        client(handle).open(META)
    assert n == 1


def test_close_sends_the_outcome_and_reads_what_was_kept() -> None:
    sent: list[dict] = []
    kept = Outcome(status=OutcomeStatus.ABORTED, abort_reason="engine_unavailable")
    counters = {"turns": 4, "prompt_tokens": 10, "observation_tokens": 5, "generated_tokens": 7}

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/trajectories/b:0:0.a1/close"
        sent.append(json.loads(request.content) if request.content else {})
        return httpx.Response(
            200, json={"outcome": kept.model_dump(mode="json"), "counters": counters}
        )

    mine = Outcome(status=OutcomeStatus.COMPLETED, reward=1.0)
    result = client(handle).close("b:0:0.a1", mine)
    assert sent[0]["outcome"]["reward"] == 1.0
    assert result.outcome == kept
    assert (result.n_turns, result.n_tokens) == (4, 22)


def test_close_without_outcome_sends_an_empty_body() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content) == {}
        return httpx.Response(200, json={"outcome": None, "counters": {}})

    result = client(handle).close("t1")
    assert result.outcome is None and result.n_tokens == 0


@pytest.mark.parametrize(
    ("response", "match"),
    [
        (error(404, "trajectory_not_found", "unknown"), "404 trajectory_not_found"),
        (httpx.Response(200, text="not json"), "unreadable answer"),
        (httpx.Response(200, json={"outcome": {"status": "aborted"}}), "unreadable answer"),
    ],
)
def test_close_failures(response: httpx.Response, match: str) -> None:
    with pytest.raises(AdapterError, match=match):
        client(lambda _r: response).close("t1")


@pytest.mark.parametrize(("url", "attempts"), [("adapter:8100", 3), ("http://a:1", 0)])
def test_bad_arguments(url: str, attempts: int) -> None:
    with pytest.raises(ValueError):
        AdapterClient(url, attempts=attempts)
