"""The refresh state machine of adapter.weights against fake engine clients (no processes).

One behaviour for every refresh (docs/weights.md): validate before interrupting anything; an
engine that is down or fails to load leaves rotation and is reloaded with the current weights
before it serves again; the version moves once at least one engine serves it; a restarted
engine is synced before it joins, and one that cannot be (no disk copy) stays out.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from adapter.config import RefreshMode
from adapter.engines.sglang import EngineRequestError, EngineUnavailableError
from adapter.errors import APIError
from adapter.metrics import AdapterMetrics
from adapter.routing import Engine, Router
from adapter.weights import RefreshGate, WeightCoordinator


class FakeClient:
    """The control calls of an engine; records them in a log shared by all fakes."""

    def __init__(self, url: str, log: list[str], version: str = "0") -> None:
        self.base_url = url
        self.log = log
        self.version = version
        self.down = False
        self.refuse_load = False
        self.barrier: Any = None

    def _call(self, what: str) -> None:
        self.log.append(f"{self.base_url}:{what}")
        if self.down:
            raise EngineUnavailableError(self.base_url, "connection refused")

    async def pause_generation(self, mode: str = "abort") -> None:
        self._call(f"pause:{mode}")

    async def continue_generation(self) -> None:
        self._call("continue")

    async def update_weights_from_disk(self, model_path: str, weight_version: str) -> None:
        self._call(f"load:{model_path}")
        if self.refuse_load:
            raise EngineRequestError(self.base_url, "Failed to load weights", 400)
        self.version = weight_version

    async def get_weight_version(self) -> str:
        self._call("version")
        return self.version

    async def health(self) -> bool:
        return not self.down


def coordinator(
    mode: RefreshMode, n: int = 2
) -> tuple[WeightCoordinator, list[FakeClient], list[str]]:
    log: list[str] = []
    clients = [FakeClient(f"e{i}", log) for i in range(n)]
    router = Router(
        engines=[Engine(url=c.base_url, client=c) for c in clients],  # type: ignore[arg-type]
        metrics=AdapterMetrics(),
    )
    weights = WeightCoordinator(
        router, RefreshGate(), router.metrics, 0, 5, check_model_path=False, mode=mode
    )
    # Token mode hands the clients the barrier their interrupted calls wait at.
    assert all((c.barrier is weights.barrier) == (mode is RefreshMode.TOKEN) for c in clients)
    return weights, clients, log


def healthy(weights: WeightCoordinator) -> list[str]:
    return [e.url for e in weights.router.healthy()]


@pytest.mark.parametrize("mode", list(RefreshMode))
def test_an_engine_that_fails_to_load_leaves_rotation_and_returns_with_current_weights(
    mode: RefreshMode,
) -> None:
    async def scenario() -> None:
        weights, (_, e1), log = coordinator(mode)
        e1.refuse_load = True
        summary = await weights.refresh("/w/v1", 1)
        assert summary["mode"] == str(mode)
        assert summary["engines"]["e0"]["ok"] and not summary["engines"]["e1"]["ok"]
        assert weights.state.version == 1 and healthy(weights) == ["e0"]
        assert weights.gate.is_open
        if mode is RefreshMode.TOKEN:
            # Paused before loading, continued after (the failed engine too), then the barrier
            # lifts and names the failed engine, so its interrupted calls fail over.
            order = [entry for entry in log if "version" not in entry]
            assert order[:2] == ["e0:pause:abort", "e1:pause:abort"]
            assert order[-2:] == ["e0:continue", "e1:continue"]
            assert weights.barrier.failed == frozenset({"e1"}) and not weights.barrier.paused
        else:
            assert not any("pause" in entry for entry in log)
        # The engine can load again: readmission loads the current weights, then admits it.
        e1.refuse_load = False
        await weights.readmit(weights.router.engine("e1"))
        assert e1.version == "1" and healthy(weights) == ["e0", "e1"]
        assert log[-2:] == ["e1:load:/w/v1", "e1:version"]

    asyncio.run(scenario())


def test_an_engine_down_at_the_pause_leaves_rotation_and_the_others_refresh() -> None:
    async def scenario() -> None:
        weights, (_, e1), log = coordinator(RefreshMode.TOKEN)
        e1.down = True
        summary = await weights.refresh("/w/v1", 1)
        assert set(summary["engines"]) == {"e0"}  # never asked to load
        assert weights.state.version == 1 and healthy(weights) == ["e0"]
        assert "e1:load:/w/v1" not in log
        # Restarted (serving its initial weights): synced to version 1 before it joins.
        e1.down, e1.version = False, "0"
        await weights.readmit(weights.router.engine("e1"))
        assert e1.version == "1" and healthy(weights) == ["e0", "e1"]

    asyncio.run(scenario())


def test_a_restarted_engine_after_a_distributed_only_publish_stays_out_until_a_disk_copy() -> None:
    """Without a disk copy of the current version there is nothing to sync from: the engine is
    not admitted serving old weights; the next version published with a disk copy brings it in."""

    async def scenario() -> None:
        weights, (_, e1), _ = coordinator(RefreshMode.TOKEN)
        weights.router.mark_unhealthy(weights.router.engine("e1"), "test: restarted")

        async def broadcast(engine: Engine) -> dict[str, Any]:  # the distributed transport
            engine.client.version = "1"  # type: ignore[attr-defined]
            return {"ok": True, "load_s": 0.0}

        await weights.refresh(None, 1, loader=broadcast)
        engine = weights.router.engine("e1")
        await weights.readmit(engine)
        assert healthy(weights) == ["e0"] and e1.version == "0"
        assert "no disk copy" in engine.last_error
        await weights.refresh("/w/v2", 2)  # export_to_disk: the recovery path
        await weights.readmit(engine)
        assert e1.version == "2" and healthy(weights) == ["e0", "e1"]

    asyncio.run(scenario())


@pytest.mark.parametrize("mode", list(RefreshMode))
def test_no_engine_loading_is_a_502_and_the_version_stays(mode: RefreshMode) -> None:
    async def scenario() -> None:
        weights, clients, log = coordinator(mode)
        for c in clients:
            c.refuse_load = True
        with pytest.raises(APIError) as refused:
            await weights.refresh("/w/v1", 1)
        assert refused.value.status == 502
        assert weights.state.version == 0 and weights.gate.is_open
        if mode is RefreshMode.TOKEN:
            assert log.count("e0:continue") == 1 and log.count("e1:continue") == 1
            assert weights.barrier.failed == frozenset({"e0", "e1"})

    asyncio.run(scenario())


def test_a_stale_version_is_refused_before_anything_is_paused() -> None:
    async def scenario() -> None:
        weights, _, log = coordinator(RefreshMode.TOKEN)
        await weights.refresh("/w/v1", 1)
        log.clear()
        for version in (1, 0):
            with pytest.raises(APIError) as refused:
                await weights.refresh("/w/again", version)
            assert refused.value.status == 409
        assert log == [] and weights.barrier.epoch == 1

    asyncio.run(scenario())
