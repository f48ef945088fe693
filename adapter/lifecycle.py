"""The trajectory lifecycle both adapter services share: open (with its bearer token), find
or load the in-memory state, authorize ``/t/<id>/`` calls, write pending entries through to
the store, close, read back, and evict idle state.

:class:`adapter.service.AdapterService` (tokens through SGLang-protocol engines) and
:class:`adapter.relay.RelayService` (text through an OpenAI-compatible upstream) build on it;
they differ in how a chat completion is answered and recorded. Subclasses place a trajectory
on an engine (:meth:`TrajectoryLifecycle._placement`, ``_place``, ``_forget``; no-ops here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import redis.exceptions
from starlette.datastructures import Headers

from adapter.auth import AccessControl, bearer_token, new_trajectory_token, token_digest
from adapter.config import AdapterConfig
from adapter.errors import APIError
from adapter.metrics import AdapterMetrics
from adapter.runtime import TrajectoryRuntime
from services.protocol import ID_RULE, Outcome, TrajectoryMeta, id_problem
from services.store import (
    TrajectoryExistsError,
    TrajectoryNotFoundError,
    TrajectoryStore,
)

log = logging.getLogger("adapter.service")

STORE_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


def open_store(config: AdapterConfig) -> TrajectoryStore:
    """The trajectory store on a blocking pool sized by the configuration."""
    return TrajectoryStore.from_url(
        config.redis_url,
        config.key_prefix,
        max_connections=config.redis_max_connections,
        pool_timeout_s=config.redis_pool_timeout_s,
    )


class TrajectoryLifecycle:
    """Open trajectories, their in-memory state and their records (see the module doc)."""

    def __init__(self, config: AdapterConfig, store: TrajectoryStore) -> None:
        self.config = config
        self.store = store
        self.metrics = AdapterMetrics()
        self.access = AccessControl(
            worker_token=config.worker_token,
            admin_token=config.admin_token,
            untracked=config.untracked_completions,
        )
        self.trajectories: dict[str, TrajectoryRuntime] = {}

    # -- placement hooks (engine routing) --------------------------------------------------
    def _placement(self, meta: TrajectoryMeta) -> Any:
        return None

    def _place(self, trajectory_id: str, placement: Any) -> None:
        return None

    def _forget(self, trajectory_id: str) -> None:
        return None

    async def _flush_all(self) -> None:
        """Write what every open trajectory has pending (shutdown)."""
        for runtime in list(self.trajectories.values()):
            try:
                await self._flush(runtime)
            except APIError:
                log.error("trajectory %s: unwritten turns lost at shutdown", runtime.trajectory_id)

    async def _evict_loop(self) -> None:
        """Drop in-memory state of trajectories idle for longer than the TTL (never closed)."""
        ttl = self.config.trajectory_idle_ttl_s
        while True:
            await asyncio.sleep(min(60.0, ttl))
            cutoff = time.monotonic() - ttl
            for tid, runtime in list(self.trajectories.items()):
                if not runtime.idle_since(cutoff):
                    continue
                try:
                    async with runtime.lock:
                        await self._flush(runtime)
                except APIError:
                    continue
                if runtime.idle_since(cutoff):  # no request came while it was written
                    self.trajectories.pop(tid, None)
                    self._forget(tid)
            self.metrics.open_trajectories.set(float(len(self.trajectories)))

    # -- trajectories --------------------------------------------------------------------------

    @staticmethod
    def validate_id(trajectory_id: str) -> None:
        if id_problem(trajectory_id) is not None:
            raise APIError(
                400,
                f"invalid trajectory id {trajectory_id[:80]!r}: {ID_RULE}",
                param="trajectory_id",
            )

    async def open_trajectory(self, meta: TrajectoryMeta) -> str:
        """Create the record; returns its bearer token (only its digest is stored)."""
        placement = self._placement(meta)
        token = new_trajectory_token()
        digest = token_digest(token)
        try:
            await self.store.open(meta, digest)
        except TrajectoryExistsError as exc:
            raise APIError(409, str(exc), code="trajectory_exists") from None
        except STORE_ERRORS as exc:
            raise APIError(
                503, f"trajectory store unavailable: {exc}", code="store_unavailable"
            ) from None
        self.trajectories[meta.trajectory_id] = TrajectoryRuntime(
            meta.trajectory_id, token_digest=digest
        )
        self._place(meta.trajectory_id, placement)
        self.metrics.open_trajectories.set(float(len(self.trajectories)))
        return token

    async def authorize_trajectory(self, trajectory_id: str, headers: Headers) -> None:
        """In training mode a ``/t/<id>/`` call must carry that trajectory's token (401)."""
        if not self.access.training_mode:
            return
        if bearer_token(headers) is None:  # refused before anything is looked up
            self.access.require_trajectory(trajectory_id, headers, None, known=False)
        try:
            runtime = await self._runtime(trajectory_id)
        except APIError as exc:
            if exc.status != 404:
                raise
            # an unknown id looks like a wrong token: no oracle of which ids exist
            self.access.require_trajectory(trajectory_id, headers, None, known=False)
            raise
        self.access.require_trajectory(trajectory_id, headers, runtime.token_digest, known=True)

    async def _runtime(self, trajectory_id: str) -> TrajectoryRuntime:
        runtime = self.trajectories.get(trajectory_id)
        if runtime is not None:
            return runtime
        self.validate_id(trajectory_id)
        try:
            status = await self.store.status(trajectory_id)
            if status is None:
                if not self.config.auto_open_trajectories:
                    raise APIError(
                        404,
                        f"unknown trajectory {trajectory_id!r}: open it with POST /trajectories",
                        code="trajectory_not_found",
                    )
                with contextlib.suppress(TrajectoryExistsError):  # opened concurrently
                    await self.store.open(TrajectoryMeta(trajectory_id=trajectory_id))
                n_segments = 0
            elif status == "closed":
                raise APIError(
                    409, f"trajectory {trajectory_id!r} is closed", code="trajectory_closed"
                )
            else:
                n_segments = (await self.store.counters(trajectory_id)).get("segments", 0)
            digest = None if status is None else await self.store.token_digest(trajectory_id)
        except STORE_ERRORS as exc:
            raise APIError(
                503, f"trajectory store unavailable: {exc}", code="store_unavailable"
            ) from None
        runtime = self.trajectories.get(trajectory_id)  # another request may have raced us
        if runtime is None:
            runtime = TrajectoryRuntime(trajectory_id, n_segments=n_segments, token_digest=digest)
            self.trajectories[trajectory_id] = runtime
            self.metrics.open_trajectories.set(float(len(self.trajectories)))
        return runtime

    async def _flush(self, runtime: TrajectoryRuntime) -> None:
        write = runtime.pending()
        if not write:
            return
        try:
            await self.store.append(runtime.trajectory_id, list(write.entries), write.counters)
        except STORE_ERRORS as exc:
            self.metrics.store_errors.inc()
            log.warning(
                "trajectory %s: write-through failed (%d entries kept in memory): %s",
                runtime.trajectory_id,
                len(write.entries),
                exc,
            )
            raise APIError(
                503, f"trajectory store unavailable: {exc}", code="store_unavailable"
            ) from None
        runtime.written(write)

    async def close_trajectory(self, trajectory_id: str, outcome: Outcome | None) -> dict[str, Any]:
        self.validate_id(trajectory_id)
        runtime = self.trajectories.get(trajectory_id)
        try:
            if runtime is not None:
                async with runtime.lock:
                    await self._flush(runtime)
            status = await self.store.status(trajectory_id)
            if status is None:
                raise APIError(
                    404, f"unknown trajectory {trajectory_id!r}", code="trajectory_not_found"
                )
            kept = await self.store.close(trajectory_id, outcome)
            counters = await self.store.counters(trajectory_id)
        except STORE_ERRORS as exc:
            raise APIError(
                503, f"trajectory store unavailable: {exc}", code="store_unavailable"
            ) from None
        self.trajectories.pop(trajectory_id, None)
        self._forget(trajectory_id)
        self.metrics.open_trajectories.set(float(len(self.trajectories)))
        return {
            "trajectory_id": trajectory_id,
            "status": "closed",
            "outcome": kept.model_dump(mode="json") if kept else None,
            "counters": counters,
        }

    async def get_trajectory(self, trajectory_id: str) -> tuple[dict[str, Any], list[bytes]]:
        """The record as JSON (plus its status) and its raw binary entries."""
        self.validate_id(trajectory_id)
        runtime = self.trajectories.get(trajectory_id)
        try:
            if runtime is not None and runtime.pending():
                async with runtime.lock:
                    await self._flush(runtime)
            record = await self.store.load(trajectory_id)
            status = await self.store.status(trajectory_id)
            raw = await self.store.raw_entries(trajectory_id)
        except TrajectoryNotFoundError:
            raise APIError(
                404, f"unknown trajectory {trajectory_id!r}", code="trajectory_not_found"
            ) from None
        except STORE_ERRORS as exc:
            raise APIError(
                503, f"trajectory store unavailable: {exc}", code="store_unavailable"
            ) from None
        view = record.to_json()
        view["status"] = status
        view["n_turns"] = record.n_turns
        view["n_tokens"] = record.n_tokens
        return view, raw
