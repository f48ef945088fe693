"""The reference engine behaves as SGLang 0.5.23 in what a weight refresh meets: the
weight-update session, bucket-by-bucket distributed loading, a flush refused while requests
are busy, the answer of a request aborted while queued, and ``/get_weights_by_name``.

Each test serves its own in-thread reference engine (``--max-running-requests 1``, so a second
request waits in the scheduler's queue; ``--get-weights-by-name always`` to read weights back).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from services.reference_engine.distributed_weights import GROUP_DESTROYED, GROUP_MISSING
from services.reference_engine.engine import FLUSH_BUSY_MESSAGE
from services.reference_engine.weight_session import (
    ALREADY_OPEN,
    DISTRIBUTED_OUTSIDE,
    NOT_OPEN,
)
from services.weight_group import WeightGroup, join_group, open_store
from tests.support.engines import (
    ThreadedReferenceServer,
    reference_server_in_thread,
    tiny_model_for_session,
)

pytestmark = pytest.mark.slow

LONG = 2000  # decodes for seconds (~1000 tokens/s)
PROBE = "model.layers.0.self_attn.q_proj.weight"  # differs between the seed-0 and seed-1 models
LAYERNORM = "model.layers.0.input_layernorm.weight"
# What _handle_abort_req answers for a queued request with return_logprob and top logprobs.
QUEUED_ABORT_KEYS = [
    "id",
    "finish_reason",
    "weight_version",
    "e2e_latency",
    "input_token_logprobs",
    "output_token_logprobs",
    "output_token_logprobs_length",
    "input_top_logprobs",
    "output_top_logprobs",
    "completion_tokens",
]


@pytest.fixture
def server(tiny_model_dir: Path) -> Iterator[ThreadedReferenceServer]:
    extra = ["--max-running-requests", "1", "--get-weights-by-name", "always", "--seed", "0"]
    with reference_server_in_thread(tiny_model_dir, weight_version="s0", extra_args=extra) as s:
        yield s


@pytest.fixture(scope="module")
def seed1_dir() -> Iterator[Path]:
    with tiny_model_for_session(seed=1) as path:
        yield path


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def body(rid: str, max_new_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "input_ids": [1, 2, 3, 4],
        "rid": rid,
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True},
        **extra,
    }


async def wait_for(http: httpx.AsyncClient, url: str, ready: Callable[[Any], bool]) -> Any:
    """``/server_info`` once ``ready(info)`` holds."""
    deadline = time.monotonic() + 20
    while True:
        info = (await http.get(url + "/server_info")).json()
        if ready(info):
            return info
        assert time.monotonic() < deadline, f"never ready: {info}"
        await asyncio.sleep(0.02)


def weights(url: str, name: str, size: int = 1) -> Any:
    answer = httpx.post(url + "/get_weights_by_name", json={"name": name, "truncate_size": size})
    assert answer.status_code == 200, answer.text
    return answer.json()


def version(url: str) -> str:
    return str(httpx.get(url + "/model_info", timeout=10).json()["weight_version"])


# ------------------------------------------------------------------------ queued aborts


def test_a_request_aborted_while_queued_answers_without_prompt_or_cached_tokens(
    server: ThreadedReferenceServer,
) -> None:
    """A queued request (never prefilled) aborted by ``/abort_request``, by ``abort_all`` or by
    ``/pause_generation`` (abort) answers as ``_handle_abort_req`` builds it; a running one
    keeps the full ``meta_info``."""
    url = server.url
    logprobs = {"return_logprob": True, "top_logprobs_num": 2}

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=60) as http:
            out: dict[str, Any] = {}

            async def send(rid: str, n: int, **extra: Any) -> asyncio.Task[Any]:
                task = asyncio.create_task(http.post(url + "/generate", json=body(rid, n, **extra)))
                await asyncio.sleep(0)
                return task

            running = await send("run-1", LONG)
            await wait_for(http, url, lambda i: i["num_running_reqs"] == 1)
            queued = await send("queued-1", 5, **logprobs)
            await wait_for(http, url, lambda i: i["num_waiting_reqs"] == 1)
            await http.post(url + "/abort_request", json={"rid": "queued-1"})
            out["by_rid"] = (await queued).json()
            queued = await send("queued-2", 5)
            await wait_for(http, url, lambda i: i["num_waiting_reqs"] == 1)
            await http.post(url + "/abort_request", json={"abort_all": True})
            out["abort_all"], out["running"] = (await queued).json(), (await running).json()
            running = await send("run-3", LONG)
            await wait_for(http, url, lambda i: i["num_running_reqs"] == 1)
            queued = await send("queued-3", 5, **logprobs)
            await wait_for(http, url, lambda i: i["num_waiting_reqs"] == 1)
            await http.post(url + "/pause_generation", json={"mode": "abort"})
            out["pause"], out["paused_running"] = (await queued).json(), (await running).json()
            await http.post(url + "/continue_generation", json={})
            return out

    out = run(go())
    for key, rid in [("by_rid", "queued-1"), ("pause", "queued-3")]:
        answer = out[key]
        assert answer["text"] == "" and answer["output_ids"] == []
        meta = answer["meta_info"]
        assert list(meta) == QUEUED_ABORT_KEYS, key
        assert meta["id"] == rid and meta["weight_version"] == "s0"
        assert meta["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
        assert meta["input_token_logprobs"] == meta["output_token_logprobs"] == []
        assert meta["output_token_logprobs_length"] == meta["completion_tokens"] == 0
        assert meta["input_top_logprobs"] == meta["output_top_logprobs"] == []
    plain = out["abort_all"]["meta_info"]
    assert list(plain) == [
        "id",
        "finish_reason",
        "weight_version",
        "e2e_latency",
        "completion_tokens",
    ]
    for key in ("running", "paused_running"):  # aborted after its prefill: the full answer
        meta = out[key]["meta_info"]
        assert meta["finish_reason"]["type"] == "abort"
        assert meta["prompt_tokens"] == 4 and "cached_tokens" in meta
        assert meta["completion_tokens"] == len(out[key]["output_ids"]) > 0


def test_requests_held_by_a_pause_are_not_in_the_scheduler(server: ThreadedReferenceServer) -> None:
    """SGLang holds a request sent while paused in its tokenizer manager: ``abort_all`` (a
    scheduler message) does not reach it, and it runs after ``/continue_generation``."""
    url = server.url

    async def go() -> tuple[Any, Any]:
        async with httpx.AsyncClient(timeout=60) as http:
            await http.post(url + "/pause_generation", json={"mode": "abort"})
            held = asyncio.create_task(http.post(url + "/generate", json=body("held-1", 3)))
            info = await wait_for(http, url, lambda i: i["num_held_reqs"] == 1)
            await http.post(url + "/abort_request", json={"abort_all": True})
            await http.post(url + "/abort_request", json={"rid": "held-1"})
            await asyncio.sleep(0.3)
            assert not held.done()
            await http.post(url + "/continue_generation", json={})
            return info, (await held).json()

    info, answer = run(go())
    assert info["num_waiting_reqs"] == 0 and info["num_running_reqs"] == 0
    assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": 3}


# ------------------------------------------------------------------------ flush_cache


def test_flush_cache_is_refused_while_busy_waits_with_a_timeout_and_ignores_a_paused_queue(
    server: ThreadedReferenceServer,
) -> None:
    url = server.url

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=60) as http:
            out: dict[str, Any] = {}
            running = asyncio.create_task(http.post(url + "/generate", json=body("f-run", 400)))
            await wait_for(http, url, lambda i: i["num_running_reqs"] == 1)
            out["busy"] = await http.post(url + "/flush_cache")
            out["short"] = await http.post(url + "/flush_cache", params={"timeout": 0.05})
            out["negative"] = await http.post(url + "/flush_cache", params={"timeout": -1})
            out["waited"] = await http.post(url + "/flush_cache", params={"timeout": 60})
            out["waited_for"] = (await running).json()["meta_info"]["finish_reason"]
            # Paused in place: the scheduler's queue does not count (is_fully_idle(ignore_waiting)),
            # a running request does.
            running = asyncio.create_task(http.post(url + "/generate", json=body("f-run2", LONG)))
            await wait_for(http, url, lambda i: i["num_running_reqs"] == 1)
            queued = asyncio.create_task(http.post(url + "/generate", json=body("f-queued", 3)))
            await wait_for(http, url, lambda i: i["num_waiting_reqs"] == 1)
            await http.post(url + "/pause_generation", json={"mode": "in_place"})
            out["paused_running"] = await http.post(url + "/flush_cache")
            await http.post(url + "/abort_request", json={"rid": "f-run2"})
            await running
            out["paused_queue_only"] = await http.post(url + "/flush_cache")
            await http.post(url + "/continue_generation", json={})
            out["queued"] = (await queued).json()
            return out

    out = run(go())
    assert (out["busy"].status_code, out["busy"].text) == (400, "Flush cache failed.\n")
    short = out["short"]
    assert (short.status_code, short.text) == (400, "Timed out waiting for idle state.")
    assert out["negative"].status_code == 422
    assert out["waited"].status_code == 200 and out["waited"].text.startswith("Cache flushed.")
    assert out["waited_for"] == {"type": "length", "length": 400}  # not aborted by the flush
    assert out["paused_running"].status_code == 400
    assert out["paused_queue_only"].status_code == 200
    assert out["queued"]["meta_info"]["finish_reason"] == {"type": "length", "length": 3}


# ------------------------------------------------------------------------ busy flush on load


def test_a_load_whose_flush_is_refused_fails_with_the_weights_loaded_and_version_recorded(
    server: ThreadedReferenceServer, seed1_dir: Path, tiny_model_dir: Path
) -> None:
    """SGLang loads, records the version in the scheduler, then flushes; a flush refused
    because a request is running fails the call (400) although the weights are loaded. The
    scheduler's version is what the request finishing afterwards carries; the tokenizer
    manager's (``/model_info``) moves only on success."""
    url = server.url
    before = weights(url, PROBE)

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=60) as http:
            out: dict[str, Any] = {}
            running = asyncio.create_task(http.post(url + "/generate", json=body("b-run", LONG)))
            await wait_for(http, url, lambda i: i["num_running_reqs"] == 1)
            await http.post(url + "/pause_generation", json={"mode": "in_place"})
            load = {"model_path": str(seed1_dir), "weight_version": "w-busy"}
            out["busy"] = await http.post(url + "/update_weights_from_disk", json=load)
            out["served"] = weights(url, PROBE)
            out["model_info_version"] = version(url)
            quiet = {
                "model_path": str(seed1_dir),
                "weight_version": "w-quiet",
                "flush_cache": False,
            }
            out["no_flush"] = await http.post(url + "/update_weights_from_disk", json=quiet)
            await http.post(url + "/continue_generation", json={})
            out["running"] = (await running).json()
            return out

    out = run(go())
    assert out["busy"].status_code == 400
    assert out["busy"].json() == {
        "success": False,
        "message": FLUSH_BUSY_MESSAGE,
        "num_paused_requests": 0,
    }
    seed1 = weights_of(seed1_dir, PROBE)
    assert out["served"] != before
    assert torch.allclose(torch.tensor(out["served"]), torch.tensor(seed1), atol=1e-6)
    assert out["model_info_version"] == "s0"  # the tokenizer manager's, untouched by a failure
    assert out["no_flush"].status_code == 200
    assert out["no_flush"].json()["message"] == (
        "Succeeded to update model weights. Weight version updated to w-quiet."
    )
    meta = out["running"]["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and meta["weight_version"] == "w-quiet"
    assert version(url) == "w-quiet"
    restore = {"model_path": str(tiny_model_dir), "weight_version": "s1"}
    idle = httpx.post(url + "/update_weights_from_disk", json=restore, timeout=60)
    assert idle.status_code == 200 and idle.json()["success"] is True


def test_update_weight_version_names_the_version_without_aborting_when_asked_not_to(
    server: ThreadedReferenceServer,
) -> None:
    """SGLang's ``/update_weight_version``: both versions move (``/model_info`` and what a
    request finishing afterwards carries); ``abort_all_requests`` (its default: true) aborts
    the running request, false leaves it running."""
    url = server.url

    async def go(abort: bool, new: str) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=60) as http:
            running = asyncio.create_task(http.post(url + "/generate", json=body(f"u{new}", LONG)))
            await wait_for(http, url, lambda i: i["num_running_reqs"] == 1)
            answer = await http.post(
                url + "/update_weight_version",
                json={"new_version": new, "abort_all_requests": abort},
            )
            return {"answer": answer, "running": (await running).json(), "reported": version(url)}

    kept = run(go(False, "u7"))
    assert kept["answer"].status_code == 200
    assert kept["answer"].json() == {
        "success": True,
        "message": "Weight version updated to u7",
        "new_version": "u7",
    }
    meta = kept["running"]["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and meta["weight_version"] == "u7"
    assert kept["reported"] == "u7"
    aborted = run(go(True, "u8"))
    assert aborted["running"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert aborted["reported"] == "u8"


def weights_of(model_dir: Path, name: str) -> list[list[float]]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))[name][:1].float().tolist()


def test_disk_updates_need_no_session(
    server: ThreadedReferenceServer, tiny_model_dir: Path
) -> None:
    load = {"model_path": str(tiny_model_dir), "weight_version": "no-session"}
    answer = httpx.post(server.url + "/update_weights_from_disk", json=load, timeout=60)
    assert answer.status_code == 200 and answer.json()["success"] is True
    assert version(server.url) == "no-session"


# ------------------------------------------------------------------------ distributed


def trainer_side(url: str, group_name: str) -> WeightGroup:
    """Rank 0 of a new gloo group with the engine as rank 1 (through its HTTP route)."""
    store = open_store("127.0.0.1", 0, 0, 2, 30)
    joined: list[WeightGroup] = []

    def join() -> None:
        joined.append(
            join_group(
                store, rank=0, world_size=2, group_name=group_name, backend="gloo", timeout_s=30
            )
        )

    thread = threading.Thread(target=join)
    thread.start()
    init = {
        "master_address": "127.0.0.1",
        "master_port": store.port,
        "rank_offset": 1,
        "world_size": 2,
        "group_name": group_name,
        "backend": "gloo",
    }
    answer = httpx.post(url + "/init_weights_update_group", json=init, timeout=60)
    thread.join(30)
    assert answer.status_code == 200, answer.text
    return joined[0]


def broadcast(
    group: WeightGroup, buckets: list[list[tuple[str, torch.Tensor]]]
) -> threading.Thread:
    def run_() -> None:
        for bucket in buckets:
            for _, tensor in bucket:
                group.broadcast(tensor.clone())

    thread = threading.Thread(target=run_)
    thread.start()
    return thread


def bucket_body(bucket: list[tuple[str, torch.Tensor]], group: str, **extra: Any) -> dict[str, Any]:
    return {
        "names": [n for n, _ in bucket],
        "dtypes": ["float32" for _ in bucket],
        "shapes": [list(t.shape) for _, t in bucket],
        "group_name": group,
        **extra,
    }


def post(url: str, path: str, payload: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=payload, timeout=30)


def test_distributed_buckets_load_one_by_one_inside_a_session(
    server: ThreadedReferenceServer,
) -> None:
    url, name = server.url, "g-session"
    shapes = server.state.runner.weight_shapes()  # type: ignore[attr-defined]
    norm = ("model.norm.weight", torch.full(shapes["model.norm.weight"], 0.5))
    layernorm_before = weights(url, LAYERNORM, 3)
    bad = [(LAYERNORM, torch.full(shapes[LAYERNORM], 0.25)), ("model.not_a_weight", torch.zeros(3))]
    last = [(LAYERNORM, torch.full(shapes[LAYERNORM], 0.75))]
    group = trainer_side(url, name)
    # Outside a session: refused before anything is received (a receive would wait for a
    # broadcast that never comes, and the calls below would pair with the wrong tensors).
    outside = post(url, "/update_weights_from_distributed", bucket_body([norm], name))
    assert (outside.status_code, outside.json()) == (
        400,
        {"success": False, "message": DISTRIBUTED_OUTSIDE},
    )
    closed = post(url, "/end_weight_update", {})
    assert (closed.status_code, closed.json()) == (400, {"success": False, "message": NOT_OPEN})
    opened = post(url, "/begin_weight_update", {"selector": "all"})
    assert (opened.status_code, opened.json()) == (200, {"success": True, "message": "Success"})
    twice = post(url, "/begin_weight_update", {})
    assert (twice.status_code, twice.json()) == (400, {"success": False, "message": ALREADY_OPEN})
    sender = broadcast(group, [[norm], bad, last])
    first = post(url, "/update_weights_from_distributed", bucket_body([norm], name))
    assert first.json() == {"success": True, "message": "Succeeded to update parameter online."}
    assert weights(url, "model.norm.weight", 3) == [0.5, 0.5, 0.5]  # loaded at once
    assert version(url) == "s0"
    refused = post(url, "/update_weights_from_distributed", bucket_body(bad, name))
    assert refused.status_code == 400 and refused.json()["success"] is False
    assert refused.json()["message"].startswith("Failed to update parameter online: ")
    # Half-updated: the first bucket stays loaded, nothing of the bad one is, same version.
    assert weights(url, "model.norm.weight", 3) == [0.5, 0.5, 0.5]
    assert weights(url, LAYERNORM, 3) == layernorm_before
    assert version(url) == "s0"
    committed = post(
        url, "/update_weights_from_distributed", bucket_body(last, name, weight_version="d1")
    )
    assert committed.json() == {
        "success": True,
        "message": "Succeeded to update parameter online. Weight version updated to d1.",
    }
    sender.join(30)
    assert not sender.is_alive()
    assert weights(url, LAYERNORM, 3) == [0.75, 0.75, 0.75] and version(url) == "d1"
    generated = httpx.post(url + "/generate", json=body("after-d1", 2), timeout=60).json()
    assert generated["meta_info"]["weight_version"] == "d1"
    assert post(url, "/end_weight_update", {}).json() == {"success": True, "message": "Success"}
    destroyed = post(url, "/destroy_weights_update_group", {"group_name": name})
    assert destroyed.json() == {"success": True, "message": GROUP_DESTROYED}
    again = post(url, "/destroy_weights_update_group", {"group_name": name})
    assert (again.status_code, again.json()) == (400, {"success": False, "message": GROUP_MISSING})


def test_a_bucket_whose_flush_is_refused_is_loaded_and_fails(
    server: ThreadedReferenceServer,
) -> None:
    """With ``flush_cache`` SGLang flushes after each successful bucket; while a request runs
    (paused in place) the flush is refused: 400, the bucket loaded, the version recorded."""
    url, name = server.url, "g-busy"
    shapes = server.state.runner.weight_shapes()  # type: ignore[attr-defined]
    norm = ("model.norm.weight", torch.full(shapes["model.norm.weight"], 0.125))
    group = trainer_side(url, name)
    assert post(url, "/begin_weight_update", {}).status_code == 200

    async def go() -> tuple[httpx.Response, Any]:
        async with httpx.AsyncClient(timeout=60) as http:
            running = asyncio.create_task(http.post(url + "/generate", json=body("d-run", LONG)))
            await wait_for(http, url, lambda i: i["num_running_reqs"] == 1)
            await http.post(url + "/pause_generation", json={"mode": "in_place"})
            sender = broadcast(group, [[norm]])
            payload = bucket_body([norm], name, weight_version="d-busy", flush_cache=True)
            answer = await http.post(url + "/update_weights_from_distributed", json=payload)
            sender.join(30)
            await http.post(url + "/continue_generation", json={})
            return answer, (await running).json()

    answer, finished = run(go())
    assert (answer.status_code, answer.json()) == (
        400,
        {"success": False, "message": FLUSH_BUSY_MESSAGE},
    )
    assert weights(url, "model.norm.weight", 2) == [0.125, 0.125]
    assert finished["meta_info"]["weight_version"] == "d-busy"  # the scheduler's
    assert version(url) == "s0"  # the tokenizer manager's: only a success moves it
    assert post(url, "/end_weight_update", {}).status_code == 200


# ------------------------------------------------------------------------ get_weights_by_name


def test_get_weights_by_name_fails_for_qwen3_as_on_sglang(tiny_model_dir: Path) -> None:
    """SGLang 0.5.23 has no ``get_weights_by_name`` for Qwen3ForCausalLM (the tiny model):
    ``_create_error_response("Get parameter by name failed")``; ``always`` opts in."""
    ask = {"name": "model.norm.weight", "truncate_size": 2}
    with reference_server_in_thread(tiny_model_dir) as default:
        answer = httpx.post(default.url + "/get_weights_by_name", json=ask, timeout=30)
        info = httpx.get(default.url + "/model_info", timeout=30).json()
    assert info["architectures"] == ["Qwen3ForCausalLM"]
    assert answer.status_code == 400
    assert answer.json() == {"error": {"message": "Get parameter by name failed"}}
    with reference_server_in_thread(
        tiny_model_dir, extra_args=["--get-weights-by-name", "always"]
    ) as opted:
        values = httpx.post(opted.url + "/get_weights_by_name", json=ask, timeout=30)
        unknown = httpx.post(
            opted.url + "/get_weights_by_name", json={"name": "model.nope"}, timeout=30
        )
    assert values.status_code == 200 and len(values.json()) == 2
    assert unknown.status_code == 400
    assert unknown.json() == {"error": {"message": "Get parameter by name failed"}}
