"""The adapter's weight refresh (adapter/weights.py, adapter/weight_sync.py) against SGLang
0.5.23's own server code: disk refreshes in step and token mode, the spot check on a model
class SGLang cannot read weights back from, and the distributed refresh with its weight-update
session (docs/sglang-conformance.md).

What is asserted is what a user of swerl sees: the refresh succeeds, the engine stays in
rotation and serves the new version (its weights, ``/model_info`` and every answer), calls in
flight are answered -- continued on the new weights in token mode -- and never fail."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from adapter.config import RefreshMode
from adapter.engines.sglang import GenerateResult, SamplingParams
from adapter.errors import APIError
from adapter.metrics import AdapterMetrics
from adapter.routing import Engine, Router
from adapter.weight_check import WeightProbe
from adapter.weight_sync import (
    Bucket,
    DistributedRefreshRequest,
    DistributedWeights,
    GroupRequest,
)
from adapter.weights import RefreshGate, WeightCoordinator
from services.processes import free_port
from tests.conformance.conftest import EngineFactory
from tests.conformance.sglang_app import SGLangEngine, checkpoint, run
from tests.conformance.trainer_side import (
    BUCKET_BYTES,
    GROUP,
    buckets_of,
    finish,
    start_trainer,
)

PROMPT = [5, 17, 42, 99, 7, 3, 64, 12]
NORM = "model.norm.weight"


@dataclass
class Adapter:
    """The adapter's refresh machinery over one SGLang engine (as adapter/service.py wires
    it, without HTTP or Redis)."""

    engine: Engine
    router: Router
    gate: RefreshGate
    coordinator: WeightCoordinator

    async def generate(self, input_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        """A generate call as the adapter makes it: through the gate, then the router."""
        async with self.gate.slot():
            rid = f"conformance-{uuid.uuid4().hex[:8]}"
            result, _ = await self.router.generate(None, input_ids, sampling, rid)
        return result


async def adapter_over(e: SGLangEngine, mode: RefreshMode) -> Adapter:
    metrics = AdapterMetrics()
    engine = Engine(url=e.url, client=e.client())
    router = Router(engines=[engine], metrics=metrics)
    gate = RefreshGate()
    coordinator = WeightCoordinator(
        router, gate, metrics, initial_version=0, drain_timeout_s=120, mode=mode
    )
    await coordinator.discover()
    assert coordinator.state.version == 0
    return Adapter(engine, router, gate, coordinator)


async def assert_serves(e: SGLangEngine, a: Adapter, version: int, model_dir: Path) -> None:
    """The engine is in rotation and serves ``version``: /model_info, answers, weights."""
    assert a.engine.healthy, a.engine.last_error
    assert a.coordinator.state.version == version
    assert await a.engine.client.get_weight_version() == str(version)
    answer = await a.generate(PROMPT, SamplingParams(max_new_tokens=4, temperature=1.0))
    assert answer.weight_version == str(version)
    want = checkpoint(model_dir)
    for name in (NORM, "model.layers.0.self_attn.q_proj.weight"):
        assert torch.equal(e.weights(name), want[name].float()), name


@pytest.mark.parametrize("mode", [RefreshMode.STEP, RefreshMode.TOKEN])
def test_disk_refresh_serves_the_new_version(
    engine: EngineFactory, model_dir_seed1: Path, mode: RefreshMode
) -> None:
    async def scenario() -> None:
        async with engine() as e:
            a = await adapter_over(e, mode)
            summary = await a.coordinator.refresh(str(model_dir_seed1), 1)
            assert summary["engines"][e.url]["ok"], summary
            await assert_serves(e, a, 1, model_dir_seed1)

    run(scenario())


@pytest.mark.slow
def test_token_mode_refresh_continues_the_running_call_on_the_new_weights(
    engine: EngineFactory, model_dir_seed1: Path
) -> None:
    """The call running when the refresh starts is aborted by SGLang's pause, continued from
    its prefix after the load, and answered once: the first tokens on version 0, the rest on
    version 1, nothing lost."""

    async def scenario() -> None:
        async with engine(step_delay_s=0.01) as e:
            a = await adapter_over(e, RefreshMode.TOKEN)
            sampling = SamplingParams(max_new_tokens=300, temperature=1.0, ignore_eos=True)
            call = asyncio.create_task(a.generate(PROMPT, sampling))
            await e.wait_until(running=1)
            await asyncio.sleep(0.1)  # some tokens on version 0
            summary = await a.coordinator.refresh(str(model_dir_seed1), 1)
            assert summary["engines"][e.url]["ok"], summary
            answer = await call
            assert not answer.aborted
            assert len(answer.output_ids) == len(answer.output_logprobs) == 300
            assert answer.continuations >= 1
            assert [v for _, v in answer.version_runs] == ["0", "1"]
            await assert_serves(e, a, 1, model_dir_seed1)

    run(scenario())


@pytest.mark.slow
def test_token_mode_refresh_continues_a_call_aborted_while_queued(
    engine: EngineFactory, model_dir_seed1: Path
) -> None:
    """SGLang answers a call aborted in its waiting queue without prompt_tokens (an
    ``AbortReq`` echo): the call is continued like the running one, not failed."""

    async def scenario() -> None:
        async with engine(max_running_requests=1, step_delay_s=0.01) as e:
            a = await adapter_over(e, RefreshMode.TOKEN)
            sampling = SamplingParams(max_new_tokens=200, temperature=1.0, ignore_eos=True)
            running = asyncio.create_task(a.generate(PROMPT, sampling))
            queued = asyncio.create_task(a.generate(PROMPT[:6], sampling))
            await e.wait_until(running=1, waiting=1)
            summary = await a.coordinator.refresh(str(model_dir_seed1), 1)
            assert summary["engines"][e.url]["ok"], summary
            first, second = await running, await queued
            for answer in (first, second):
                assert not answer.aborted and len(answer.output_ids) == 200
            assert second.prompt_tokens == 6
            assert second.weight_version == "1"  # it had not started: all on version 1
            assert [v for _, v in first.version_runs] == ["0", "1"]
            await assert_serves(e, a, 1, model_dir_seed1)

    run(scenario())


@pytest.mark.parametrize("mode", [RefreshMode.STEP, RefreshMode.TOKEN])
def test_refresh_with_probes_keeps_an_engine_that_cannot_read_weights_back(
    engine: EngineFactory, model_dir_seed1: Path, mode: RefreshMode
) -> None:
    """SGLang 0.5.23 answers ``/get_weights_by_name`` with 400 "Get parameter by name failed"
    for Qwen3 (the tiny model's class): the spot check is unverifiable, the load stands on the
    reported version and the engine stays in rotation."""

    async def scenario() -> None:
        async with engine() as e:
            a = await adapter_over(e, mode)
            values = checkpoint(model_dir_seed1)[NORM][:4].tolist()
            probes = (WeightProbe(name=NORM, values=tuple(values)),)
            summary = await a.coordinator.refresh(str(model_dir_seed1), 1, probes=probes)
            report = summary["engines"][e.url]
            assert report["ok"], report
            assert "unverifiable" in report, report
            await assert_serves(e, a, 1, model_dir_seed1)

    run(scenario())


@pytest.mark.parametrize("mode", [RefreshMode.STEP, RefreshMode.TOKEN])
def test_the_logprob_probe_checks_a_qwen3_engine_and_fails_other_weights(
    engine: EngineFactory, model_dir_seed1: Path, mode: RefreshMode
) -> None:
    """The check that works where ``/get_weights_by_name`` does not: SGLang's own
    ``/generate`` (``max_new_tokens`` 0, ``logprob_start_len`` 0) answers the input-token
    logprobs of the probe sequence -- in token mode once the engine continues, since a paused
    SGLang holds every new request -- and they are the trainer's (float32 on both sides here).
    A probe the loaded weights do not reproduce fails the load."""
    from adapter.weight_check import LogprobProbe
    from tests.support.publish import trainer
    from trainer.publish.base import logprob_probe

    probe = LogprobProbe.model_validate(logprob_probe(trainer(model_dir_seed1)))

    async def scenario() -> None:
        async with engine() as e:
            a = await adapter_over(e, mode)
            summary = await a.coordinator.refresh(str(model_dir_seed1), 1, logprob_probe=probe)
            report = summary["engines"][e.url]
            assert report["ok"], report
            assert report["logprob_probe_gap"] < 1e-4, report
            await assert_serves(e, a, 1, model_dir_seed1)
            other = probe.model_copy(update={"logprobs": tuple(v - 2.0 for v in probe.logprobs)})
            with pytest.raises(APIError) as failed:
                await a.coordinator.refresh(str(model_dir_seed1), 2, logprob_probe=other)
            assert failed.value.status == 502 and "2.000 nats" in failed.value.message
            assert not a.engine.healthy and a.coordinator.state.version == 1

    run(scenario())


# ---------------------------------------------------------------------------- distributed


@pytest.mark.slow
@pytest.mark.parametrize("mode", [RefreshMode.STEP, RefreshMode.TOKEN])
def test_distributed_refresh_serves_the_new_version(
    engine: EngineFactory, model_dir_seed1: Path, mode: RefreshMode
) -> None:
    """The adapter forms the group with SGLang's ``init_custom_process_group`` on the engine
    side and swerl's trainer code on rank 0, then sends the version bucket by bucket inside
    SGLang's weight-update session: the engine serves it afterwards."""

    async def scenario() -> None:
        async with engine() as e:
            a = await adapter_over(e, mode)
            sync = DistributedWeights(a.router, a.coordinator)
            port = free_port()
            spec = {"model_dir": str(model_dir_seed1), "bucket_bytes": BUCKET_BYTES}
            buckets = [Bucket(**b.spec()) for b in buckets_of(spec)]
            assert len(buckets) >= 3
            trainer = start_trainer(port, model_dir_seed1)
            try:
                joined = await sync.init_group(
                    GroupRequest(
                        master_address="127.0.0.1",
                        master_port=port,
                        world_size=2,
                        group_name=GROUP,
                        backend="gloo",
                    )
                )
                assert joined["ranks"] == {e.url: [1]}
                summary = await sync.refresh(
                    DistributedRefreshRequest(version=1, group_name=GROUP, buckets=buckets)
                )
            finally:
                log = await asyncio.to_thread(finish, trainer)
            assert summary["engines"][e.url]["ok"], (summary, log)
            assert summary["broadcast_abandoned"] is False
            assert trainer.returncode == 0, log
            await assert_serves(e, a, 1, model_dir_seed1)

    run(scenario())


@pytest.mark.slow
def test_a_load_whose_flush_sglang_refuses_is_a_load_and_never_served_unflushed(
    engine: EngineFactory, model_dir: Path, model_dir_seed1: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another client paused the engine in place with a request running (SGLang then loads
    without its writer lock): SGLang loads, records the version in its scheduler, refuses the
    flush and answers failure, and its ``/model_info`` keeps the old version. The adapter
    recognises the load and retries the flush; while the request holds the cache the engine
    stays out of rotation. Here it was the only engine, so version 2 failed (502) and the
    engine holds weights that are not the current version's: readmission reloads version 1
    from its disk copy -- flushed -- before it serves. A version whose flush succeeds on a
    retry is told to the engine (``/update_weight_version``, nothing aborted) and served."""
    monkeypatch.setattr("adapter.weights.FLUSH_RETRY_S", 0.01)

    async def scenario() -> None:
        async with engine(step_delay_s=0.01) as e:
            a = await adapter_over(e, RefreshMode.STEP)
            await a.coordinator.refresh(str(model_dir_seed1), 1)
            other = e.client()
            sampling = SamplingParams(max_new_tokens=60, temperature=1.0, ignore_eos=True)
            outside = asyncio.create_task(other.generate(PROMPT, sampling))
            await e.wait_until(running=1)
            await other.pause_generation("in_place")
            with pytest.raises(APIError, match="older weights"):
                await a.coordinator.refresh(str(model_dir), 2)
            assert not a.engine.healthy and a.coordinator.needs_flush == {e.url: 2}
            assert await a.engine.client.get_weight_version() == "1"  # SGLang's /model_info
            await other.continue_generation()
            finished = await outside
            assert finished.finish_reason.type == "length"  # never aborted
            await a.coordinator.readmit(a.engine)
            assert a.coordinator.needs_flush == {}
            await assert_serves(e, a, 1, model_dir_seed1)
            # a flush that succeeds on a retry: the version is told to the engine and served
            held = asyncio.create_task(other.generate(PROMPT, sampling))
            await e.wait_until(running=1)
            await other.pause_generation("in_place")

            flush = a.engine.client.flush_cache

            async def flush_after_the_request() -> bool:  # the adapter's retry, after it ends
                await other.continue_generation()
                await held
                return await flush()

            monkeypatch.setattr(a.engine.client, "flush_cache", flush_after_the_request)
            summary = await a.coordinator.refresh(str(model_dir), 2)
            report = summary["engines"][e.url]
            assert report["ok"] and report["flushed_again"], report
            assert (await held).finish_reason.type == "length"
            await assert_serves(e, a, 2, model_dir)

    run(scenario())
