"""Engine selection, stickiness, failure handling and health probing.

* A trajectory sticks to the engine that served its first turn (its KV prefix cache is there).
* A new trajectory (and every untracked call) goes to the least busy healthy engine: fewest
  generate calls in flight, then fewest trajectories assigned. With the ``sample_index``
  placement, a trajectory opened with a sample index ``k`` is pinned at open to engine
  ``k mod n`` instead (deterministic: which sample of a group runs where does not depend on
  timing); it moves only if that engine fails, as any sticky trajectory does.
* An engine that fails a call (connection refused or reset, timeout, 5xx) is marked unhealthy
  and taken out of rotation; a background task probes it (``/health`` + weight version) and puts
  it back when it answers with the current weights, loading them first if a refresh happened
  while it was away.
* A call that failed before any token reached the client is retried on another healthy engine
  (``engine_attempts`` engines at most); the trajectory then sticks to the engine that answered.
* When *every* engine is out of rotation, a call waits (at most ``outage_wait_s``) for the
  prober to re-admit one instead of failing at once: one transient timeout on the only engine
  must not abort every trajectory in flight.
  When no engine can serve it, :class:`NoEngineAvailableError` is raised (the app answers 503
  and marks the trajectory as an infrastructure failure).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from adapter.config import Placement
from adapter.engines.sglang import (
    EngineRequestError,
    EngineUnavailableError,
    GenerateResult,
    SamplingParams,
    SGLangClient,
)
from adapter.errors import APIError
from adapter.metrics import AdapterMetrics
from services.protocol import TrajectoryMeta

log = logging.getLogger("adapter.routing")


def sample_index_of(meta: TrajectoryMeta) -> int | None:
    """The sample index a worker opens a trajectory with (``extra.sample_index``), if any."""
    index = meta.extra.get("sample_index")
    if index is None:
        return None
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise APIError(
            400, f"extra.sample_index must be an integer >= 0, got {index!r}", param="extra"
        )
    return index


class NoEngineAvailableError(Exception):
    """Every engine that could serve the call failed or is out of rotation."""


@dataclass
class Engine:
    url: str
    client: SGLangClient
    healthy: bool = True
    inflight: int = 0
    assigned: int = 0  # trajectories sticking to this engine
    last_error: str = ""
    failures: int = 0
    unhealthy_since: float = 0.0
    weight_version: str | None = None  # last version the engine reported

    def load(self) -> tuple[int, int]:
        return (self.inflight, self.assigned)


@dataclass
class Router:
    engines: list[Engine]
    metrics: AdapterMetrics
    attempts: int = 3
    outage_wait_s: float = 0.0  # longest wait for a re-admission when every engine is out
    sticky: dict[str, str] = field(default_factory=dict)  # trajectory id -> engine url
    placement: Placement = Placement.LEAST_BUSY

    def __post_init__(self) -> None:
        self._by_url = {e.url: e for e in self.engines}
        for engine in self.engines:
            self._publish(engine)

    def _publish(self, engine: Engine) -> None:
        self.metrics.engine_healthy.labels(engine=engine.url).set(1.0 if engine.healthy else 0.0)
        self.metrics.engine_inflight.labels(engine=engine.url).set(float(engine.inflight))

    def healthy(self) -> list[Engine]:
        return [e for e in self.engines if e.healthy]

    def engine(self, url: str) -> Engine:
        return self._by_url[url]

    def pick(
        self, trajectory_id: str | None, exclude: set[str] | frozenset[str] = frozenset()
    ) -> Engine | None:
        """The engine for the next call of ``trajectory_id`` (None: an untracked call)."""
        if trajectory_id is not None:
            url = self.sticky.get(trajectory_id)
            if url is not None:
                engine = self._by_url.get(url)
                if engine is not None and engine.healthy and url not in exclude:
                    return engine
        candidates = [e for e in self.engines if e.healthy and e.url not in exclude]
        if not candidates:
            return None
        return min(candidates, key=Engine.load)

    def placement_index(self, meta: TrajectoryMeta) -> int | None:
        """The sample index a trajectory being opened is placed by: None under ``least_busy``
        (whatever its metadata holds) or without one; a malformed one is a 400."""
        if self.placement is not Placement.SAMPLE_INDEX:
            return None
        return sample_index_of(meta)

    def place(self, trajectory_id: str, sample_index: int | None) -> None:
        """At open: pin the trajectory to engine ``sample_index mod n`` (from
        :meth:`placement_index`; None: placed at its first call, least busy)."""
        if sample_index is not None:
            self.stick(trajectory_id, self.engines[sample_index % len(self.engines)])

    def stick(self, trajectory_id: str, engine: Engine) -> None:
        previous = self.sticky.get(trajectory_id)
        if previous == engine.url:
            return
        if previous is not None and previous in self._by_url:
            self._by_url[previous].assigned -= 1
        self.sticky[trajectory_id] = engine.url
        engine.assigned += 1

    def forget(self, trajectory_id: str) -> None:
        url = self.sticky.pop(trajectory_id, None)
        if url is not None and url in self._by_url:
            self._by_url[url].assigned -= 1

    def mark_unhealthy(self, engine: Engine, reason: str) -> None:
        if engine.healthy:
            log.warning("engine %s marked unhealthy: %s", engine.url, reason)
            engine.unhealthy_since = time.monotonic()
        engine.healthy = False
        engine.last_error = reason
        engine.failures += 1
        self.metrics.engine_failures.labels(engine=engine.url).inc()
        self._publish(engine)

    def mark_healthy(self, engine: Engine) -> None:
        if not engine.healthy:
            log.info("engine %s back in rotation", engine.url)
        engine.healthy = True
        engine.last_error = ""
        self._publish(engine)

    async def generate(
        self,
        trajectory_id: str | None,
        input_ids: list[int],
        sampling: SamplingParams,
        rid: str,
        top_logprobs_num: int = 0,
    ) -> tuple[GenerateResult, Engine]:
        """Generate on the trajectory's engine, retrying on others if it fails before tokens."""
        tried: set[str] = set()
        errors: list[str] = []
        extra = {"top_logprobs_num": top_logprobs_num} if top_logprobs_num else {}
        for attempt in range(self.attempts):
            engine = self.pick(trajectory_id, exclude=tried)
            if engine is None and not self.healthy():
                engine = await self._wait_for_readmission(trajectory_id)
            if engine is None:
                break
            tried.add(engine.url)
            if attempt:
                self.metrics.retries.inc()
            engine.inflight += 1
            self._publish(engine)
            started = time.perf_counter()
            try:
                result = await engine.client.generate(
                    input_ids, sampling, rid=f"{rid}-{attempt}", **extra
                )
            except EngineUnavailableError as exc:
                self.mark_unhealthy(engine, str(exc))
                errors.append(f"{engine.url}: {exc}")
                continue
            except EngineRequestError as exc:
                # The engine rejected the request itself (4xx): retrying elsewhere cannot help.
                raise APIError(400, f"engine rejected the request: {exc.detail}") from None
            finally:
                engine.inflight -= 1
                self._publish(engine)
            self.metrics.engine_latency.labels(engine=engine.url).observe(
                time.perf_counter() - started
            )
            if result.aborted:
                # Aborted by the engine (not by us): nothing reached the client, try elsewhere.
                errors.append(f"{engine.url}: generation aborted by the engine")
                continue
            if trajectory_id is not None:
                self.stick(trajectory_id, engine)
            return result, engine
        detail = "; ".join(errors) if errors else "no healthy engine"
        raise NoEngineAvailableError(detail)

    async def _wait_for_readmission(self, trajectory_id: str | None) -> Engine | None:
        """Every engine is out of rotation: wait up to ``outage_wait_s`` for the prober to put
        one back. A re-admitted engine passed a probe, so engines already tried this call are
        eligible again (``attempts`` still bounds the calls)."""
        deadline = time.monotonic() + self.outage_wait_s
        if self.outage_wait_s > 0:
            self.metrics.outage_waits.inc()
        while (remaining := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(0.05, remaining))
            if self.healthy():
                return self.pick(trajectory_id)
        return None

    async def probe_loop(
        self,
        interval_s: float,
        readmit: Callable[[Engine], object],
        audit: Callable[[Engine], object] | None = None,
    ) -> None:
        """Forever: probe unhealthy engines (``readmit``, async, decides and re-admits) and,
        with ``audit`` (async), check the engines in rotation (it takes one out that serves
        the wrong weights: an engine restarted between two calls is still "healthy")."""
        while True:
            await asyncio.sleep(interval_s)
            for engine in list(self.engines):
                check = readmit if not engine.healthy else audit
                if check is None:
                    continue
                try:
                    await check(engine)  # type: ignore[misc]
                except Exception as exc:  # a probe failure only keeps it out of rotation
                    if engine.healthy:
                        self.mark_unhealthy(engine, f"probe: {exc}")
                    else:
                        engine.last_error = f"probe: {exc}"
