"""Client contract tests: the SGLang client against a live engine speaking SGLang's protocol.

They run against the reference engine by default and against a real SGLang server when
``SWERL_SGLANG_URL`` is set (``deploy/gpu_check_sglang.sh``), so the client is checked against
both. Assertions use only what SGLang guarantees (no exact numerics); reference-specific checks
live in ``test_reference_server.py``.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Coroutine
from typing import Any

import httpx
import pytest

from adapter.engines.sglang import (
    EngineRequestError,
    EngineUnavailableError,
    GenerateResult,
    SamplingParams,
    SGLangClient,
)
from services.processes import free_port
from tests.support.engine_under_test import EngineUnderTest


def long_tokens(engine: EngineUnderTest) -> int:
    """A generation long enough to still be running after ~1 s on this engine.

    The reference engine decodes ~1000 tokens/s for one request on a quiet machine; 2000 stays
    inside its 4096-token context."""
    default = "2000" if engine.is_reference else "3000"
    return int(os.environ.get("SWERL_LONG_TOKENS", default))


def run[T](coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def test_generate_returns_tokens_logprobs_and_meta(
    engine: EngineUnderTest, engine_tokenizer: Any
) -> None:
    prompt = prompt_ids(engine_tokenizer, "Say something.")
    rid = f"contract-{uuid.uuid4().hex}"

    async def go() -> GenerateResult:
        async with SGLangClient(engine.url) as client:
            return await client.generate(
                prompt, SamplingParams(max_new_tokens=8, temperature=1.0, ignore_eos=True), rid=rid
            )

    result = run(go())
    assert result.rid == rid
    assert len(result.output_ids) == 8 and len(result.output_logprobs) == 8
    assert all(lp <= 0.0 for lp in result.output_logprobs)
    assert result.finish_reason.type == "length" and result.finish_reason.length == 8
    assert result.prompt_tokens == len(prompt)
    assert isinstance(result.weight_version, str) and result.weight_version
    assert 0 <= result.cached_tokens < len(prompt)
    assert result.latency_s > 0


def test_greedy_is_reproducible_and_stop_token_ids_stop(
    engine: EngineUnderTest, engine_tokenizer: Any
) -> None:
    prompt = prompt_ids(engine_tokenizer, "Count to ten.")
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)

    async def go() -> tuple[GenerateResult, GenerateResult, GenerateResult]:
        async with SGLangClient(engine.url) as client:
            first = await client.generate(prompt, greedy)
            again = await client.generate(prompt, greedy)
            stop_id = first.output_ids[2]
            stopped = await client.generate(
                prompt, greedy.model_copy(update={"stop_token_ids": [stop_id]})
            )
            return first, again, stopped

    first, again, stopped = run(go())
    assert first.output_ids == again.output_ids
    stop_id = first.output_ids[2]
    expected_len = first.output_ids.index(stop_id) + 1
    assert stopped.finish_reason.type == "stop" and stopped.finish_reason.matched == stop_id
    assert stopped.output_ids == first.output_ids[:expected_len]


def test_stop_strings_stop_and_are_trimmed(engine: EngineUnderTest, engine_tokenizer: Any) -> None:
    prompt = prompt_ids(engine_tokenizer, "Write code.")
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)

    async def go() -> tuple[GenerateResult, GenerateResult]:
        async with SGLangClient(engine.url) as client:
            first = await client.generate(prompt, greedy)
            full_text = engine_tokenizer.decode(first.output_ids, skip_special_tokens=True)
            stop = full_text[len(full_text) // 2 :][:2] or full_text[-1:]
            stopped = await client.generate(prompt, greedy.model_copy(update={"stop": [stop]}))
            return first, stopped

    first, stopped = run(go())
    full_text = engine_tokenizer.decode(first.output_ids, skip_special_tokens=True)
    stop = full_text[len(full_text) // 2 :][:2] or full_text[-1:]
    assert stopped.finish_reason.type == "stop" and stopped.finish_reason.matched == stop
    assert stop not in stopped.text
    assert full_text.startswith(stopped.text)
    assert stopped.output_ids == first.output_ids[: len(stopped.output_ids)]
    decoded = engine_tokenizer.decode(stopped.output_ids, skip_special_tokens=True)
    assert stop in decoded and stop not in engine_tokenizer.decode(
        stopped.output_ids[:-1], skip_special_tokens=True
    )


def test_concurrent_requests_each_get_their_own_answer(
    engine: EngineUnderTest, engine_tokenizer: Any
) -> None:
    prompts = [
        prompt_ids(engine_tokenizer, f"Task number {i}: " + "word " * (3 * i)) for i in range(8)
    ]
    greedy = [
        SamplingParams(max_new_tokens=4 + i, temperature=0.0, ignore_eos=True) for i in range(8)
    ]

    async def go() -> tuple[list[GenerateResult], list[GenerateResult]]:
        async with SGLangClient(engine.url) as client:
            together = await asyncio.gather(
                *(
                    client.generate(p, s, rid=f"conc-{i}-{uuid.uuid4().hex}")
                    for i, (p, s) in enumerate(zip(prompts, greedy, strict=True))
                )
            )
            alone = [await client.generate(p, s) for p, s in zip(prompts, greedy, strict=True)]
            return list(together), alone

    together, alone = run(go())
    for i, (result, prompt) in enumerate(zip(together, prompts, strict=True)):
        assert result.rid.startswith(f"conc-{i}-")
        assert result.prompt_tokens == len(prompt)
        assert len(result.output_ids) == 4 + i and result.finish_reason.type == "length"
    if engine.is_reference:
        # Batched decoding gives the same greedy tokens as running alone.
        assert [r.output_ids for r in together] == [r.output_ids for r in alone]


def test_abort_request_ends_a_running_generation(
    engine: EngineUnderTest, engine_tokenizer: Any
) -> None:
    prompt = prompt_ids(engine_tokenizer, "Keep going.")
    rid = f"abort-{uuid.uuid4().hex}"
    limit = long_tokens(engine)

    async def go() -> GenerateResult:
        async with SGLangClient(engine.url) as client:
            task = asyncio.create_task(
                client.generate(
                    prompt, SamplingParams(max_new_tokens=limit, ignore_eos=True), rid=rid
                )
            )
            await asyncio.sleep(0.5)
            assert not task.done()
            await client.abort_request(rid)
            return await asyncio.wait_for(task, 30)

    result = run(go())
    assert result.aborted
    assert len(result.output_ids) < limit


def test_pause_in_place_holds_and_continue_resumes(
    engine: EngineUnderTest, engine_tokenizer: Any
) -> None:
    prompt = prompt_ids(engine_tokenizer, "Hold on.")
    limit = long_tokens(engine)

    async def go() -> tuple[GenerateResult, float]:
        async with SGLangClient(engine.url) as client:
            task = asyncio.create_task(
                client.generate(prompt, SamplingParams(max_new_tokens=limit, ignore_eos=True))
            )
            await asyncio.sleep(0.3)
            await client.pause_generation("in_place")
            try:
                paused_at = time.monotonic()
                await asyncio.sleep(1.5)
                assert not task.done(), "a request must be held while paused in place"
            finally:
                await client.continue_generation()
            result = await asyncio.wait_for(task, 60)
            return result, time.monotonic() - paused_at

    result, elapsed = run(go())
    assert result.finish_reason.type == "length" and len(result.output_ids) == limit
    assert elapsed >= 1.5


def test_pause_abort_aborts_running_and_holds_new_requests(
    engine: EngineUnderTest, engine_tokenizer: Any
) -> None:
    prompt = prompt_ids(engine_tokenizer, "Stop now.")

    async def go() -> tuple[GenerateResult, GenerateResult]:
        async with SGLangClient(engine.url) as client:
            running = asyncio.create_task(
                client.generate(
                    prompt, SamplingParams(max_new_tokens=long_tokens(engine), ignore_eos=True)
                )
            )
            await asyncio.sleep(0.3)
            await client.pause_generation("abort")
            try:
                aborted = await asyncio.wait_for(running, 30)
                waiting = asyncio.create_task(
                    client.generate(prompt, SamplingParams(max_new_tokens=3, ignore_eos=True))
                )
                await asyncio.sleep(1.0)
                assert not waiting.done(), "new requests wait while generation is paused"
            finally:
                await client.continue_generation()
            return aborted, await asyncio.wait_for(waiting, 30)

    aborted, later = run(go())
    assert aborted.aborted
    assert later.finish_reason.type == "length" and len(later.output_ids) == 3


def test_update_weights_from_disk_sets_the_weight_version(
    engine: EngineUnderTest, engine_tokenizer: Any
) -> None:
    version = f"contract-{uuid.uuid4().hex[:8]}"
    prompt = prompt_ids(engine_tokenizer, "Version?")

    async def go() -> tuple[Any, str | None, GenerateResult]:
        async with SGLangClient(engine.url) as client:
            update = await client.update_weights_from_disk(str(engine.model_dir), version)
            reported = await client.get_weight_version()
            result = await client.generate(
                prompt, SamplingParams(max_new_tokens=2, ignore_eos=True)
            )
            return update, reported, result

    update, reported, result = run(go())
    assert update.success is True
    assert reported == version
    assert result.weight_version == version


def test_update_weights_from_a_missing_path_is_refused(engine: EngineUnderTest) -> None:
    async def go() -> None:
        async with SGLangClient(engine.url) as client:
            await client.update_weights_from_disk("/nonexistent/swerl-checkpoint", "never")

    with pytest.raises(EngineRequestError) as err:
        run(go())
    assert err.value.status == 400


def test_health_model_info_and_flush(engine: EngineUnderTest) -> None:
    async def go() -> tuple[bool, Any, bool, int]:
        async with SGLangClient(engine.url) as client:
            return (
                await client.health(),
                await client.model_info(),
                await client.flush_cache(),
                await client.tp_size(),  # the ranks it takes in a weight-update group
            )

    healthy, info, flushed, tp_size = run(go())
    assert healthy is True
    assert info.is_generation is True and info.model_path
    assert isinstance(info.weight_version, str)
    assert flushed is True
    assert isinstance(tp_size, int) and tp_size >= 1


def test_top_logprobs_and_constrained_decoding(
    engine: EngineUnderTest, engine_tokenizer: Any
) -> None:
    prompt = prompt_ids(engine_tokenizer, "Pick a token.")
    greedy = SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True)

    async def top() -> GenerateResult:
        async with SGLangClient(engine.url) as client:
            return await client.generate(prompt, greedy, top_logprobs_num=3)

    result = run(top())
    assert result.output_top_logprobs is not None
    assert len(result.output_top_logprobs) == len(result.output_ids) == 5
    for row, token, logprob in zip(
        result.output_top_logprobs, result.output_ids, result.output_logprobs, strict=True
    ):
        assert len(row) == 3 and [lp for lp, _ in row] == sorted(
            (lp for lp, _ in row), reverse=True
        )
        assert row[0][1] == token and abs(row[0][0] - logprob) <= 1e-4  # greedy: the top-1

    constrained = SamplingParams(max_new_tokens=16, json_schema='{"type": "object"}')

    async def json_object() -> GenerateResult:
        async with SGLangClient(engine.url) as client:
            return await client.generate(prompt, constrained)

    if engine.is_reference:  # no grammar backend: refused, naming the field it received
        with pytest.raises(EngineRequestError, match="json_schema") as err:
            run(json_object())
        assert err.value.status == 400
    else:
        assert run(json_object()).text.lstrip().startswith("{")


def test_bad_requests_are_4xx(engine: EngineUnderTest, engine_tokenizer: Any) -> None:
    context = 4096 if engine.is_reference else 1_000_000

    async def go(ids: list[int], sampling: SamplingParams) -> GenerateResult:
        async with SGLangClient(engine.url) as client:
            return await client.generate(ids, sampling)

    with pytest.raises(EngineRequestError) as err:
        run(go([1, 2, len(engine_tokenizer) + 10_000], SamplingParams(max_new_tokens=1)))
    assert 400 <= err.value.status < 500
    if engine.is_reference:
        with pytest.raises(
            EngineRequestError, match="longer than the model's context length"
        ) as err:
            run(go([1] * context, SamplingParams(max_new_tokens=1)))
        assert err.value.status == 400
    malformed = httpx.post(engine.url + "/generate", json={"input_ids": "not a list"}, timeout=30)
    assert 400 <= malformed.status_code < 500


def test_unreachable_engine_is_unavailable() -> None:
    url = f"http://127.0.0.1:{free_port()}"

    async def go() -> tuple[bool, EngineUnavailableError]:
        async with SGLangClient(url, connect_timeout=2.0) as client:
            healthy = await client.health()
            try:
                await client.generate([1, 2, 3], SamplingParams(max_new_tokens=1))
            except EngineUnavailableError as exc:
                return healthy, exc
            raise AssertionError("generate against a closed port must fail")

    healthy, error = run(go())
    assert healthy is False
    assert error.tokens_produced is False and error.status is None
