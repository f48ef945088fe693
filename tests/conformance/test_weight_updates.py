"""SGLang 0.5.23's weight-update semantics as its own code answers them over HTTP -- what the
adapter's refresh has to live with (docs/sglang-conformance.md, docs/weights.md).

Each test pins one behaviour of SGLang's ``SchedulerWeightUpdaterManager`` /
``TokenizerManager`` / routes that swerl's code depends on; if a SGLang bump changes one, the
test names it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import torch

from adapter.engines.sglang import EngineRequestError, SamplingParams
from services.processes import free_port
from tests.conformance.conftest import EngineFactory
from tests.conformance.sglang_app import checkpoint, run
from tests.conformance.trainer_side import GROUP, buckets_of, finish, start_trainer

PROMPT = [5, 17, 42, 99, 7, 3, 64, 12]
NORM = "model.norm.weight"


def test_distributed_update_is_refused_outside_a_session(engine: EngineFactory) -> None:
    """Outside ``/begin_weight_update`` .. ``/end_weight_update`` SGLang refuses the bucket
    (400, success false) before receiving anything: no broadcast is waited for."""

    async def scenario() -> None:
        async with engine() as e:
            body = {"names": [NORM], "dtypes": ["float32"], "shapes": [[64]], "group_name": GROUP}
            response = await e.http.post("/update_weights_from_distributed", json=body)
            assert response.status_code == 400
            assert response.json()["success"] is False
            assert "begin_weight_update" in response.json()["message"]
            # sessions: one at a time, end needs a begin
            assert (await e.http.post("/end_weight_update", json={})).status_code == 400
            assert (await e.http.post("/begin_weight_update", json={})).status_code == 200
            assert (await e.http.post("/begin_weight_update", json={})).status_code == 400
            assert (await e.http.post("/end_weight_update", json={})).status_code == 200

    run(scenario())


def test_get_weights_by_name_is_refused_for_the_qwen3_class(engine: EngineFactory) -> None:
    async def scenario() -> None:
        async with engine() as e:
            response = await e.http.post(
                "/get_weights_by_name", json={"name": NORM, "truncate_size": 4}
            )
            assert response.status_code == 400
            assert response.json() == {"error": {"message": "Get parameter by name failed"}}
            with pytest.raises(EngineRequestError) as raised:
                await e.client().get_weights_by_name(NORM, 4)
            assert raised.value.status == 400

    run(scenario())


def test_busy_flush_fails_the_update_after_loading_and_recording_the_version(
    engine: EngineFactory, model_dir_seed1: Path
) -> None:
    """With ``flush_cache`` and requests held by an in-place pause, SGLang loads the weights,
    records the version in the scheduler (answers produced from then on carry it), then fails
    the call because the cache could not be flushed. The tokenizer manager records a version
    only on success: ``/model_info`` keeps reporting the old one."""

    async def scenario() -> None:
        async with engine(step_delay_s=0.005) as e:
            client = e.client()
            sampling = SamplingParams(max_new_tokens=200, temperature=1.0, ignore_eos=True)
            call = asyncio.create_task(client.generate(PROMPT, sampling))
            await e.wait_until(running=1)
            await client.pause_generation("in_place")
            response = await e.http.post(
                "/update_weights_from_disk",
                json={"model_path": str(model_dir_seed1), "weight_version": "7"},
            )
            assert response.status_code == 400
            assert response.json()["success"] is False
            assert "cache was not flushed" in response.json()["message"]
            assert torch.equal(e.weights(NORM), checkpoint(model_dir_seed1)[NORM].float())
            assert e.scheduler_version == "7"
            assert await client.get_weight_version() == "0"
            await client.continue_generation()
            answer = await call
            assert not answer.aborted and answer.weight_version == "7"
            assert await client.flush_cache() is True

    run(scenario())


@pytest.mark.slow
def test_buckets_are_applied_one_by_one_and_a_refused_one_keeps_the_earlier(
    engine: EngineFactory, model_dir_seed1: Path
) -> None:
    """A bucket SGLang cannot load (a name the model lacks) fails after the earlier buckets --
    and the earlier tensors of its own bucket -- were applied; the version is not recorded."""

    async def scenario() -> None:
        async with engine() as e:
            spec = {"model_dir": str(model_dir_seed1), "bucket_bytes": 64 * 1024}
            buckets = buckets_of(spec)
            last = len(buckets) - 1
            extra = {"name": "model.no_such.weight", "shape": [4], "after_bucket": last}
            spec_buckets = buckets_of({**spec, "extra": extra})
            port = free_port()
            trainer = start_trainer(port, model_dir_seed1, extra=extra)
            try:
                init = {
                    "master_address": "127.0.0.1",
                    "master_port": port,
                    "rank_offset": 1,
                    "world_size": 2,
                    "group_name": GROUP,
                    "backend": "gloo",
                }
                response = await e.http.post("/init_weights_update_group", json=init)
                assert response.status_code == 200, response.text
                assert (await e.http.post("/begin_weight_update", json={})).status_code == 200
                answers: list[httpx.Response] = []
                for index, bucket in enumerate(spec_buckets):
                    body = {**bucket.spec(), "group_name": GROUP, "flush_cache": index == last}
                    if index == last:
                        body["weight_version"] = "1"
                    answers.append(await e.http.post("/update_weights_from_distributed", json=body))
                assert (await e.http.post("/end_weight_update", json={})).status_code == 200
            finally:
                log = await asyncio.to_thread(finish, trainer)
            assert trainer.returncode == 0, log
            assert [a.status_code for a in answers] == [200] * last + [400], log
            assert "Failed to update parameter online" in answers[-1].json()["message"]
            want = checkpoint(model_dir_seed1)
            for bucket in buckets:  # every real tensor, the refused bucket's included
                for name, _ in bucket.tensors:
                    if name in want and name != "lm_head.weight":
                        assert torch.equal(e.weights(name), want[name].float()), name
            assert e.scheduler_version == "0"
            assert await e.client().get_weight_version() == "0"

    run(scenario())
