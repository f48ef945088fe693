"""Agent-step weight refresh: a gate in front of ``/generate`` and the refresh procedure.

Protocol of ``POST /admin/weights {model_path, version}`` (DESIGN.md, data flow step 7):

0. check ``model_path`` (:mod:`adapter.checkpoint`): a path that cannot load is a 400 before
   anything is closed, drained or unloaded;
1. close the gate: new generate calls wait at it (they are not failed, and nothing is aborted);
2. drain: wait until every generate call already in flight has returned -- those are the current
   agent steps of running trajectories, and they finish on the old weights;
3. make every healthy engine ``update_weights_from_disk(model_path, weight_version=version)``,
   concurrently, then verify each one reports that version;
4. record the new version, reopen the gate; waiting calls proceed on the new weights.

In ``token`` mode (``adapter.refresh_mode``) step 2 is replaced by a pause: every engine in
rotation gets SGLang's ``/pause_generation {"mode": "abort"}``, which returns each running
request's partial output; the engines load (step 3) and ``/continue_generation``, the gate
reopens, and every interrupted request is continued from its prefix under the new weights by the
engine client (:mod:`adapter.continuation`). How long the gate stays closed then depends on the
load, not on how long the agents' steps are.

Engines that fail to load are taken out of rotation; the health prober loads the current
weights into them before they serve again. If no engine loaded the weights, the version is left
unchanged and the refresh reports failure. A turn records the weight version the engine reported
for it, so every turn carries the version that produced it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from adapter.checkpoint import checkpoint_problem
from adapter.config import RefreshMode
from adapter.continuation import RefreshBarrier
from adapter.engines.sglang import EngineRequestError
from adapter.errors import APIError
from adapter.metrics import AdapterMetrics
from adapter.routing import Engine, Router
from adapter.weight_check import LogprobProbe, WeightProbe, check_logprob_probe, check_probes

log = logging.getLogger("adapter.weights")

# Loads the new weights into one engine: {"ok": bool, "error"?: str, "load_s": float, ...}.
EngineLoader = Callable[[Engine], Awaitable[dict[str, Any]]]
# Loads the new weights into all the engines in rotation together (a distributed version: every
# engine receives the same broadcasts in lock step); each engine's result by URL.
AllLoader = Callable[[list[Engine]], Awaitable[dict[str, dict[str, Any]]]]

# A load that SGLang answers as failed although the weights are in ("Weights were updated, but
# the cache was not flushed because requests are still running or queued"): the cache is
# flushed again, a few times, as the running requests drain.
FLUSH_ATTEMPTS = 5
FLUSH_RETRY_S = 0.2
# How SGLang 0.5.23 begins that answer's message (SchedulerWeightUpdaterManager.
# flush_cache_after_weight_update); the conformance tier checks it against SGLang's code.
UNFLUSHED = "Weights were updated, but the cache was not flushed"


def each_engine(loader: EngineLoader) -> AllLoader:
    """An :data:`AllLoader` that runs ``loader`` on every engine concurrently."""

    async def load_all(engines: list[Engine]) -> dict[str, dict[str, Any]]:
        results = await asyncio.gather(*(loader(e) for e in engines))
        return {e.url: r for e, r in zip(engines, results, strict=True)}

    return load_all


async def flush_until_done(engine: Engine) -> str | None:
    """``/flush_cache`` until the engine flushes (it refuses while requests run or wait);
    None once flushed, else why not."""
    for attempt in range(FLUSH_ATTEMPTS):
        try:
            if await engine.client.flush_cache():
                return None
        except Exception as exc:
            return f"flush_cache failed: {exc}"
        await asyncio.sleep(FLUSH_RETRY_S * (attempt + 1))
    return f"flush_cache refused {FLUSH_ATTEMPTS} times (requests running or queued)"


class RefreshGate:
    """Admission gate for generate calls; closing it and draining in-flight calls."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.inflight = 0
        self.waiting = 0

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[float]:
        """Hold a generate slot; yields the seconds spent waiting at a closed gate."""
        started = time.perf_counter()
        self.waiting += 1
        try:
            while not self._open.is_set():
                await self._open.wait()
        finally:
            self.waiting -= 1
        # No await between the check above and this increment: a closing refresh either saw
        # this call in flight or will make it wait.
        self.inflight += 1
        self._idle.clear()
        try:
            yield time.perf_counter() - started
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

    def close(self) -> None:
        self._open.clear()

    def reopen(self) -> None:
        self._open.set()

    async def drain(self, timeout_s: float) -> None:
        await asyncio.wait_for(self._idle.wait(), timeout_s)


def parse_version(raw: str | None) -> int | None:
    """An engine's ``weight_version`` string as swerl's integer version (None if not one)."""
    if raw is None:
        return None
    try:
        return int(str(raw).strip())
    except ValueError:
        return None


@dataclass
class WeightState:
    version: int
    model_path: str | None = None  # weights of `version`, once a refresh loaded them
    weights_sha256: str | None = None  # the checksum the refresh of `version` named, if any
    probes: tuple[WeightProbe, ...] = ()  # the spot check of `version`'s weights, if sent
    logprob_probe: LogprobProbe | None = None  # the trainer's logprobs under `version`, if sent
    refreshes: int = 0
    last_refresh: dict[str, Any] = field(default_factory=dict)


class WeightCoordinator:
    """Runs refreshes and re-admits engines with the current weights."""

    def __init__(
        self,
        router: Router,
        gate: RefreshGate,
        metrics: AdapterMetrics,
        initial_version: int,
        drain_timeout_s: float,
        check_model_path: bool = True,
        mode: RefreshMode = RefreshMode.STEP,
    ) -> None:
        self.router = router
        self.mode = RefreshMode(mode)
        # Token mode: the engine clients continue the calls a refresh's pause interrupted.
        self.barrier = RefreshBarrier()
        if self.mode is RefreshMode.TOKEN:
            for engine in router.engines:
                engine.client.barrier = self.barrier
        self.gate = gate
        self.metrics = metrics
        self.state = WeightState(version=initial_version)
        self.drain_timeout_s = drain_timeout_s
        self.check_model_path = check_model_path
        # One refresh or readmission at a time; `_refresh_pending` makes a second refresh fail
        # fast (409) instead of queueing behind the first.
        self._lock = asyncio.Lock()
        self._refresh_pending = False
        # Engines whose cache still holds KV of older weights (a flush refused after a load),
        # and engines whose weights are a mix of two versions (a distributed version abandoned
        # midway: SGLang applies buckets one by one): readmission flushes, resp. reloads them
        # from disk, before they serve again, whatever version they report.
        self.needs_flush: dict[str, int] = {}  # engine URL -> the version loaded unflushed
        self.needs_reload: set[str] = set()
        # Token mode: engines are paused (SGLang holds every new /generate) while they load, so
        # the logprob probe of a load waits until they continue (:meth:`_check_after_pause`).
        self._engines_paused = False
        metrics.weight_version.set(float(initial_version))

    @property
    def refreshing(self) -> bool:
        return self._refresh_pending

    def version_of(self, engine_reported: str | None) -> int:
        """Version to record for a turn: what the engine reported, else the current one."""
        parsed = parse_version(engine_reported)
        return self.state.version if parsed is None else parsed

    async def discover(self) -> None:
        """At start-up: adopt the engines' version (the highest numeric one reported)."""
        versions: list[int] = []
        for engine in self.router.engines:
            try:
                reported = await engine.client.get_weight_version()
            except Exception as exc:
                self.router.mark_unhealthy(engine, f"start-up probe: {exc}")
                continue
            engine.weight_version = reported
            parsed = parse_version(reported)
            if parsed is not None:
                versions.append(parsed)
        if versions:
            self.state.version = max(versions)
            if len(set(versions)) > 1:
                log.warning("engines report different weight versions: %s", sorted(set(versions)))
        self.metrics.weight_version.set(float(self.state.version))

    async def _load(
        self,
        engine: Engine,
        model_path: str,
        version: int,
        probes: tuple[WeightProbe, ...] = (),
        logprob_probe: LogprobProbe | None = None,
    ) -> dict[str, Any]:
        started = time.perf_counter()
        load_error: str | None = None
        try:
            await engine.client.update_weights_from_disk(model_path, weight_version=str(version))
        except EngineRequestError as exc:  # refused -- or loaded with its cache not flushed
            load_error = str(exc)
        except Exception as exc:
            return {"ok": False, "error": str(exc), "load_s": time.perf_counter() - started}
        out: dict[str, Any] = {"load_s": time.perf_counter() - started}
        return await self.confirm(engine, version, probes, out, load_error, logprob_probe)

    async def confirm(
        self,
        engine: Engine,
        version: int,
        probes: tuple[WeightProbe, ...],
        out: dict[str, Any],
        load_error: str | None = None,
        logprob_probe: LogprobProbe | None = None,
    ) -> dict[str, Any]:
        """An engine's load result after its last load call (``load_error``: that call's
        refusal, if any). SGLang 0.5.23 records the new version in its scheduler, then flushes
        the cache, and answers failure when the flush is refused (requests running or queued)
        although the weights are in -- and then its ``/model_info`` still names the old
        version (the tokenizer side records a version only on success). Such a load is a load:
        the cache is flushed again, then the engine is told the version
        (``/update_weight_version``); the version it then reports decides, as for any load."""
        loaded_unflushed = load_error is not None and UNFLUSHED in load_error
        if loaded_unflushed:
            problem = await flush_until_done(engine)
            out = {**out, "flushed_again": True}
            if problem is not None:
                self.needs_flush[engine.url] = version
                error = f"loaded version {version}; its cache holds older weights' KV: {problem}"
                return {**out, "ok": False, "error": error}
            try:
                await engine.client.update_weight_version(str(version))
            except Exception as exc:
                return {**out, "ok": False, "error": f"update_weight_version: {exc}"}
        try:
            reported = await engine.client.get_weight_version()
        except Exception as exc:
            return {**out, "ok": False, "error": load_error or str(exc)}
        engine.weight_version = reported
        out = {**out, "version": reported}
        if load_error is not None and not loaded_unflushed:
            return {**out, "ok": False, "error": load_error}
        return await self.verify(engine, version, probes, out, logprob_probe)

    async def verify(
        self,
        engine: Engine,
        version: int,
        probes: tuple[WeightProbe, ...],
        out: dict[str, Any],
        logprob_probe: LogprobProbe | None = None,
    ) -> dict[str, Any]:
        """``out`` (an engine's load result) with ``ok``: the engine reports ``version``, its
        values of the ``probes`` are the publisher's, and its logprobs of the
        ``logprob_probe``'s sequence are the trainer's within ``LOGPROB_PROBE_FAIL``
        (:mod:`adapter.weight_check`; the gap is reported as ``logprob_probe_gap``). An engine
        that cannot read weights back by name (SGLang does so for a few model classes only) or
        refuses the logprob request is ``unverifiable`` for that check: ok on the others, it
        stays in rotation. While the engines are paused (token mode) the logprob check waits
        for them to continue (:meth:`_check_after_pause`)."""
        reported = out.get("version")
        if parse_version(reported) != version:
            error = f"engine reports weight_version {reported!r} after loading {version}"
            return {**out, "ok": False, "error": error}
        try:
            outcome = await check_probes(engine.client, probes)
        except Exception as exc:
            return {**out, "ok": False, "error": f"weights check after loading: {exc}"}
        if outcome.problem is not None:
            # it reports the version but holds other values: readmission reloads it
            self.needs_reload.add(engine.url)
            return {**out, "ok": False, "error": outcome.problem}
        result = {**out, "ok": True, "probes_checked": outcome.checked}
        if outcome.unverifiable is not None:
            result["unverifiable"] = outcome.unverifiable
        if logprob_probe is None:
            return result
        if self._engines_paused:
            return {**result, "logprob_probe": "after continue_generation"}
        checked = await self._check_logprobs(engine, logprob_probe, result)
        if "logprob_probe_gap" in checked and not checked["ok"]:
            self.needs_reload.add(engine.url)  # reports the version, computes something else
        return checked

    @staticmethod
    async def _check_logprobs(
        engine: Engine, probe: LogprobProbe, result: dict[str, Any]
    ) -> dict[str, Any]:
        """``result`` (an engine's verified load) after the logprob probe: its gap, or why the
        engine could not be asked, or failed when its logprobs are not the trainer's."""
        result = {k: v for k, v in result.items() if k != "logprob_probe"}
        try:
            outcome = await check_logprob_probe(engine.client, probe)
        except Exception as exc:
            return {**result, "ok": False, "error": f"logprob check after loading: {exc}"}
        if outcome.gap is not None:
            result["logprob_probe_gap"] = outcome.gap
        if outcome.problem is not None:
            return {**result, "ok": False, "error": outcome.problem}
        if outcome.unverifiable is not None:
            result["logprob_probe_unverifiable"] = outcome.unverifiable
        return result

    async def _check_after_pause(
        self,
        report: dict[str, dict[str, Any]],
        probe: LogprobProbe | None,
        model_path: str | None,
        version: int,
    ) -> None:
        """Token mode, once the engines continue: the logprob check of every engine that
        loaded; one that fails it leaves rotation (its result says why). At least one engine
        must pass (502 otherwise, as in :meth:`_load_all`)."""
        if probe is None:
            return
        pending = [
            e
            for e in self.router.engines
            if e.url in report and report[e.url]["ok"] and "logprob_probe" in report[e.url]
        ]
        checked = await asyncio.gather(
            *(self._check_logprobs(e, probe, report[e.url]) for e in pending)
        )
        for engine, result in zip(pending, checked, strict=True):
            report[engine.url] = result
            if not result["ok"]:
                if "logprob_probe_gap" in result:
                    self.needs_reload.add(engine.url)
                self.router.mark_unhealthy(engine, f"weight load: {result.get('error')}")
        if not any(r["ok"] for r in report.values()):
            raise APIError(
                502,
                f"no engine loaded {model_path} (version {version}): {report}",
                code="refresh_failed",
            )

    async def refresh(
        self,
        model_path: str | None,
        version: int,
        loader: EngineLoader | AllLoader | None = None,
        check: Callable[[list[Engine]], None] | None = None,
        weights_sha256: str | None = None,
        probes: tuple[WeightProbe, ...] = (),
        together: bool = False,
        logprob_probe: LogprobProbe | None = None,
    ) -> dict[str, Any]:
        """A refresh in the adapter's mode. ``loader`` loads one engine (default: from
        ``model_path`` on disk) -- or, with ``together``, all the engines in rotation at once
        (an :data:`AllLoader`); ``check(engines)`` validates before the gate closes (raise
        APIError to refuse). ``model_path`` may be None for a transport without a disk copy
        (no reload on readmission then). ``weights_sha256``: the checksum of the weights (the
        manifest's); a disk refresh of the version and checksum already served is a no-op."""
        if self._refresh_pending:
            raise APIError(409, "a weight refresh is already in progress", code="refresh_busy")
        self._refresh_pending = True
        try:
            async with self._lock:
                load_all = (
                    loader if together or loader is None else each_engine(loader)  # type: ignore[arg-type]
                )
                return await self._refresh_locked(
                    model_path,
                    version,
                    load_all,  # type: ignore[arg-type]
                    check,
                    weights_sha256,
                    probes,
                    logprob_probe,
                )
        finally:
            self._refresh_pending = False

    def _served_already(self, version: int, weights_sha256: str | None) -> bool:
        state = self.state
        return (
            version == state.version
            and weights_sha256 is not None
            and weights_sha256 == state.weights_sha256
        )

    async def _refresh_locked(
        self,
        model_path: str | None,
        version: int,
        loader: AllLoader | None,
        check: Callable[[list[Engine]], None] | None,
        weights_sha256: str | None = None,
        probes: tuple[WeightProbe, ...] = (),
        logprob_probe: LogprobProbe | None = None,
    ) -> dict[str, Any]:
        if loader is None and self._served_already(version, weights_sha256):
            # A trainer resumed from a checkpoint older than its last publish sends the same
            # version with the same weights again: nothing to do, nothing closed.
            return {
                "version": version,
                "mode": str(self.mode),
                "model_path": self.state.model_path,
                "weights_sha256": weights_sha256,
                "idempotent": True,
                "gate_closed_s": 0.0,
                "drain_s": 0.0,
                "load_s": 0.0,
                "engines": {},
            }
        await self._validate(model_path, version, check, weights_sha256)
        if loader is None:
            assert model_path is not None

            async def load_one(engine: Engine) -> dict[str, Any]:
                return await self._load(engine, model_path, version, probes, logprob_probe)

            loader = each_engine(load_one)

        if self.mode is RefreshMode.TOKEN:
            return await self._refresh_paused(
                loader, model_path, version, weights_sha256, probes, logprob_probe
            )
        closed_at = time.perf_counter()
        inflight_at_close = self.gate.inflight
        self.gate.close()
        try:
            drained_at = await self._drain(closed_at)
            report = await self._load_all(loader, model_path, version)
            loaded_at = time.perf_counter()
            self._adopt(version, model_path, weights_sha256, probes, logprob_probe)
        finally:
            self.gate.reopen()
        summary = {
            "version": version,
            "mode": str(self.mode),
            "model_path": model_path,
            "gate_closed_s": time.perf_counter() - closed_at,
            "drain_s": drained_at - closed_at,
            "load_s": loaded_at - drained_at,
            "inflight_at_close": inflight_at_close,
            "engines": report,
        }
        self._refreshed(summary)
        return summary

    async def _refresh_paused(
        self,
        loader: AllLoader,
        model_path: str | None,
        version: int,
        weights_sha256: str | None = None,
        probes: tuple[WeightProbe, ...] = (),
        logprob_probe: LogprobProbe | None = None,
    ) -> dict[str, Any]:
        """Token-mode refresh: close the gate (new calls wait; nothing is drained), pause the
        engines in abort mode, load, continue them, reopen. The interrupted calls are continued
        by the engine clients once the barrier lifts. A paused SGLang holds every new
        ``/generate``, so the logprob probe runs once the engines continue, before the barrier
        lifts and the gate reopens."""
        closed_at = time.perf_counter()
        inflight_at_close = self.gate.inflight
        self.gate.close()
        self.barrier.begin()
        engines = self.router.healthy()
        paused_at = loaded_at = continue_from = closed_at
        continued = False
        try:
            await self._pause_all(engines)
            paused_at = time.perf_counter()
            self._engines_paused = True
            try:
                report = await self._load_all(loader, model_path, version)
            finally:
                self._engines_paused = False
            loaded_at = continue_from = time.perf_counter()
            continued = True
            await self._continue_all(engines)
            await self._check_after_pause(report, logprob_probe, model_path, version)
            self._adopt(version, model_path, weights_sha256, probes, logprob_probe)
        finally:
            if not continued:
                continue_from = time.perf_counter()
                await self._continue_all(engines)
            self.barrier.end(frozenset(e.url for e in engines if not e.healthy))
            self.gate.reopen()
        reopened_at = time.perf_counter()
        summary = {
            "version": version,
            "mode": str(self.mode),
            "model_path": model_path,
            "gate_closed_s": reopened_at - closed_at,
            "pause_s": paused_at - closed_at,
            "continue_s": reopened_at - continue_from,
            "drain_s": 0.0,
            "load_s": loaded_at - paused_at,
            "inflight_at_close": inflight_at_close,
            "engines": report,
        }
        self._refreshed(summary)
        return summary

    def _adopt(
        self,
        version: int,
        model_path: str | None,
        weights_sha256: str | None,
        probes: tuple[WeightProbe, ...] = (),
        logprob_probe: LogprobProbe | None = None,
    ) -> None:
        self.state.version = version
        self.state.model_path = model_path  # None: no disk copy of this version
        self.state.weights_sha256 = weights_sha256
        self.state.probes = probes
        self.state.logprob_probe = logprob_probe
        self.state.refreshes += 1

    async def _pause_all(self, engines: list[Engine]) -> None:
        """``/pause_generation`` (abort) on every engine; one that cannot pause leaves rotation
        (its calls fail over to the others)."""

        async def pause(engine: Engine) -> None:
            try:
                await engine.client.pause_generation("abort")
            except Exception as exc:
                self.router.mark_unhealthy(engine, f"pause_generation: {exc}")

        await asyncio.gather(*(pause(e) for e in engines))

    async def _continue_all(self, engines: list[Engine]) -> None:
        """``/continue_generation`` on every engine paused, loaded or not (an engine out of
        rotation must not hold requests forever; readmission reloads it first)."""

        async def resume(engine: Engine) -> None:
            try:
                await engine.client.continue_generation()
            except Exception as exc:
                self.router.mark_unhealthy(engine, f"continue_generation: {exc}")

        await asyncio.gather(*(resume(e) for e in engines))

    async def _validate(
        self,
        model_path: str | None,
        version: int,
        check: Callable[[list[Engine]], None] | None,
        weights_sha256: str | None = None,
    ) -> None:
        """Everything that can refuse a refresh before the gate closes (nothing drained yet)."""
        state = self.state
        if version == state.version and weights_sha256 is not None and state.weights_sha256:
            raise APIError(
                409,
                f"version {version} is served already with other weights (weights_sha256 "
                f"{state.weights_sha256}, this refresh names {weights_sha256}); a published "
                "version never changes its weights",
                code="version_conflict",
            )
        if version <= state.version:
            raise APIError(
                409,
                f"version must increase: current is {state.version}, got {version}",
                code="stale_version",
            )
        if self.check_model_path and model_path is not None:
            problem = await asyncio.to_thread(checkpoint_problem, model_path, weights_sha256)
            if problem is not None:
                raise APIError(
                    400,
                    f"model_path {model_path!r} is not a loadable checkpoint: {problem}; "
                    "nothing was drained or unloaded",
                    code="invalid_model_path",
                    param="model_path",
                )
        if check is not None:
            check(self.router.healthy())

    async def _drain(self, closed_at: float) -> float:
        """Wait for the generate calls in flight when the gate closed; returns when they were."""
        try:
            await self.gate.drain(self.drain_timeout_s)
        except TimeoutError:
            raise APIError(
                504,
                f"{self.gate.inflight} generate calls still in flight after "
                f"{self.drain_timeout_s:.0f}s; refresh abandoned, weights unchanged",
            ) from None
        return time.perf_counter()

    async def _load_all(
        self, loader: AllLoader, model_path: str | None, version: int
    ) -> dict[str, dict[str, Any]]:
        """Load every engine in rotation; those that fail leave the rotation. At least one
        must succeed (502 otherwise). Returns each engine's result by URL."""
        engines = self.router.healthy()
        report = await loader(engines)
        for engine in engines:
            result = report[engine.url]
            if not result["ok"]:
                self.router.mark_unhealthy(engine, f"weight load: {result.get('error')}")
            else:
                self.needs_reload.discard(engine.url)
                self.needs_flush.pop(engine.url, None)
        if not any(r["ok"] for r in report.values()):
            raise APIError(
                502,
                f"no engine loaded {model_path} (version {version}): {report}",
                code="refresh_failed",
            )
        return report

    def _refreshed(self, summary: dict[str, Any]) -> None:
        self.state.last_refresh = summary
        self.metrics.weight_version.set(float(summary["version"]))
        self.metrics.gate_closed.observe(summary["gate_closed_s"])
        self.metrics.refresh_load.observe(summary["load_s"])
        log.info(
            "weights v%d loaded (%s mode): gate closed %.3fs (drain %.3fs, load %.3fs)",
            summary["version"],
            summary["mode"],
            summary["gate_closed_s"],
            summary["drain_s"],
            summary["load_s"],
        )

    async def audit(self, engine: Engine) -> None:
        """Check an engine in rotation: one that serves another version than the current one
        while that version has a disk copy (it restarted between two calls and came back on
        its start-up weights) leaves rotation; :meth:`readmit` reloads it before it serves
        again. Without a disk copy nothing could reload it, and its turns record the version
        it really serves, so it is left alone. A failed probe raises (the prober takes the
        engine out)."""
        if self._refresh_pending or self._lock.locked() or self.state.model_path is None:
            return
        reported = await engine.client.get_weight_version()
        if self._refresh_pending or self._lock.locked() or not engine.healthy:
            return  # a refresh began meanwhile: its own checks decide
        current = self.state.version
        if parse_version(reported) != current:
            engine.weight_version = reported
            self.router.mark_unhealthy(
                engine,
                f"serves weight version {reported!r}, the current is {current} (restarted?): "
                "reloaded before it serves again",
            )

    async def readmit(self, engine: Engine) -> None:
        """Probe an unhealthy engine; put it back once it serves the current weights."""
        if self._refresh_pending:
            return
        async with self._lock:
            if not await engine.client.health():
                return
            reported = await engine.client.get_weight_version()
            engine.weight_version = reported
            current = self.state
            owed = self.needs_flush.get(engine.url)
            # loaded another version than the current one (a refresh that failed everywhere)
            mixed = engine.url in self.needs_reload or owed not in (None, current.version)
            if owed == current.version and not mixed:
                # loaded the current version, its cache not flushed: its /model_info may still
                # name the version before (SGLang records it only once the load succeeded)
                problem = await flush_until_done(engine)
                if problem is not None:
                    engine.last_error = f"cache of older weights not flushed yet: {problem}"
                    return
                await engine.client.update_weight_version(str(current.version))
                reported = await engine.client.get_weight_version()
                engine.weight_version = reported
            if parse_version(reported) != current.version or mixed:
                if current.model_path is None:
                    # A distributed-only publish leaves nothing to reload from: the engine stays
                    # out until a version with a disk copy is published.
                    what = "holds other weights" if mixed else f"serves {reported!r}"
                    engine.last_error = (
                        f"{what}, current is {current.version} and it has no disk copy to "
                        "reload from (publish with distributed.export_to_disk)"
                    )
                    return
                result = await self._load(
                    engine,
                    current.model_path,
                    current.version,
                    current.probes,
                    current.logprob_probe,
                )
                if not result["ok"]:
                    engine.last_error = f"reload on readmission failed: {result.get('error')}"
                    return
            self.needs_reload.discard(engine.url)
            self.needs_flush.pop(engine.url, None)
            self.router.mark_healthy(engine)
