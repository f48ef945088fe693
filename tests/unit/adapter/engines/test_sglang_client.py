"""SGLang client without a server: request shape, response validation, error mapping."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from adapter.engines.sglang import (
    EngineProtocolError,
    EngineRequestError,
    EngineUnavailableError,
    SamplingParams,
    SGLangClient,
    _stitch,
)

URL = "http://engine.test:30000"


def good_answer(rid: str = "r1", ids: tuple[int, ...] = (5, 7, 9)) -> dict[str, Any]:
    return {
        "text": "abc",
        "output_ids": list(ids),
        "meta_info": {
            "id": rid,
            "finish_reason": {"type": "stop", "matched": ids[-1]},
            "prompt_tokens": 4,
            "completion_tokens": len(ids),
            "cached_tokens": 2,
            "weight_version": "v3",
            "e2e_latency": 0.25,
            "output_token_logprobs": [[-0.5 - i, t, None] for i, t in enumerate(ids)],
            "some_future_field": {"x": 1},
        },
    }


def client_for(handler: Callable[[httpx.Request], httpx.Response]) -> SGLangClient:
    return SGLangClient(URL, client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_generate_sends_sglang_body_and_parses_answer() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/generate"
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=good_answer())

    sampling = SamplingParams(max_new_tokens=16, temperature=0.7, stop_token_ids=[9])
    result = run(client_for(handler).generate([1, 2, 3, 4], sampling, rid="r1"))
    assert seen == [
        {
            "input_ids": [1, 2, 3, 4],
            "sampling_params": {"max_new_tokens": 16, "temperature": 0.7, "stop_token_ids": [9]},
            "return_logprob": True,
            "rid": "r1",
            "stream": False,
        }
    ]
    assert result.output_ids == [5, 7, 9]
    assert result.output_logprobs == [-0.5, -1.5, -2.5]
    assert result.finish_reason.type == "stop" and result.finish_reason.matched == 9
    assert (result.weight_version, result.prompt_tokens, result.cached_tokens) == ("v3", 4, 2)
    assert result.engine_latency_s == 0.25 and result.latency_s >= 0 and not result.aborted


def test_output_ids_without_the_stop_token_are_completed_from_logprobs() -> None:
    answer = good_answer()
    answer["output_ids"] = [5, 7]
    result = run(
        client_for(lambda r: httpx.Response(200, json=answer)).generate(
            [1], SamplingParams(), rid="r1"
        )
    )
    assert result.output_ids == [5, 7, 9]


def test_aborted_generation_is_a_result_not_an_error() -> None:
    answer = good_answer()
    answer["meta_info"]["finish_reason"] = {"type": "abort", "message": "Abort by user"}
    result = run(
        client_for(lambda r: httpx.Response(200, json=answer)).generate(
            [1], SamplingParams(), rid="r1"
        )
    )
    assert result.aborted


def _mutations() -> list[tuple[str, Callable[[dict[str, Any]], Any]]]:
    def set_path(path: list[str], value: Any) -> Callable[[dict[str, Any]], Any]:
        def mutate(answer: dict[str, Any]) -> Any:
            node = answer
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
            return answer

        return mutate

    return [
        ("a list", lambda a: [a]),
        ("no meta_info", lambda a: {"text": "", "output_ids": [1]}),
        ("finish_reason null", set_path(["meta_info", "finish_reason"], None)),
        ("bad finish type", set_path(["meta_info", "finish_reason"], {"type": "exploded"})),
        ("no logprobs", set_path(["meta_info", "output_token_logprobs"], None)),
        ("short logprob entry", set_path(["meta_info", "output_token_logprobs"], [[-1.0, 5]])),
        ("string logprob", set_path(["meta_info", "output_token_logprobs"], [["x", 5, None]] * 3)),
        ("ids disagree", set_path(["output_ids"], [5, 8, 9])),
        ("wrong rid", set_path(["meta_info", "id"], "someone-else")),
        ("negative prompt_tokens", set_path(["meta_info", "prompt_tokens"], -1)),
        # only an abort of a queued request may leave it out (SGLang's _handle_abort_req)
        ("finished without prompt_tokens", lambda a: a["meta_info"].pop("prompt_tokens") and a),
        ("completion count off", set_path(["meta_info", "completion_tokens"], 7)),
    ]


@pytest.mark.parametrize(("name", "mutate"), _mutations(), ids=[m[0] for m in _mutations()])
def test_malformed_answers_raise_protocol_errors(
    name: str, mutate: Callable[[dict[str, Any]], Any]
) -> None:
    answer = mutate(good_answer())
    client = client_for(lambda r: httpx.Response(200, json=answer))
    with pytest.raises(EngineProtocolError):
        run(client.generate([1], SamplingParams(), rid="r1"))


def test_non_json_answer_is_a_protocol_error() -> None:
    client = client_for(lambda r: httpx.Response(200, text="<html>proxy</html>"))
    with pytest.raises(EngineProtocolError, match="not JSON"):
        run(client.generate([1], SamplingParams()))


def test_status_codes_map_to_error_classes() -> None:
    def answer(status: int, body: Any) -> SGLangClient:
        return client_for(lambda r: httpx.Response(status, json=body))

    with pytest.raises(EngineRequestError) as err:
        run(
            answer(400, {"error": {"message": "The input (9 tokens) is longer"}}).generate(
                [1], SamplingParams()
            )
        )
    assert err.value.status == 400 and "longer" in err.value.detail
    with pytest.raises(EngineRequestError) as err:
        run(
            answer(422, {"detail": [{"msg": "Input should be a valid list"}]}).generate(
                [1], SamplingParams()
            )
        )
    assert err.value.status == 422 and "valid list" in err.value.detail
    with pytest.raises(EngineUnavailableError) as unavailable:
        run(answer(503, {"error": {"message": "overloaded"}}).generate([1], SamplingParams()))
    assert unavailable.value.status == 503 and unavailable.value.tokens_produced is False
    assert not isinstance(unavailable.value, EngineProtocolError)


@pytest.mark.parametrize(
    "exc",
    [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("eof")],
)
def test_transport_failures_are_unavailability(exc: Exception) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    client = client_for(handler)
    with pytest.raises(EngineUnavailableError) as err:
        run(client.generate([1], SamplingParams()))
    assert err.value.tokens_produced is False and err.value.status is None
    assert run(client.health()) is False


def test_update_weights_refusal_and_flush_refusal() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/update_weights_from_disk":
            body = json.loads(request.content)
            assert body == {
                "model_path": "/ckpt",
                "abort_all_requests": False,
                "weight_version": "v9",
            }
            return httpx.Response(
                400, json={"success": False, "message": "no such dir", "num_paused_requests": 0}
            )
        if request.url.path == "/flush_cache":
            return httpx.Response(400, text="Cache flushed.\n")
        return httpx.Response(404)

    client = client_for(handler)
    with pytest.raises(EngineRequestError, match="no such dir"):
        run(client.update_weights_from_disk("/ckpt", "v9"))
    assert run(client.flush_cache()) is False


def test_model_info_validation() -> None:
    client = client_for(lambda r: httpx.Response(200, json={"weight_version": "v1"}))
    with pytest.raises(EngineProtocolError, match="model_info"):
        run(client.model_info())
    ok = client_for(
        lambda r: httpx.Response(200, json={"model_path": "/m", "weight_version": "v1", "x": 1})
    )
    assert run(ok.get_weight_version()) == "v1"


def test_argument_validation() -> None:
    with pytest.raises(ValueError, match="http"):
        SGLangClient("engine:30000")
    with pytest.raises(ValueError, match="positive"):
        SGLangClient(URL, timeout=0)
    client = client_for(lambda r: httpx.Response(200, json=good_answer()))
    with pytest.raises(ValueError, match="empty"):
        run(client.generate([], SamplingParams()))
    with pytest.raises(ValueError, match="rid"):
        run(client.abort_request())


@pytest.mark.parametrize(
    "fields",
    [
        {"top_k": 0},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"temperature": -0.1},
        {"max_new_tokens": -1},
        {"stop": [""]},
        {"stop_token_ids": [-3]},
        {"best_of": 2},
    ],
)
def test_sampling_params_validation(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        SamplingParams(**fields)


def test_sampling_params_wire_form_omits_defaults() -> None:
    assert SamplingParams().to_wire() == {}
    assert SamplingParams(temperature=0.0, stop="x").to_wire() == {"temperature": 0.0, "stop": "x"}
    assert SamplingParams(temperature=0.0).is_greedy and SamplingParams(top_k=1).is_greedy


def test_top_logprobs_are_requested_and_parsed() -> None:
    seen: list[dict[str, Any]] = []
    answer = good_answer()
    top = [[[-0.1, 5, None], [-2.0, 8, None]], [[-0.2, 7, "x"], [-3.0, 1, "y"]], None]
    answer["meta_info"]["output_top_logprobs"] = top

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=answer)

    sampling = SamplingParams(max_new_tokens=3, json_schema='{"type": "object"}')
    result = run(client_for(handler).generate([1, 2], sampling, rid="r1", top_logprobs_num=2))
    assert seen[0]["top_logprobs_num"] == 2 and seen[0]["return_logprob"] is True
    assert seen[0]["sampling_params"]["json_schema"] == '{"type": "object"}'
    assert result.output_top_logprobs == [[(-0.1, 5), (-2.0, 8)], [(-0.2, 7), (-3.0, 1)], []]
    plain = run(
        client_for(lambda r: httpx.Response(200, json=good_answer())).generate(
            [1], sampling, rid="r1"
        )
    )
    assert plain.output_top_logprobs is None
    with pytest.raises(ValueError, match="top_logprobs_num"):
        run(client_for(handler).generate([1], sampling, return_logprob=False, top_logprobs_num=2))


@pytest.mark.parametrize(
    ("top", "fragment"),
    [
        (None, "output_top_logprobs is missing"),
        ([[[-0.1, 5, None]]], "1 entries for 3 output tokens"),
        ([[[-0.1, "5", None]]] * 3, "token id"),
        ([[["x", 5, None]]] * 3, "logprob"),
    ],
)
def test_malformed_top_logprobs_are_protocol_errors(top: Any, fragment: str) -> None:
    answer = good_answer()
    answer["meta_info"]["output_top_logprobs"] = top
    client = client_for(lambda r: httpx.Response(200, json=answer))
    with pytest.raises(EngineProtocolError, match=fragment):
        run(client.generate([1, 2], SamplingParams(), rid="r1", top_logprobs_num=1))


def test_a_scripted_engines_answer_is_flagged_and_stays_flagged_when_stitched() -> None:
    """The reference engine's scripted mode says so in ``meta_info``; SGLang never does."""
    replayed = good_answer()
    replayed["meta_info"]["scripted"] = True
    flagged = run(client_for(lambda r: httpx.Response(200, json=replayed)).generate(
        [1], SamplingParams(), rid="r1"))  # fmt: skip
    plain = run(client_for(lambda r: httpx.Response(200, json=good_answer())).generate(
        [1], SamplingParams(), rid="r1"))  # fmt: skip
    assert flagged.scripted and not plain.scripted
    assert _stitch([plain, flagged], 1.0).scripted and not _stitch([plain, plain], 1.0).scripted
    replayed["meta_info"]["scripted"] = "yes"
    with pytest.raises(EngineProtocolError):
        run(client_for(lambda r: httpx.Response(200, json=replayed)).generate(
            [1], SamplingParams(), rid="r1"))  # fmt: skip
