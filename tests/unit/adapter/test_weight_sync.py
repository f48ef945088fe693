"""The distributed refresh (adapter.weight_sync) and the load confirmation of adapter.weights,
against fake engine clients that keep SGLang 0.5.23's rules (no processes; the conformance tier
in tests/conformance runs the same paths through SGLang's own code):

* ``update_weights_from_distributed`` is refused outside ``/begin_weight_update`` ..
  ``/end_weight_update``, before receiving anything;
* buckets apply one by one (a refusal midway leaves the engine with a mix of two versions);
* the version is recorded, then the cache flushed: a busy engine answers failure with the new
  weights loaded;
* ``/get_weights_by_name`` answers 400 for Qwen3-class models;
* a paused engine holds every new ``/generate`` until ``/continue_generation`` (the fake fails
  the test instead of hanging).
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
from adapter.weight_check import LogprobProbe, WeightProbe
from adapter.weight_sync import Bucket, DistributedRefreshRequest, DistributedWeights
from adapter.weights import RefreshGate, WeightCoordinator

FLUSH_REFUSED = (
    "Weights were updated, but the cache was not flushed because requests are still running "
    "or queued. Retract or finish them, then call /flush_cache."
)
PROBE_LOGPROB = -2.5
LOGPROBS = LogprobProbe(input_ids=(5, 17, 3), logprobs=(PROBE_LOGPROB, PROBE_LOGPROB))


class SGLangLike:
    """An engine's control calls under SGLang 0.5.23's rules, recorded in a shared log."""

    def __init__(self, url: str, log: list[str]) -> None:
        self.base_url = url
        self.log = log
        self.version = "0"
        self.weights: dict[str, int] = {"a": 0, "b": 0, "c": 0}  # name -> version it holds
        self.session = False
        self.groups: set[str] = set()
        self.refuse_bucket: int | None = None
        self.busy_flushes = 0  # flushes refused before one succeeds
        self.reads_weights = False  # Qwen3: /get_weights_by_name answers 400
        self.barrier: Any = None
        self._bucket = 0
        self.paused = False
        self.logprob_shift = 0.0  # another model: its logprobs differ by this much
        self.scoring_error: Exception | None = None

    def _log(self, what: str) -> None:
        self.log.append(f"{self.base_url}:{what}")

    async def begin_weight_update(self) -> None:
        self._log("begin")
        if self.session:
            raise EngineRequestError(self.base_url, "a weight-update session is already open", 400)
        self.session, self._bucket = True, 0

    async def end_weight_update(self) -> None:
        self._log("end")
        if not self.session:
            raise EngineRequestError(self.base_url, "no weight-update session is open", 400)
        self.session = False

    async def init_weights_update_group(self, *args: Any) -> None:
        group = args[4]
        if group in self.groups:
            raise EngineRequestError(self.base_url, "group name already created", 400)
        self.groups.add(group)

    async def destroy_weights_update_group(self, group_name: str) -> None:
        self._log(f"destroy:{group_name}")
        if group_name not in self.groups:
            raise EngineRequestError(self.base_url, "The group does not exist.", 400)
        self.groups.remove(group_name)

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        weight_version: str | None = None,
        flush_cache: bool = True,
    ) -> None:
        index = self._bucket
        self._bucket += 1
        self._log(f"bucket{index}:v={weight_version}:flush={flush_cache}")
        if not self.session:
            raise EngineRequestError(self.base_url, "must run between begin and end", 400)
        if self.refuse_bucket == index:
            raise EngineRequestError(self.base_url, "Failed to update parameter online", 400)
        target = int(weight_version) if weight_version else -1
        for name in names:
            self.weights[name] = target  # one by one; -1: "the version being sent"
        if weight_version is not None:
            self.weights = {
                n: int(weight_version) if v == -1 else v for n, v in self.weights.items()
            }
            await self._flush_after_load(flush_cache, weight_version)

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str | None = None
    ) -> None:
        self._log(f"disk:{model_path}")
        self.weights = {n: int(weight_version or 0) for n in self.weights}
        await self._flush_after_load(True, weight_version)

    async def _flush_after_load(self, flush: bool, version: str | None) -> None:
        """The scheduler serves the new weights already; the version /model_info names moves
        only when the call succeeds (SGLang's tokenizer manager)."""
        if flush and not await self.flush_cache():
            raise EngineRequestError(self.base_url, FLUSH_REFUSED, 400)
        self.version = version or self.version

    async def update_weight_version(self, version: str) -> None:
        self._log(f"set_version:{version}")
        self.version = version

    async def flush_cache(self) -> bool:
        self._log("flush")
        if self.busy_flushes > 0:
            self.busy_flushes -= 1
            return False
        return True

    async def get_weight_version(self) -> str:
        return self.version

    async def get_weights_by_name(self, name: str, size: int) -> list[float]:
        if not self.reads_weights:
            raise EngineRequestError(self.base_url, "Get parameter by name failed", 400)
        return [float(self.weights.get(name, -9))] * size

    async def input_logprobs(self, input_ids: list[int]) -> list[Any]:
        self._log("score")
        if self.paused:
            raise AssertionError("a paused SGLang holds a new /generate until it continues")
        if self.scoring_error is not None:
            raise self.scoring_error
        rest = [[PROBE_LOGPROB - self.logprob_shift, t, None] for t in input_ids[1:]]
        return [[None, input_ids[0], None], *rest]

    async def health(self) -> bool:
        return True

    async def pause_generation(self, mode: str = "abort") -> None:
        self._log(f"pause:{mode}")
        self.paused = True

    async def continue_generation(self) -> None:
        self._log("continue")
        self.paused = False

    async def tp_size(self) -> int:
        return 1

    def mixed(self) -> bool:
        return len(set(self.weights.values())) > 1


def stack(
    n: int = 2, mode: RefreshMode = RefreshMode.STEP
) -> tuple[DistributedWeights, list[SGLangLike], list[str]]:
    log: list[str] = []
    clients = [SGLangLike(f"e{i}", log) for i in range(n)]
    router = Router(
        engines=[Engine(url=c.base_url, client=c) for c in clients],  # type: ignore[arg-type]
        metrics=AdapterMetrics(),
    )
    weights = WeightCoordinator(
        router, RefreshGate(), router.metrics, 0, 5, check_model_path=False, mode=mode
    )
    sync = DistributedWeights(router, weights)
    sync.groups["g"] = [c.base_url for c in clients]
    for client in clients:
        client.groups.add("g")
    return sync, clients, log


def version_request(version: int = 1, model_path: str | None = None, **extra: Any) -> Any:
    buckets = [Bucket(names=[n], dtypes=["float32"], shapes=[[2]]) for n in ("a", "b", "c")]
    return DistributedRefreshRequest(
        version=version, group_name="g", buckets=buckets, model_path=model_path, **extra
    )


def of(log: list[str], url: str) -> list[str]:
    return [e.split(":", 1)[1] for e in log if e.startswith(f"{url}:")]


@pytest.mark.parametrize("mode", list(RefreshMode))
def test_a_version_is_one_session_per_engine_and_flushes_once(mode: RefreshMode) -> None:
    async def scenario() -> None:
        sync, clients, log = stack(mode=mode)
        summary = await sync.refresh(version_request())
        assert summary["broadcast_abandoned"] is False
        assert sync.coordinator.state.version == 1
        for client in clients:
            steps = [s for s in of(log, client.base_url) if not s.startswith(("pause", "cont"))]
            assert steps == [
                "begin",
                "bucket0:v=None:flush=False",
                "bucket1:v=None:flush=False",
                "bucket2:v=1:flush=True",
                "flush",
                "end",
            ]
            assert client.version == "1" and not client.mixed() and not client.session
        assert all(r["ok"] for r in summary["engines"].values())

    asyncio.run(scenario())


def test_buckets_go_in_lock_step_and_a_refusal_stops_every_engine_then_disk_repairs() -> None:
    async def scenario() -> None:
        sync, (e0, e1), log = stack()
        e1.refuse_bucket = 1
        summary = await sync.refresh(version_request(model_path="/w/v1"))
        assert summary["broadcast_abandoned"] is True and summary["abandoned_at_bucket"] == 1
        # no engine got bucket 2: the trainer's broadcast of it is abandoned, not waited for
        assert not any("bucket2" in entry for entry in log)
        for client in (e0, e1):
            steps = of(log, client.base_url)
            assert steps.index("end") < steps.index("destroy:g") < steps.index("disk:/w/v1")
            assert client.version == "1" and not client.mixed() and not client.session
        assert all(r["ok"] and r["repaired_from_disk"] for r in summary["engines"].values())
        assert "g" not in sync.groups  # the trainer forms the group again next time
        assert sync.coordinator.state.version == 1
        assert [e.url for e in sync.router.healthy()] == ["e0", "e1"]

    asyncio.run(scenario())


def test_without_a_disk_copy_a_mixed_engine_stays_out_until_a_reload() -> None:
    async def scenario() -> None:
        sync, (e0, e1), _ = stack()
        e1.refuse_bucket = 1
        with pytest.raises(APIError) as refused:
            await sync.refresh(version_request())
        assert refused.value.status == 502 and "abandoned at bucket 1" in refused.value.message
        assert e0.mixed() and e0.version == "0"  # SGLang applied bucket 0: a mix
        coordinator = sync.coordinator
        assert coordinator.needs_reload == {"e0", "e1"} and not coordinator.router.healthy()
        # It reports version 0 -- the current one -- but must not serve before a reload:
        await coordinator.readmit(coordinator.router.engine("e0"))
        assert not coordinator.router.engine("e0").healthy
        # A version with a disk copy arrives (through another engine): readmission reloads it.
        coordinator.state.model_path, coordinator.state.version = "/w/v2", 2
        await coordinator.readmit(coordinator.router.engine("e0"))
        assert coordinator.router.engine("e0").healthy and not e0.mixed() and e0.version == "2"

    asyncio.run(scenario())


def test_an_engine_that_cannot_begin_gets_no_bucket_at_all() -> None:
    async def scenario() -> None:
        sync, (_, e1), log = stack()
        e1.session = True  # a session left open by an adapter that died

        async def refuse() -> None:
            raise EngineRequestError("e1", "internal", 400)

        e1.end_weight_update = refuse  # type: ignore[method-assign]
        summary = await sync.refresh(version_request(model_path="/w/v1"))
        assert summary["abandoned_at_bucket"] == 0
        assert not any("bucket" in entry for entry in log)
        assert summary["engines"]["e0"]["ok"] and summary["engines"]["e1"]["ok"]  # from disk

    asyncio.run(scenario())


def test_a_session_left_open_is_ended_and_begun_again() -> None:
    async def scenario() -> None:
        sync, (e0, _), log = stack()
        e0.session = True
        summary = await sync.refresh(version_request())
        assert summary["broadcast_abandoned"] is False
        assert of(log, "e0")[:3] == ["begin", "end", "begin"]

    asyncio.run(scenario())


@pytest.mark.parametrize("transport", ["disk", "distributed"])
def test_a_load_answered_as_failed_only_for_its_flush_is_a_load_and_flushed_again(
    transport: str,
) -> None:
    async def scenario() -> None:
        sync, (e0, _), log = stack()
        e0.busy_flushes = 2  # refused at the load, refused once more, then flushed
        if transport == "disk":
            summary = await sync.coordinator.refresh("/w/v1", 1)
        else:
            summary = await sync.refresh(version_request())
        report = summary["engines"]["e0"]
        assert report["ok"] and report["flushed_again"] and report["version"] == "1"
        assert of(log, "e0").count("flush") == 3 and "set_version:1" in of(log, "e0")
        assert [e.url for e in sync.router.healthy()] == ["e0", "e1"]

    asyncio.run(scenario())


def test_a_cache_that_never_flushes_keeps_the_engine_out_until_readmission_flushes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("adapter.weights.FLUSH_RETRY_S", 0.001)

    async def scenario() -> None:
        sync, (e0, _), log = stack()
        e0.busy_flushes = 100
        summary = await sync.coordinator.refresh("/w/v1", 1)
        assert not summary["engines"]["e0"]["ok"] and "older weights" in str(summary)
        assert sync.coordinator.needs_flush == {"e0": 1}
        e0.busy_flushes = 0
        await sync.coordinator.readmit(sync.router.engine("e0"))
        assert sync.router.engine("e0").healthy and of(log, "e0")[-2:] == ["flush", "set_version:1"]
        assert e0.version == "1" and not any("disk" in s for s in of(log, "e0")[-2:])

    asyncio.run(scenario())


def test_an_engine_that_does_not_read_weights_back_stays_in_rotation() -> None:
    async def scenario() -> None:
        sync, (_, e1), _ = stack()
        e1.reads_weights = True
        probes = (WeightProbe(name="a", values=(1.0, 1.0)),)
        summary = await sync.refresh(version_request(probes=probes))
        unverified, checked = summary["engines"]["e0"], summary["engines"]["e1"]
        assert unverified["ok"] and "Get parameter by name failed" in unverified["unverifiable"]
        assert checked["ok"] and checked["probes_checked"] == 1 and "unverifiable" not in checked
        assert [e.url for e in sync.router.healthy()] == ["e0", "e1"]
        # on an engine that reads weights back, a value that differs is still a failed load
        wrong = (WeightProbe(name="a", values=(5.0,)),)
        summary = await sync.coordinator.refresh("/w/v2", 2, probes=wrong)
        assert summary["engines"]["e0"]["ok"]  # unverifiable
        assert (
            not summary["engines"]["e1"]["ok"]
            and "a[0] is 2.0" in summary["engines"]["e1"]["error"]
        )

    asyncio.run(scenario())


def test_forming_a_group_first_makes_the_engines_leave_an_old_one_of_that_name() -> None:
    async def scenario() -> None:
        from adapter.weight_sync import GroupRequest

        sync, (e0, _), log = stack()
        request = GroupRequest(
            master_address="127.0.0.1", master_port=1234, world_size=3, group_name="g"
        )
        answer = await sync.init_group(request)
        assert answer["ranks"] == {"e0": [1], "e1": [2]}
        assert of(log, "e0") == ["destroy:g"] and e0.groups == {"g"}

    asyncio.run(scenario())


@pytest.mark.parametrize("mode", list(RefreshMode))
@pytest.mark.parametrize("transport", ["disk", "distributed"])
def test_the_logprob_probe_gap_is_reported_and_another_model_fails_the_load(
    mode: RefreshMode, transport: str
) -> None:
    """Works on engines that do not read weights back (Qwen3): their logprobs of the probe
    sequence against the trainer's. In token mode the engines are paused while they load, and
    a paused SGLang holds a new /generate: the check runs once they continue, before the gate
    reopens."""

    async def scenario() -> None:
        sync, (e0, e1), log = stack(mode=mode)
        e0.logprob_shift = 0.01  # bfloat16 drift: reported, not failed
        e1.logprob_shift = 3.0  # another model
        if transport == "disk":
            summary = await sync.coordinator.refresh("/w/v1", 1, logprob_probe=LOGPROBS)
        else:
            request = version_request(model_path="/w/v1", logprob_probe=LOGPROBS)
            summary = await sync.refresh(request)
        good, bad = summary["engines"]["e0"], summary["engines"]["e1"]
        assert good["ok"] and good["logprob_probe_gap"] == pytest.approx(0.01)
        assert "logprob_probe_unverifiable" not in good
        assert not bad["ok"] and bad["logprob_probe_gap"] == pytest.approx(3.0)
        assert "3.000 nats" in bad["error"] and "logprob" in bad["error"]
        assert [e.url for e in sync.router.healthy()] == ["e0"]
        coordinator = sync.coordinator
        assert coordinator.state.version == 1 and coordinator.state.logprob_probe == LOGPROBS
        if mode is RefreshMode.TOKEN:
            steps = of(log, "e0")
            assert steps.index("continue") < steps.index("score")
            assert coordinator.barrier.failed == frozenset({"e1"})
        # readmission reloads the current version and checks it the same way
        await coordinator.readmit(sync.router.engine("e1"))
        assert not sync.router.engine("e1").healthy
        assert "3.000 nats" in str(sync.router.engine("e1").last_error)
        e1.logprob_shift = 0.0
        await coordinator.readmit(sync.router.engine("e1"))
        assert sync.router.engine("e1").healthy

    asyncio.run(scenario())


def test_token_mode_fails_the_refresh_when_no_engine_passes_the_logprob_check() -> None:
    async def scenario() -> None:
        sync, clients, _ = stack(mode=RefreshMode.TOKEN)
        for client in clients:
            client.logprob_shift = 5.0
        with pytest.raises(APIError) as refused:
            await sync.coordinator.refresh("/w/v1", 1, logprob_probe=LOGPROBS)
        assert refused.value.status == 502 and "nats" in refused.value.message
        assert sync.coordinator.state.version == 0 and not sync.router.healthy()
        assert sync.coordinator.gate.is_open and not any(c.paused for c in clients)

    asyncio.run(scenario())


def test_an_engine_that_refuses_the_logprob_request_is_unverifiable_a_down_one_fails() -> None:
    async def scenario() -> None:
        sync, (e0, e1), _ = stack()
        e0.scoring_error = EngineRequestError("e0/generate", "logprob_start_len unsupported", 400)
        e1.scoring_error = EngineUnavailableError("e1/generate", "HTTP 503: overloaded", 503)
        summary = await sync.coordinator.refresh("/w/v1", 1, logprob_probe=LOGPROBS)
        refused, down = summary["engines"]["e0"], summary["engines"]["e1"]
        assert (
            refused["ok"]
            and "logprob_start_len unsupported" in (refused["logprob_probe_unverifiable"])
        )
        assert "logprob_probe_gap" not in refused
        assert not down["ok"] and "logprob check after loading" in down["error"]

    asyncio.run(scenario())
