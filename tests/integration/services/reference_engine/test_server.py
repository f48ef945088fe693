"""Reference engine specifics: logprob fidelity, batching, streaming, weights, scripted mode."""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from adapter.engines.sglang import EngineRequestError, GenerateResult, SamplingParams, SGLangClient
from services.reference_engine.server import build_state, parse_args
from tests.support.engines import (
    ThreadedReferenceServer,
    reference_server_in_thread,
    start_reference_server,
    tiny_model_for_session,
)

# A generation still running ~0.5 s after it starts (the in-thread engine decodes ~1000
# tokens/s on a quiet machine; a few hundred could finish before the pause); inside the
# engine's 4096-token context.
LONG = 2000

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "execute_bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def seed1_dir() -> Iterator[Path]:
    with tiny_model_for_session(seed=1) as path:
        yield path


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def wait_for_info(url: str, ready: Any, timeout_s: float = 10.0) -> dict[str, Any]:
    """``/server_info`` once ``ready(info)`` holds (polled)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=10) as http:
        while True:
            info = (await http.get(url + "/server_info")).json()
            if ready(info):
                return dict(info)
            assert time.monotonic() < deadline, f"server_info never ready: {info}"
            await asyncio.sleep(0.02)


def chat_prompt(tokenizer: Any, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": text}],
        tools=TOOLS,
        tokenize=False,
        add_generation_prompt=True,
    )
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def forward_logprobs(model: Any, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(torch.tensor([tokens])).logits[0].float()
    if temperature > 1e-6:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def assert_fidelity(
    model: Any, prompt: list[int], result: GenerateResult, temperature: float
) -> None:
    """Every reported logprob equals a plain forward pass over prompt + outputs (<= 1e-5)."""
    rows = forward_logprobs(model, prompt + result.output_ids, temperature)
    assert len(result.output_logprobs) == len(result.output_ids) > 0
    worst = 0.0
    for i, (token, reported) in enumerate(
        zip(result.output_ids, result.output_logprobs, strict=True)
    ):
        worst = max(worst, abs(rows[len(prompt) - 1 + i, token].item() - reported))
    assert worst <= 1e-5, f"max logprob error {worst}"


# ------------------------------------------------------------------------------ fidelity


@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.0])
def test_multi_turn_logprobs_match_a_plain_forward_pass(
    reference_server: ThreadedReferenceServer, tokenizer: Any, hf_model: Any, temperature: float
) -> None:

    first_prompt = chat_prompt(tokenizer, f"Fix the bug (temperature {temperature}).")
    observation = tokenizer(
        "\n<|im_start|>user\n<tool_response>\nfile.py\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )["input_ids"]
    sampling = SamplingParams(
        max_new_tokens=20, temperature=temperature, ignore_eos=True, sampling_seed=11
    )

    async def go() -> tuple[GenerateResult, list[int], GenerateResult]:
        async with SGLangClient(reference_server.url) as client:
            first = await client.generate(first_prompt, sampling)
            second_prompt = first_prompt + first.output_ids + list(observation)
            second = await client.generate(second_prompt, sampling)
            return first, second_prompt, second

    first, second_prompt, second = run(go())
    assert_fidelity(hf_model, first_prompt, first, temperature)
    assert_fidelity(hf_model, second_prompt, second, temperature)
    # The second turn reused the first turn's KV cache (prompt + generated tokens).
    assert second.cached_tokens >= len(first_prompt)


def test_concurrent_sampled_requests_match_forward_and_sequential_runs(
    reference_server: ThreadedReferenceServer, tokenizer: Any, hf_model: Any
) -> None:
    prompts = [chat_prompt(tokenizer, "item " * (5 * i + 1) + uuid.uuid4().hex) for i in range(8)]
    samplings = [
        SamplingParams(
            max_new_tokens=6 + 2 * i, temperature=1.0, ignore_eos=True, sampling_seed=100 + i
        )
        for i in range(8)
    ]

    async def go() -> tuple[list[GenerateResult], list[GenerateResult]]:
        async with SGLangClient(reference_server.url) as client:
            together = await asyncio.gather(
                *(client.generate(p, s) for p, s in zip(prompts, samplings, strict=True))
            )
            alone = [await client.generate(p, s) for p, s in zip(prompts, samplings, strict=True)]
            return list(together), alone

    together, alone = run(go())
    for prompt, result in zip(prompts, together, strict=True):
        assert_fidelity(hf_model, prompt, result, 1.0)
    assert [r.output_ids for r in together] == [r.output_ids for r in alone]
    assert len({r.rid for r in together}) == 8


def test_input_and_top_logprobs(
    reference_server: ThreadedReferenceServer, tokenizer: Any, hf_model: Any
) -> None:
    prompt = chat_prompt(tokenizer, "logprobs please")
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 3,
    }
    meta = httpx.post(reference_server.url + "/generate", json=body, timeout=60).json()["meta_info"]
    rows = forward_logprobs(hf_model, prompt)
    inputs = meta["input_token_logprobs"]
    assert len(inputs) == len(prompt) and inputs[0] == [None, prompt[0], None]
    for position in range(1, len(prompt)):
        value, token, _ = inputs[position]
        assert token == prompt[position]
        assert abs(value - rows[position - 1, token].item()) <= 1e-5
    for top, (chosen_lp, chosen, _) in zip(
        meta["output_top_logprobs"], meta["output_token_logprobs"], strict=True
    ):
        assert len(top) == 3
        assert top[0][0] >= top[1][0] >= top[2][0]
        assert top[0][1] == chosen and abs(top[0][0] - chosen_lp) <= 1e-6  # greedy picks the top-1
    plain = httpx.post(
        reference_server.url + "/generate",
        json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 2}},
        timeout=60,
    ).json()
    assert "output_token_logprobs" not in plain["meta_info"]


def test_top_logprobs_carry_token_text_when_asked(
    reference_server: ThreadedReferenceServer, tokenizer: Any
) -> None:
    """SGLang's shape: with return_text_in_logprobs every top entry is [logprob, id, text]."""
    body = {
        "input_ids": chat_prompt(tokenizer, "text please"),
        "sampling_params": {"max_new_tokens": 3, "temperature": 0.0},
        "return_logprob": True,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
    }
    meta = httpx.post(reference_server.url + "/generate", json=body, timeout=60).json()["meta_info"]
    assert len(meta["output_top_logprobs"]) == 3
    for row in meta["output_top_logprobs"]:
        assert len(row) == 2
        for _, token, text in row:
            assert text == tokenizer.decode([token])


# ------------------------------------------------------------------------------ wire format


def test_streaming_sends_cumulative_sse_chunks(
    reference_server: ThreadedReferenceServer, tokenizer: Any
) -> None:
    body = {
        "input_ids": chat_prompt(tokenizer, "stream"),
        "sampling_params": {"max_new_tokens": 5, "ignore_eos": True},
        "return_logprob": True,
        "stream": True,
    }
    events = []
    with httpx.stream(
        "POST", reference_server.url + "/generate", json=body, timeout=60
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line:
                assert line.startswith("data: ")
                events.append(line[len("data: ") :])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    for earlier, later in itertools.pairwise(chunks):
        assert later["output_ids"][: len(earlier["output_ids"])] == earlier["output_ids"]
    assert [e[1] for e in chunks[-1]["meta_info"]["output_token_logprobs"]] == chunks[-1][
        "output_ids"
    ]


def test_batch_and_text_inputs(reference_server: ThreadedReferenceServer, tokenizer: Any) -> None:
    a, b = chat_prompt(tokenizer, "first"), chat_prompt(tokenizer, "second one")
    answer = httpx.post(
        reference_server.url + "/generate",
        json={
            "input_ids": [a, b],
            "rid": ["batch-a", "batch-b"],
            "sampling_params": {"max_new_tokens": 2},
        },
        timeout=60,
    )
    assert answer.status_code == 200
    outputs = answer.json()
    assert [o["meta_info"]["id"] for o in outputs] == ["batch-a", "batch-b"]
    assert [o["meta_info"]["prompt_tokens"] for o in outputs] == [len(a), len(b)]
    text = "def f(x): return x"
    single = httpx.post(
        reference_server.url + "/generate",
        json={"text": text, "sampling_params": {"max_new_tokens": 1}},
        timeout=60,
    ).json()
    assert single["meta_info"]["prompt_tokens"] == len(
        tokenizer.encode(text, add_special_tokens=False)
    )


def test_max_new_tokens_zero_finishes_immediately(
    reference_server: ThreadedReferenceServer,
) -> None:
    out = httpx.post(
        reference_server.url + "/generate",
        json={
            "input_ids": [1, 2, 3],
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
        },
        timeout=60,
    ).json()
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"] == {
        "type": "length",
        "length": 0,
    }


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"input_ids": [1], "sampling_params": {"best_of": 3}}, "Unknown sampling parameter"),
        ({"input_ids": [1], "sampling_params": {"frequency_penalty": 0.5}}, "not supported"),
        ({"input_ids": [1], "sampling_params": {"top_k": 0}}, "top_k"),
        ({"input_ids": [1], "sampling_params": {"temperature": -1}}, "temperature"),
        ({"input_ids": [1], "text": "x"}, "exactly one"),
        ({"sampling_params": {}}, "exactly one"),
        ({"input_ids": []}, "must not be empty"),
        ({"input_ids": [[1], [2]], "stream": True}, "stream is not supported for batch"),
        ({"input_ids": [[1], [2]], "rid": ["only-one"]}, "rid has 1 entries"),
        ({"input_ids": [1], "top_logprobs_num": -1}, "top_logprobs_num"),
        (
            {"input_ids": [1] * 10, "sampling_params": {"max_new_tokens": 5000}},
            "exceeds the model's maximum",
        ),
        ({"input_ids": [-1]}, "outside the vocabulary"),
    ],
)
def test_semantic_errors_are_400_with_sglang_error_shape(
    reference_server: ThreadedReferenceServer, body: dict[str, Any], needle: str
) -> None:
    answer = httpx.post(reference_server.url + "/generate", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert needle in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/pause_generation", {"mode": "sideways"}),
        ("/abort_request", {"rid": ["a", "b"]}),
        ("/update_weights_from_disk", {"weight_version": "v"}),
        ("/continue_generation", [1, 2]),
        ("/generate", {"input_ids": [1.5]}),
    ],
)
def test_malformed_bodies_are_422(
    reference_server: ThreadedReferenceServer, path: str, body: Any
) -> None:
    assert httpx.post(reference_server.url + path, json=body, timeout=30).status_code == 422


def test_duplicate_running_rid_is_rejected(
    reference_server: ThreadedReferenceServer, tokenizer: Any
) -> None:
    rid = f"dup-{uuid.uuid4().hex}"
    prompt = chat_prompt(tokenizer, "duplicate")

    async def go() -> tuple[EngineRequestError, GenerateResult]:
        async with SGLangClient(reference_server.url) as client:
            task = asyncio.create_task(
                client.generate(
                    prompt, SamplingParams(max_new_tokens=LONG, ignore_eos=True), rid=rid
                )
            )
            await asyncio.sleep(0.3)
            try:
                await client.generate(prompt, SamplingParams(max_new_tokens=1), rid=rid)
            except EngineRequestError as exc:
                error = exc
            else:
                raise AssertionError("a duplicate rid must be refused")
            await client.abort_request(rid)
            return error, await task

    error, first = run(go())
    assert error.status == 400 and "Duplicate request ID" in error.detail
    assert first.aborted


def test_client_disconnect_aborts_the_request(
    reference_server: ThreadedReferenceServer, tokenizer: Any
) -> None:
    limit = 3800
    body = {
        "input_ids": chat_prompt(tokenizer, "disconnect"),
        "sampling_params": {"max_new_tokens": limit, "ignore_eos": True},
    }
    before = httpx.get(reference_server.url + "/server_info", timeout=10).json()["decoded_tokens"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(reference_server.url + "/generate", json=body, timeout=0.5)
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        info = httpx.get(reference_server.url + "/server_info", timeout=10).json()
        if info["num_running_reqs"] + info["num_waiting_reqs"] == 0:
            break
        time.sleep(0.2)
    assert info["num_running_reqs"] + info["num_waiting_reqs"] == 0
    assert info["decoded_tokens"] - before < limit, "the abandoned request must be aborted"


def test_info_endpoints(reference_server: ThreadedReferenceServer) -> None:
    info = httpx.get(reference_server.url + "/model_info", timeout=10).json()
    assert info["scripted"] is False and info["engine"] == "swerl-reference"
    assert info["architectures"] == ["Qwen3ForCausalLM"] and info["context_length"] == 4096
    assert (
        httpx.get(reference_server.url + "/get_model_info", timeout=10).json()["model_path"]
        == info["model_path"]
    )
    version = httpx.get(reference_server.url + "/get_weight_version", timeout=10).json()
    assert version == {"weight_version": info["weight_version"]}
    assert httpx.get(reference_server.url + "/health_generate", timeout=30).status_code == 200
    load = httpx.get(reference_server.url + "/get_load", timeout=10).json()
    assert load[0]["num_reqs"] >= 0
    flushed = httpx.get(reference_server.url + "/flush_cache", timeout=10)
    assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")
    # SGLang 0.5.23 serves both (the latter deprecated), with tp_size.
    for path in ("/server_info", "/get_server_info"):
        server_info = httpx.get(reference_server.url + path, timeout=10)
        assert server_info.status_code == 200 and server_info.json()["tp_size"] == 1


# ------------------------------------------------------------------------------ weights


@pytest.fixture(scope="module")
def weights_server(tiny_model_dir: Path) -> Iterator[ThreadedReferenceServer]:
    with reference_server_in_thread(
        tiny_model_dir, weight_version="w0", extra_args=["--seed", "1"]
    ) as server:
        yield server


def test_update_weights_changes_outputs_versions_and_logprobs(
    weights_server: ThreadedReferenceServer, tiny_model_dir: Path, seed1_dir: Path, tokenizer: Any
) -> None:
    from transformers import AutoModelForCausalLM

    seed1_model = AutoModelForCausalLM.from_pretrained(str(seed1_dir), dtype=torch.float32).eval()
    prompt = chat_prompt(tokenizer, "weights")
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)

    async def go() -> tuple[GenerateResult, GenerateResult, str | None, GenerateResult]:
        async with SGLangClient(weights_server.url) as client:
            before = await client.generate(prompt, greedy)
            await client.update_weights_from_disk(str(seed1_dir), "w1")
            after = await client.generate(prompt, greedy)
            version = await client.get_weight_version()
            await client.update_weights_from_disk(str(tiny_model_dir), "w2")
            restored = await client.generate(prompt, greedy)
            return before, after, version, restored

    before, after, version, restored = run(go())
    assert before.weight_version == "w0" and after.weight_version == "w1" and version == "w1"
    # (Greedy ids of a random tied-embedding model mostly repeat the last token; compare logprobs.)
    assert (
        max(abs(a - b) for a, b in zip(after.output_logprobs, before.output_logprobs, strict=False))
        > 1e-3
    )
    assert_fidelity(seed1_model, prompt, after, 0.0)
    assert restored.output_ids == before.output_ids and restored.weight_version == "w2"
    assert restored.output_logprobs == pytest.approx(before.output_logprobs, abs=1e-6)


def test_update_waits_for_running_requests_and_holds_new_ones(
    weights_server: ThreadedReferenceServer, tiny_model_dir: Path, tokenizer: Any
) -> None:
    """SGLang's writer lock: the update waits for the request in flight; a request sent while
    it waits is held outside the scheduler (not queued) and runs on the new weights."""
    prompt = chat_prompt(tokenizer, "long running")

    async def go() -> dict[str, Any]:
        async with SGLangClient(weights_server.url) as client:
            old = await client.get_weight_version()
            done: dict[str, float] = {}

            async def timed(name: str, coro: Any) -> Any:
                result = await coro
                done[name] = time.time()
                return result

            sent = time.time()
            running = asyncio.create_task(
                timed(
                    "running",
                    client.generate(prompt, SamplingParams(max_new_tokens=LONG, ignore_eos=True)),
                )
            )
            await asyncio.sleep(0.3)
            update = asyncio.create_task(
                timed("update", client.update_weights_from_disk(str(tiny_model_dir), "w-wait"))
            )
            await asyncio.sleep(0.2)
            late = asyncio.create_task(
                timed("late", client.generate(prompt, SamplingParams(max_new_tokens=2)))
            )
            held = await wait_for_info(weights_server.url, lambda i: i["num_held_reqs"] == 1)
            results = await asyncio.gather(running, update, late)
            return {
                "old": old,
                "sent": sent,
                "held": held,
                "running": results[0],
                "late": results[2],
                "done": done,
            }

    out = run(go())
    assert out["running"].finish_reason.type == "length", "nothing in flight is aborted"
    assert out["running"].weight_version == out["old"]
    assert out["held"]["num_running_reqs"] == 1 and out["held"]["num_waiting_reqs"] == 0
    assert out["late"].weight_version == "w-wait"
    # The update answered after the running request finished on the engine (the engine's
    # clock and this one are the same machine's: sent + engine latency <= its finish time).
    assert out["done"]["update"] >= out["sent"] + out["running"].engine_latency_s


def test_update_while_paused_in_place_applies_at_once(
    weights_server: ThreadedReferenceServer, tiny_model_dir: Path, tokenizer: Any
) -> None:
    """Paused, SGLang takes no writer lock: the load applies at once, under the request held in
    place (which then finishes on the new version). Without ``flush_cache``: the request still
    running would refuse the flush and fail the call (test_sglang_semantics.py).
    ``num_paused_requests`` is 0, as SGLang's scheduler answers."""
    prompt = chat_prompt(tokenizer, "paused update")
    load = {"model_path": str(tiny_model_dir), "weight_version": "w-paused", "flush_cache": False}

    async def go() -> tuple[httpx.Response, bool, GenerateResult]:
        async with SGLangClient(weights_server.url) as client:
            running = asyncio.create_task(
                client.generate(prompt, SamplingParams(max_new_tokens=LONG, ignore_eos=True))
            )
            await asyncio.sleep(0.3)
            await client.pause_generation("in_place")
            try:
                async with httpx.AsyncClient(timeout=10) as http:
                    update = await http.post(
                        weights_server.url + "/update_weights_from_disk", json=load
                    )
                held = not running.done()
            finally:
                await client.continue_generation()
            return update, held, await running

    update, held, result = run(go())
    assert update.status_code == 200 and held
    assert update.json() == {
        "success": True,
        "message": "Succeeded to update model weights. Weight version updated to w-paused.",
        "num_paused_requests": 0,
    }
    assert result.finish_reason.type == "length" and result.weight_version == "w-paused"


def test_pause_in_abort_mode_returns_partial_outputs_and_holds_new_requests(
    weights_server: ThreadedReferenceServer, tiny_model_dir: Path, tokenizer: Any
) -> None:
    """SGLang's ``/pause_generation {"mode": "abort"}``: each running request returns what it
    produced, with its logprobs and an abort finish reason; requests sent while paused wait for
    ``/continue_generation`` and then run on the weights loaded meanwhile."""
    prompt = chat_prompt(tokenizer, "pause abort")

    async def go() -> tuple[GenerateResult, bool, GenerateResult]:
        async with SGLangClient(weights_server.url) as client:
            params = SamplingParams(max_new_tokens=LONG, ignore_eos=True)
            running = asyncio.create_task(client.generate(prompt, params))
            await asyncio.sleep(0.3)
            await client.pause_generation("abort")
            partial = await asyncio.wait_for(running, 10)  # returned by the pause itself
            late = asyncio.create_task(client.generate(prompt, SamplingParams(max_new_tokens=3)))
            try:
                await client.update_weights_from_disk(str(tiny_model_dir), "w-pause-abort")
                await asyncio.sleep(0.2)
                held = not late.done()
            finally:
                await client.continue_generation()
            return partial, held, await late

    partial, held, late = run(go())
    assert partial.aborted and 0 < len(partial.output_ids) < LONG
    assert len(partial.output_logprobs) == len(partial.output_ids)
    assert all(lp <= 0 for lp in partial.output_logprobs)
    assert held and late.finish_reason.type == "length"
    assert late.weight_version == "w-pause-abort"


def test_update_with_abort_all_and_refused_updates(
    weights_server: ThreadedReferenceServer, tiny_model_dir: Path, scratch: Path, tokenizer: Any
) -> None:
    from safetensors.torch import save_file

    save_file({"model.norm.weight": torch.ones(7)}, str(scratch / "model.safetensors"))
    prompt = chat_prompt(tokenizer, "abort all")

    async def go() -> tuple[GenerateResult, EngineRequestError, str | None]:
        async with SGLangClient(weights_server.url) as client:
            running = asyncio.create_task(
                client.generate(prompt, SamplingParams(max_new_tokens=LONG, ignore_eos=True))
            )
            await asyncio.sleep(0.3)
            await client.update_weights_from_disk(
                str(tiny_model_dir), "w-abort", abort_all_requests=True
            )
            aborted = await running
            try:
                await client.update_weights_from_disk(str(scratch), "w-bad")
            except EngineRequestError as exc:
                return aborted, exc, await client.get_weight_version()
            raise AssertionError("mismatched weights must be refused")

    aborted, error, version = run(go())
    assert aborted.aborted
    assert error.status == 400 and "do not fit" in error.detail
    assert version == "w-abort"


# ------------------------------------------------------------------------------ scripted mode


SCRIPTS = [
    {
        "match": "TASK-A",
        "turns": [
            "Looking.\n<tool_call>\n"
            '{"name": "execute_bash", "arguments": {"command": "ls"}}\n</tool_call>',
            "All done for A.",
        ],
    },
    {"match": "TASK-B", "turns": ["B only has one turn."]},
]


@pytest.fixture(scope="module")
def scripted_server(tiny_model_dir: Path) -> Iterator[ThreadedReferenceServer]:
    with tempfile.TemporaryDirectory(prefix="swerl-script-") as directory:
        path = Path(directory) / "script.jsonl"
        path.write_text("\n".join(json.dumps(s) for s in SCRIPTS) + "\n")
        with reference_server_in_thread(tiny_model_dir, script=path) as server:
            yield server


def test_scripted_mode_replays_outputs_with_real_logprobs(
    scripted_server: ThreadedReferenceServer, tokenizer: Any, hf_model: Any
) -> None:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt_a = chat_prompt(tokenizer, "Please solve TASK-A.")
    prompt_b = chat_prompt(tokenizer, "Please solve TASK-B.")
    sampling = SamplingParams(max_new_tokens=200, temperature=1.0)

    async def go() -> tuple[GenerateResult, GenerateResult, list[int], GenerateResult]:
        async with SGLangClient(scripted_server.url) as client:
            first_a, first_b = await asyncio.gather(
                client.generate(prompt_a, sampling), client.generate(prompt_b, sampling)
            )
            follow = tokenizer(
                "\n<|im_start|>user\n<tool_response>\nfile.py\n</tool_response><|im_end|>\n"
                "<|im_start|>assistant\n",
                add_special_tokens=False,
            )["input_ids"]
            prompt_a2 = prompt_a + first_a.output_ids + list(follow)
            second_a = await client.generate(prompt_a2, sampling)
            return first_a, first_b, prompt_a2, second_a

    first_a, first_b, prompt_a2, second_a = run(go())
    for result, text in [
        (first_a, SCRIPTS[0]["turns"][0]),
        (first_b, SCRIPTS[1]["turns"][0]),
        (second_a, SCRIPTS[0]["turns"][1]),
    ]:
        assert result.output_ids == [*tokenizer.encode(text, add_special_tokens=False), eos]
        assert result.text == text
        assert result.finish_reason.type == "stop" and result.finish_reason.matched == eos
    assert_fidelity(hf_model, prompt_a, first_a, 1.0)
    assert_fidelity(hf_model, prompt_a2, second_a, 1.0)


def test_scripted_mode_is_labelled_and_refuses_unscripted_prompts(
    scripted_server: ThreadedReferenceServer, tokenizer: Any
) -> None:
    info = httpx.get(scripted_server.url + "/model_info", timeout=10).json()
    assert info["scripted"] is True and info["engine"] == "swerl-reference-scripted"
    out = httpx.post(
        scripted_server.url + "/generate",
        json={
            "input_ids": chat_prompt(tokenizer, "TASK-B"),
            "sampling_params": {"max_new_tokens": 3},
        },
        timeout=30,
    ).json()
    assert out["meta_info"]["scripted"] is True
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    refused = httpx.post(
        scripted_server.url + "/generate",
        json={"input_ids": chat_prompt(tokenizer, "TASK-Z")},
        timeout=30,
    )
    assert refused.status_code == 400 and "no script" in refused.json()["error"]["message"]


# ------------------------------------------------------------------------------ CLI


def test_cli_rejects_bad_arguments(scratch: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--model", str(tiny_model_dir), "--port", "0"])
    with pytest.raises(SystemExit, match=r"no config\.json"):
        build_state(parse_args(["--model", str(scratch), "--port", "1234"]))
    bad_script = scratch / "bad.jsonl"
    bad_script.write_text("{oops\n")
    with pytest.raises(SystemExit, match="not valid JSON"):
        build_state(
            parse_args(
                ["--model", str(tiny_model_dir), "--port", "1234", "--script", str(bad_script)]
            )
        )


def test_cli_subprocess_serves(tiny_model_dir: Path, scratch: Path, tokenizer: Any) -> None:
    """``python -m services.reference_engine.server`` starts, serves and shuts down cleanly."""
    with start_reference_server(tiny_model_dir, weight_version="cli-v0", log_dir=scratch) as server:
        out = httpx.post(
            server.url + "/generate",
            json={
                "input_ids": chat_prompt(tokenizer, "cli"),
                "sampling_params": {"max_new_tokens": 2},
            },
            timeout=60,
        ).json()
        assert out["meta_info"]["weight_version"] == "cli-v0" and len(out["output_ids"]) == 2
    assert server.process.returncode is not None
