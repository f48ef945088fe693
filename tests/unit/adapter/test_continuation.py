"""Stitching the pieces of a call that token-mode refreshes interrupted (adapter.continuation),
and the engine client's continuation loop against a fake engine (httpx mock transport)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from adapter.continuation import (
    Piece,
    RefreshBarrier,
    continued_sampling,
    numeric_runs,
    straddling_stop,
    version_runs,
)
from adapter.engines.sglang import EngineUnavailableError, SGLangClient
from services.protocol.sglang import SamplingParams


def test_version_runs_merge_and_skip_empty_pieces() -> None:
    pieces = [Piece([1, 2, 3], "4"), Piece([], "5"), Piece([7], "5"), Piece([8, 9], "5")]
    assert version_runs(pieces) == ((0, "4"), (3, "5"))
    assert version_runs([Piece([1], "4"), Piece([2], "4")]) == ((0, "4"),)
    assert version_runs([Piece([], "4"), Piece([], "5")]) == ((0, "5"),)


def test_numeric_runs_merge_versions_that_map_to_the_same_number() -> None:
    def version_of(raw: str | None) -> int:
        return 7 if raw in (None, "default") else int(raw)

    assert numeric_runs([(0, "6"), (3, "7")], version_of) == [(0, 6), (3, 7)]
    assert numeric_runs([(0, "default"), (3, "7")], version_of) == []  # one version after all
    assert numeric_runs([(0, "5"), (2, "6"), (4, "6")], version_of) == [(0, 5), (2, 6)]


def test_continued_sampling_keeps_everything_but_the_budget() -> None:
    params = SamplingParams(max_new_tokens=10, temperature=0.7, top_p=0.9, stop=["</x>"])
    later = continued_sampling(params, 4)
    assert later.max_new_tokens == 6
    assert later.model_dump(exclude={"max_new_tokens"}) == params.model_dump(
        exclude={"max_new_tokens"}
    )
    with pytest.raises(ValueError, match="11 tokens produced"):
        continued_sampling(params, 11)


class FakeEngine:
    """Answers /generate: the first call is aborted after 3 tokens (version "1") while the
    barrier's pause is on; later calls finish with what is left of the budget (version "2").
    ``queued``: the first call is aborted before its prefill, answered as SGLang 0.5.23's
    ``TokenizerManager._handle_abort_req`` answers it (no prompt_tokens, no cached_tokens)."""

    def __init__(
        self, barrier: RefreshBarrier, abort_first: bool = True, queued: bool = False
    ) -> None:
        self.barrier = barrier
        self.abort_first = abort_first
        self.queued = queued
        self.bodies: list[dict[str, Any]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        budget = body["sampling_params"].get("max_new_tokens", 128)
        if len(self.bodies) == 1 and self.queued:
            self.barrier.begin()
            meta = {
                "id": body["rid"],
                "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
                "weight_version": "1",
                "e2e_latency": 0.01,
                "output_token_logprobs": [],
                "completion_tokens": 0,
            }
            return httpx.Response(200, json={"text": "", "output_ids": [], "meta_info": meta})
        if len(self.bodies) == 1 and self.abort_first:
            self.barrier.begin()  # the refresh paused the engine while this call ran
            ids, version = [10, 11, 12], "1"
            finish = {"type": "abort", "message": "Abort by /pause_generation"}
        else:
            ids, version = [20 + i for i in range(budget)], "2"
            finish = {"type": "length", "length": budget}
        meta = {
            "id": body["rid"],
            "finish_reason": finish,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": version,
            "output_token_logprobs": [[-0.5 if version == "1" else -1.5, t, None] for t in ids],
        }
        return httpx.Response(200, json={"text": "x" * len(ids), "output_ids": ids,
                                         "meta_info": meta})  # fmt: skip


async def run_call(engine: FakeEngine, barrier: RefreshBarrier, failed: frozenset[str]) -> Any:
    client = SGLangClient(
        "http://engine", client=httpx.AsyncClient(transport=httpx.MockTransport(engine.handler))
    )
    client.barrier = barrier

    async def refresh_ends() -> None:
        while not barrier.paused:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        barrier.end(failed)

    call = client.generate([1, 2], SamplingParams(max_new_tokens=8, temperature=0.5), rid="r")
    result, _ = await asyncio.gather(call, refresh_ends())
    return result


def test_an_interrupted_call_is_continued_from_its_prefix() -> None:
    barrier = RefreshBarrier()
    engine = FakeEngine(barrier)
    result = asyncio.run(run_call(engine, barrier, frozenset()))
    first, second = engine.bodies
    # The continuation: prompt + partial output, budget less the 3 tokens, same sampling.
    assert second["input_ids"] == [1, 2, 10, 11, 12]
    assert second["sampling_params"] == {**first["sampling_params"], "max_new_tokens": 5}
    assert second["rid"] == "r-c1"
    assert result.output_ids == [10, 11, 12, 20, 21, 22, 23, 24]
    assert result.output_logprobs == [-0.5] * 3 + [-1.5] * 5  # old tokens keep old logprobs
    assert result.version_runs == ((0, "1"), (3, "2"))
    assert result.weight_version == "1" and result.finish_reason.type == "length"
    assert result.prompt_tokens == 2 and result.continuations == 1
    assert barrier.continued == 1


def test_a_call_aborted_before_its_prefill_is_continued_from_its_prompt() -> None:
    """SGLang answers a request aborted while still queued (a pause in abort mode with a
    backlog) without prompt_tokens and cached_tokens: not a protocol error, and the call is
    sent again whole under the new weights."""
    barrier = RefreshBarrier()
    engine = FakeEngine(barrier, queued=True)
    result = asyncio.run(run_call(engine, barrier, frozenset()))
    first, second = engine.bodies
    assert second["input_ids"] == first["input_ids"] == [1, 2]
    assert second["sampling_params"] == first["sampling_params"]
    assert result.output_ids == [20 + i for i in range(8)] and result.version_runs == ()
    assert result.weight_version == "2" and result.continuations == 1
    assert result.prompt_tokens == 2


def test_a_queued_abort_outside_a_pause_is_a_result_with_the_prompts_length() -> None:
    engine = FakeEngine(RefreshBarrier(), queued=True)
    client = SGLangClient(
        "http://engine", client=httpx.AsyncClient(transport=httpx.MockTransport(engine.handler))
    )
    result = asyncio.run(client.generate([1, 2, 3], SamplingParams(max_new_tokens=8)))
    assert result.aborted and result.output_ids == [] and result.prompt_tokens == 3


def test_an_abort_outside_a_pause_is_returned_as_is() -> None:
    """Without a barrier (step mode) the abort reaches the router, which retries elsewhere."""
    barrier = RefreshBarrier()
    engine = FakeEngine(barrier)
    client = SGLangClient(
        "http://engine", client=httpx.AsyncClient(transport=httpx.MockTransport(engine.handler))
    )
    result = asyncio.run(client.generate([1], SamplingParams(max_new_tokens=8)))
    assert result.aborted and result.output_ids == [10, 11, 12] and len(engine.bodies) == 1


def test_an_engine_that_failed_to_load_fails_the_call_over() -> None:
    barrier = RefreshBarrier()
    engine = FakeEngine(barrier)
    with pytest.raises(EngineUnavailableError, match="did not load the new weights"):
        asyncio.run(run_call(engine, barrier, frozenset({"http://engine"})))
    assert len(engine.bodies) == 1  # never continued on the engine with unknown weights


def test_a_stop_string_straddling_the_switch_is_found() -> None:
    stop = ["</function>"]
    assert straddling_stop("call </fun", ["ct", "ion>", " more"], stop) == (2, "</function>")
    # Wholly inside the continuation: the engine's own stop check finds it, not this one.
    assert straddling_stop("abc", ["</function>", "x"], stop) is None
    assert straddling_stop("abc", ["de", "f"], stop) is None
    assert straddling_stop("ab<", ["/x"], ["</x", "b</"]) == (1, "b</")  # first completed
    assert straddling_stop("", ["a"], stop) is None and straddling_stop("a", ["b"], []) is None


def test_a_continuation_is_cut_where_a_straddling_stop_string_ends() -> None:
    barrier = RefreshBarrier()
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if len(bodies) == 1:  # interrupted right after "</fun"
            barrier.begin()
            ids, texts, finish = [5, 6], ["call ", "</fun"], {"type": "abort", "message": "p"}
        else:  # the engine misses "</function>": it began before this request
            ids, texts = [7, 8, 9], ["ction>", " and", " more"]
            finish = {"type": "length", "length": 3}
        with_text = body.get("return_text_in_logprobs", False)
        meta = {
            "id": body["rid"], "finish_reason": finish, "prompt_tokens": 1,
            "completion_tokens": len(ids), "cached_tokens": 0, "weight_version": str(len(bodies)),
            "output_token_logprobs": [
                [-1.0, t, x if with_text else None] for t, x in zip(ids, texts, strict=True)
            ],
        }  # fmt: skip
        return httpx.Response(200, json={"text": "".join(texts), "output_ids": ids,
                                         "meta_info": meta})  # fmt: skip

    async def scenario() -> Any:
        client = SGLangClient(
            "http://engine", client=httpx.AsyncClient(transport=httpx.MockTransport(handler))
        )
        client.barrier = barrier

        async def refresh_ends() -> None:
            while not barrier.paused:
                await asyncio.sleep(0.001)
            barrier.end(frozenset())

        params = SamplingParams(max_new_tokens=5, stop=["</function>"])
        result, _ = await asyncio.gather(client.generate([1], params), refresh_ends())
        return result

    result = asyncio.run(scenario())
    assert bodies[1]["return_text_in_logprobs"] is True
    assert "return_text_in_logprobs" not in bodies[0]
    assert result.output_ids == [5, 6, 7]  # cut after the token that completes the stop
    assert result.finish_reason.type == "stop" and result.finish_reason.matched == "</function>"
    assert result.version_runs == ((0, "1"), (2, "2"))


def test_a_call_interrupted_by_two_refreshes_carries_three_versions() -> None:
    barrier = RefreshBarrier()
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        n = len(bodies)
        budget = body["sampling_params"]["max_new_tokens"]
        if n < 3:  # the first two pieces are cut by a pause after 2 tokens each
            barrier.begin()
            ids, finish = [10 * n, 10 * n + 1], {"type": "abort", "message": "p"}
        else:
            ids, finish = list(range(30, 30 + budget)), {"type": "length", "length": budget}
        meta = {
            "id": body["rid"], "finish_reason": finish, "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(ids), "cached_tokens": 0, "weight_version": str(n),
            "output_token_logprobs": [[-float(n), t, None] for t in ids],
        }  # fmt: skip
        return httpx.Response(200, json={"text": "", "output_ids": ids, "meta_info": meta})

    async def scenario() -> Any:
        client = SGLangClient(
            "http://engine", client=httpx.AsyncClient(transport=httpx.MockTransport(handler))
        )
        client.barrier = barrier

        async def refreshes_end() -> None:
            for _ in range(2):
                while not barrier.paused:
                    await asyncio.sleep(0.001)
                barrier.end(frozenset())

        call = client.generate([1], SamplingParams(max_new_tokens=7), rid="r")
        result, _ = await asyncio.gather(call, refreshes_end())
        return result

    result = asyncio.run(scenario())
    assert [b["input_ids"] for b in bodies] == [[1], [1, 10, 11], [1, 10, 11, 20, 21]]
    assert [b["sampling_params"]["max_new_tokens"] for b in bodies] == [7, 5, 3]
    assert result.output_ids == [10, 11, 20, 21, 30, 31, 32]
    assert result.version_runs == ((0, "1"), (2, "2"), (4, "3"))
    assert result.output_logprobs == [-1.0, -1.0, -2.0, -2.0, -3.0, -3.0, -3.0]
    assert result.continuations == 2
