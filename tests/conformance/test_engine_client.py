"""swerl's engine client (adapter/engines/sglang.py) against SGLang 0.5.23's own server code:
generation with logprobs, top logprobs and stops, aborts, pause and continue, model and server
info, cache flush (docs/sglang-conformance.md)."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from adapter.engines.sglang import SamplingParams
from tests.conformance.conftest import EngineFactory
from tests.conformance.sglang_app import SGLangEngine, run

PROMPT = [5, 17, 42, 99, 7, 3, 64, 12]
LONG = SamplingParams(max_new_tokens=400, temperature=1.0, ignore_eos=True)


def recomputed(engine: SGLangEngine, output: list[int]) -> list[float]:
    """The served model's own logprobs of ``output`` after PROMPT (temperature 1)."""
    assert engine.scheduler is not None
    model = engine.scheduler.runner.model
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT + output])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[len(PROMPT) + i - 1, t]) for i, t in enumerate(output)]


def test_generate_returns_the_sampled_ids_with_their_logprobs(engine: EngineFactory) -> None:
    async def scenario() -> None:
        async with engine() as e:
            result = await e.client().generate(
                PROMPT, SamplingParams(max_new_tokens=12, temperature=1.0, ignore_eos=True)
            )
            assert len(result.output_ids) == len(result.output_logprobs) == 12
            assert result.finish_reason.type == "length" and result.finish_reason.length == 12
            assert result.prompt_tokens == len(PROMPT)
            assert result.weight_version == "0"
            assert result.engine_latency_s is not None and result.engine_latency_s > 0
            # SGLang's [logprob, token_id, text] entries parsed in order: the behaviour
            # logprobs are the model's own
            expected = recomputed(e, result.output_ids)
            assert (
                max(abs(a - b) for a, b in zip(result.output_logprobs, expected, strict=True))
                < 1e-4
            )
            assert result.text == e.tokenizer_manager.tokenizer.decode(result.output_ids)

    run(scenario())


def test_top_logprobs_come_sorted_and_contain_the_greedy_choice(engine: EngineFactory) -> None:
    async def scenario() -> None:
        async with engine() as e:
            result = await e.client().generate(
                PROMPT,
                SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True),
                top_logprobs_num=3,
            )
            assert result.output_top_logprobs is not None
            assert len(result.output_top_logprobs) == 6
            for token, logprob, top in zip(
                result.output_ids, result.output_logprobs, result.output_top_logprobs, strict=True
            ):
                assert len(top) == 3
                values = [v for v, _ in top]
                assert values == sorted(values, reverse=True)
                assert top[0][1] == token  # greedy: the chosen token is the most likely
                assert math.isclose(top[0][0], logprob, abs_tol=1e-6)

    run(scenario())


def test_stop_string_and_stop_token_end_the_answer_as_sglang_trims(
    engine: EngineFactory,
) -> None:
    async def scenario() -> None:
        async with engine() as e:
            client = e.client()
            greedy = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
            full = await client.generate(PROMPT, greedy)
            tokenizer = e.tokenizer_manager.tokenizer
            # a stop string that the greedy answer reaches in its middle
            stop = tokenizer.decode(full.output_ids[6:8]).strip() or full.text[10:12]
            at = full.text.index(stop)
            stopped = await client.generate(PROMPT, greedy.model_copy(update={"stop": [stop]}))
            assert stopped.finish_reason.type == "stop"
            assert stopped.finish_reason.matched == stop
            assert stopped.text == full.text[:at]  # SGLang cuts the stop string from the text
            assert stopped.output_ids == full.output_ids[: len(stopped.output_ids)]
            assert len(stopped.output_ids) == len(stopped.output_logprobs) <= 8
            # a stop token: in output_ids (and logprobs), out of the text (SGLang ignores
            # stop_token_ids under ignore_eos)
            token = full.output_ids[4]
            first = full.output_ids.index(token)
            by_id = await client.generate(
                PROMPT,
                greedy.model_copy(update={"stop_token_ids": [token], "ignore_eos": False}),
            )
            assert by_id.finish_reason.type == "stop" and by_id.finish_reason.matched == token
            assert by_id.output_ids == full.output_ids[: first + 1]
            assert by_id.text == tokenizer.decode(full.output_ids[:first])

    run(scenario())


def test_abort_request_answers_the_running_and_the_queued_call(engine: EngineFactory) -> None:
    """SGLang answers a request aborted while queued with an ``AbortReq`` echo: a meta_info
    without prompt_tokens or cached_tokens. The client returns both calls as aborted."""

    async def scenario() -> None:
        async with engine(max_running_requests=1, step_delay_s=0.01) as e:
            client = e.client()
            running = asyncio.create_task(client.generate(PROMPT, LONG, rid="running"))
            queued = asyncio.create_task(client.generate(PROMPT[:5], LONG, rid="queued"))
            await e.wait_until(running=1, waiting=1)
            await client.abort_request(abort_all=True)
            first, second = await running, await queued
            assert first.aborted and second.aborted
            assert 0 < len(first.output_ids) < 400
            assert len(first.output_ids) == len(first.output_logprobs)
            assert second.output_ids == [] and second.output_logprobs == []
            assert second.finish_reason.message == "Abort in waiting queue"
            assert second.prompt_tokens == 5  # not sent by SGLang: the ids sent stand in

    run(scenario())


def test_abort_request_by_rid_leaves_the_other_call_alone(engine: EngineFactory) -> None:
    async def scenario() -> None:
        async with engine(step_delay_s=0.005) as e:
            client = e.client()
            victim = asyncio.create_task(client.generate(PROMPT, LONG, rid="victim"))
            other = asyncio.create_task(
                client.generate(PROMPT, LONG.model_copy(update={"max_new_tokens": 40}))
            )
            await e.wait_until(running=2)
            await client.abort_request(rid="victim")
            assert (await victim).aborted
            kept = await other
            assert kept.finish_reason.type == "length" and len(kept.output_ids) == 40
            with pytest.raises(ValueError):
                await client.abort_request()

    run(scenario())


def test_pause_in_abort_mode_then_continue(engine: EngineFactory) -> None:
    """``/pause_generation {mode: abort}`` returns once every running call has been answered
    (aborted); new calls wait until ``/continue_generation``."""

    async def scenario() -> None:
        async with engine(step_delay_s=0.01) as e:
            client = e.client()
            running = asyncio.create_task(client.generate(PROMPT, LONG))
            await e.wait_until(running=1)
            await client.pause_generation("abort")
            assert running.done() and running.result().aborted
            later = asyncio.create_task(
                client.generate(PROMPT, SamplingParams(max_new_tokens=3, temperature=0.0))
            )
            await asyncio.sleep(0.3)
            assert not later.done()  # held at SGLang's pause condition
            await client.continue_generation()
            answer = await later
            assert answer.finish_reason.type == "length" and len(answer.output_ids) == 3

    run(scenario())


def test_pause_in_place_holds_a_call_and_flush_is_refused_meanwhile(
    engine: EngineFactory,
) -> None:
    async def scenario() -> None:
        async with engine(step_delay_s=0.005) as e:
            client = e.client()
            call = asyncio.create_task(
                client.generate(PROMPT, LONG.model_copy(update={"max_new_tokens": 60}))
            )
            await e.wait_until(running=1)
            await client.pause_generation("in_place")  # SGLang answers before it is applied
            await asyncio.sleep(0.1)
            assert e.scheduler is not None
            steps = e.scheduler.step_count
            await asyncio.sleep(0.2)
            assert e.scheduler.step_count == steps and not call.done()
            assert await client.flush_cache() is False  # SGLang: 400 while requests run
            await client.continue_generation()
            answer = await call
            assert not answer.aborted and len(answer.output_ids) == 60
            assert await client.flush_cache() is True

    run(scenario())


def test_model_info_server_info_and_health(engine: EngineFactory) -> None:
    async def scenario() -> None:
        async with engine(server_args={"tp_size": 2}) as e:
            client = e.client()
            info = await client.model_info()
            assert info.weight_version == "0" and info.is_generation
            assert await client.get_weight_version() == "0"
            assert await client.tp_size() == 2  # /server_info's tp_size: the group ranks taken
            assert await client.health() is True

    run(scenario())
