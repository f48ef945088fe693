"""Refresh gate semantics and engine selection, without engines (pure asyncio logic)."""

from __future__ import annotations

import asyncio

import pytest

from adapter.engines.sglang import (
    EngineUnavailableError,
    GenerateResult,
    SamplingParams,
    SGLangClient,
)
from adapter.metrics import AdapterMetrics
from adapter.routing import Engine, NoEngineAvailableError, Router
from adapter.weights import RefreshGate, parse_version
from services.protocol.sglang import FinishReason


def test_closed_gate_makes_new_calls_wait_and_drain_waits_for_inflight() -> None:
    async def scenario() -> list[str]:
        gate = RefreshGate()
        events: list[str] = []
        release = asyncio.Event()

        async def running_step() -> None:
            async with gate.slot() as waited:
                assert waited < 0.05
                events.append("step started")
                await release.wait()
                events.append("step finished")

        async def late_call() -> None:
            async with gate.slot() as waited:
                events.append(f"late call admitted after waiting={waited > 0.01}")

        step = asyncio.create_task(running_step())
        await asyncio.sleep(0.01)
        gate.close()
        late = asyncio.create_task(late_call())
        drain = asyncio.create_task(gate.drain(5))
        await asyncio.sleep(0.03)
        assert gate.inflight == 1 and gate.waiting == 1 and not drain.done()
        release.set()
        await drain
        events.append("drained")
        assert not late.done()  # still waiting: the gate is closed
        gate.reopen()
        await asyncio.gather(step, late)
        return events

    assert asyncio.run(scenario()) == [
        "step started",
        "step finished",
        "drained",
        "late call admitted after waiting=True",
    ]


def test_drain_times_out_while_a_step_runs() -> None:
    async def scenario() -> None:
        gate = RefreshGate()
        async with gate.slot():
            gate.close()
            with pytest.raises(TimeoutError):
                await gate.drain(0.05)

    asyncio.run(scenario())


def test_parse_version() -> None:
    assert parse_version("7") == 7
    assert parse_version(" 12 ") == 12
    assert parse_version("default") is None
    assert parse_version(None) is None


def make_router(n: int) -> Router:
    engines = [
        Engine(
            url=f"http://127.0.0.1:{9000 + i}", client=SGLangClient(f"http://127.0.0.1:{9000 + i}")
        )
        for i in range(n)
    ]
    return Router(engines=engines, metrics=AdapterMetrics())


def test_new_trajectories_go_to_the_least_busy_healthy_engine() -> None:
    router = make_router(3)
    e0, e1, e2 = router.engines
    e0.inflight, e1.inflight, e2.inflight = 2, 0, 1
    assert router.pick("t1") is e1
    router.stick("t1", e1)
    e1.inflight = 2
    e0.inflight = 2
    assert router.pick("t2") is e2
    router.mark_unhealthy(e2, "down")
    e0.assigned = 0
    assert router.pick("t2") is e0  # e1 and e0 equally busy; e1 has a trajectory already
    assert router.pick("t1") is e1  # sticky
    assert router.pick("t1", exclude={e1.url}) is e0  # retry elsewhere
    router.mark_unhealthy(e1, "down")
    assert router.pick("t1") is e0  # sticky engine out of rotation
    router.mark_unhealthy(e0, "down")
    assert router.pick("t1") is None
    assert router.metrics.value("swerl_adapter_engine_healthy", engine=e0.url) == 0.0


def test_stick_and_forget_keep_assignment_counts() -> None:
    router = make_router(2)
    e0, e1 = router.engines
    router.stick("a", e0)
    router.stick("b", e0)
    router.stick("a", e1)
    assert (e0.assigned, e1.assigned) == (1, 1)
    router.forget("a")
    router.forget("unknown")
    assert (e0.assigned, e1.assigned) == (1, 0)


STOP = FinishReason(type="stop")


class FlakyClient(SGLangClient):
    """An engine client whose first ``failures`` calls fail as if the engine timed out."""

    def __init__(self, url: str, failures: int) -> None:
        super().__init__(url)
        self.failures = failures
        self.calls = 0

    async def generate(self, input_ids: list[int], sampling: object, **_: object) -> GenerateResult:
        self.calls += 1
        if self.calls <= self.failures:
            raise EngineUnavailableError(self.base_url, "read timed out")
        return GenerateResult(
            rid="r", text="ok", output_ids=[1], output_logprobs=[-0.5], finish_reason=STOP,
            weight_version="0", prompt_tokens=len(input_ids), cached_tokens=0, latency_s=0.0,
            engine_latency_s=None,
        )  # fmt: skip


def _flaky_router(outage_wait_s: float, failures: int) -> tuple[Router, FlakyClient]:
    client = FlakyClient("http://127.0.0.1:9100", failures)
    router = Router(
        engines=[Engine(url=client.base_url, client=client)],
        metrics=AdapterMetrics(),
        attempts=3,
        outage_wait_s=outage_wait_s,
    )
    return router, client


def test_a_call_waits_for_the_only_engine_to_be_readmitted() -> None:
    # One transient timeout on the only engine must not fail the call (and abort its
    # trajectory): it waits for the prober to re-admit the engine, then retries there.
    router, client = _flaky_router(outage_wait_s=60.0, failures=1)

    async def scenario() -> str:
        async def prober() -> None:
            while router.engines[0].healthy:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # the call is now waiting
            router.mark_healthy(router.engines[0])

        probe = asyncio.create_task(prober())
        result, engine = await router.generate("t1", [1, 2], SamplingParams(), rid="r")
        await probe
        return f"{result.text}@{engine.url}"

    assert asyncio.run(scenario()) == "ok@http://127.0.0.1:9100"
    assert client.calls == 2
    assert router.metrics.value("swerl_adapter_outage_waits_total") == 1
    assert router.sticky == {"t1": "http://127.0.0.1:9100"}


def test_without_a_readmission_the_call_fails_after_the_wait() -> None:
    router, client = _flaky_router(outage_wait_s=0.2, failures=10)
    with pytest.raises(NoEngineAvailableError, match="read timed out"):
        asyncio.run(router.generate("t1", [1], SamplingParams(), rid="r"))
    assert client.calls == 1  # never re-admitted: no second call
    assert router.metrics.value("swerl_adapter_outage_waits_total") == 1


def test_no_outage_wait_fails_at_once() -> None:
    router, client = _flaky_router(outage_wait_s=0.0, failures=10)
    with pytest.raises(NoEngineAvailableError):
        asyncio.run(router.generate(None, [1], SamplingParams(), rid="r"))
    assert client.calls == 1 and router.metrics.value("swerl_adapter_outage_waits_total") == 0
