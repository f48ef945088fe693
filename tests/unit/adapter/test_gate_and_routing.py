"""Refresh gate semantics and engine selection, without engines (pure asyncio logic)."""

from __future__ import annotations

import asyncio

import pytest

from adapter.engines.sglang import SGLangClient
from adapter.metrics import AdapterMetrics
from adapter.routing import Engine, Router
from adapter.weights import RefreshGate, parse_version


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
    assert router.metrics.engine_healthy.get(engine=e0.url) == 0.0


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
