"""Distributed weight refresh: the adapter's side of SGLang's broadcast protocol.

``POST /admin/weights/group {master_address, master_port, world_size, group_name, backend}``
makes every engine in rotation join the trainer's broadcast group. Rank 0 is the trainer; an
engine takes one rank per tensor-parallel worker (``tp_size`` of its ``/server_info``: SGLang
joins as ``rank_offset + tp_rank``), so engine ``i`` (in the order of ``adapter.engines``) gets
``rank_offset = 1 + tp_size_0 + ... + tp_size_{i-1}`` and ``world_size`` must be ``1 + the sum
of the tp_sizes`` (``GET /admin/versions`` reports each engine's). A group of the same name that
an engine still holds (an earlier formation) is destroyed first: SGLang refuses to form a name
twice.

``POST /admin/weights/distributed {version, group_name, buckets: [{names, dtypes, shapes}],
model_path?}`` is a refresh in the adapter's refresh mode
(:class:`adapter.weights.WeightCoordinator`: validate, close the gate, drain in-flight agent
steps or pause them, load, reopen) whose load is SGLang 0.5.23's weight-update session on every
engine: ``/begin_weight_update``, then one ``update_weights_from_distributed`` per bucket, all
engines in lock step (bucket ``k + 1`` goes to no engine before every engine answered bucket
``k``) while the trainer broadcasts the same buckets, then ``/end_weight_update`` (always, on
every path: SGLang runs the post-load steps there). Only the version's last bucket carries
``weight_version`` and ``flush_cache``: the cache is flushed once per version.

A refused bucket ends the version at once: no engine gets a later bucket, so no engine waits
in a broadcast that will not come; the engines leave the group (``/destroy_weights_update_
group``) and the answer says ``broadcast_abandoned``, so the trainer drops its side of the group
at once (its broadcast of the next bucket cannot complete) and forms a new one with the next
version. SGLang applies buckets one by one, so every engine that received a bucket now holds a
mix of two versions: with ``model_path`` (a disk copy of the same weights, the default
``export_to_disk``) they load the version from it before the gate reopens; without one they
leave rotation and readmission reloads the last version that has a disk copy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from adapter.engines.sglang import EngineRequestError
from adapter.errors import APIError
from adapter.routing import Engine, Router
from adapter.weight_check import LogprobProbe, WeightProbe
from adapter.weights import WeightCoordinator

log = logging.getLogger("adapter.weight_sync")


class GroupRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    master_address: str = Field(min_length=1)
    master_port: int = Field(ge=1, le=65535)
    world_size: int = Field(ge=2)
    group_name: str = Field(default="weight_update_group", min_length=1)
    backend: Literal["gloo", "nccl"] = "nccl"


class Bucket(BaseModel):
    model_config = ConfigDict(extra="forbid")

    names: list[str] = Field(min_length=1)
    dtypes: list[str] = Field(min_length=1)
    shapes: list[list[int]] = Field(min_length=1)

    @model_validator(mode="after")
    def _same_lengths(self) -> Bucket:
        if not len(self.names) == len(self.dtypes) == len(self.shapes):
            raise ValueError(
                f"names, dtypes and shapes differ in length "
                f"({len(self.names)}, {len(self.dtypes)}, {len(self.shapes)})"
            )
        return self


class DistributedRefreshRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=0)
    group_name: str = Field(default="weight_update_group", min_length=1)
    buckets: list[Bucket] = Field(min_length=1)
    model_path: str | None = Field(default=None, min_length=1)
    weights_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="the checksum of the broadcast weights (their disk copy's manifest)",
    )
    probes: tuple[WeightProbe, ...] = Field(
        default=(), max_length=16, description="spot check after the update (weight_check)"
    )
    logprob_probe: LogprobProbe | None = Field(
        default=None,
        description="the trainer's logprobs of a fixed sequence: each engine's are compared "
        "after the update (weight_check)",
    )
    flush_cache: bool = True


class DistributedWeights:
    """Broadcast groups of the engines and the distributed refresh."""

    def __init__(self, router: Router, coordinator: WeightCoordinator) -> None:
        self.router = router
        self.coordinator = coordinator
        self.groups: dict[str, list[str]] = {}  # group name -> member engine URLs by rank

    async def tp_sizes(self, engines: list[Engine]) -> list[int]:
        """Each engine's tensor-parallel workers: the ranks it takes in a group (SGLang's
        workers join as ``rank_offset + tp_rank``)."""

        async def size(engine: Engine) -> int:
            try:
                return await engine.client.tp_size()
            except Exception as exc:
                raise APIError(
                    502, f"{engine.url}: cannot read its tp_size from /get_server_info: {exc}"
                ) from exc

        return list(await asyncio.gather(*(size(e) for e in engines)))

    async def init_group(self, request: GroupRequest) -> dict[str, Any]:
        if self.coordinator.refreshing:
            raise APIError(409, "a weight refresh is in progress", code="refresh_busy")
        engines = self.router.healthy()
        sizes = await self.tp_sizes(engines)
        # engine i takes ranks offsets[i] .. offsets[i] + sizes[i] - 1; the trainer is rank 0
        offsets = [1 + sum(sizes[:i]) for i in range(len(engines))]
        if request.world_size != 1 + sum(sizes):
            raise APIError(
                400,
                f"world_size must be 1 (trainer) + {sum(sizes)} ranks of the {len(engines)} "
                f"engines in rotation (tp_size {sizes}), got {request.world_size}",
                param="world_size",
            )
        # SGLang refuses to form a group name it holds already (an earlier formation)
        await self.leave_group(request.group_name, engines)

        async def join(rank: int, engine: Engine) -> str | None:
            try:
                await engine.client.init_weights_update_group(
                    request.master_address,
                    request.master_port,
                    rank,
                    request.world_size,
                    request.group_name,
                    request.backend,
                )
            except Exception as exc:
                return str(exc)
            return None

        errors = await asyncio.gather(*(join(o, e) for o, e in zip(offsets, engines, strict=True)))
        failed = {e.url: err for e, err in zip(engines, errors, strict=True) if err is not None}
        if failed:
            await self.leave_group(request.group_name, engines)
            raise APIError(502, f"engines did not join {request.group_name!r}: {failed}")
        self.groups[request.group_name] = [e.url for e in engines]
        ranks = {
            e.url: list(range(o, o + n)) for e, o, n in zip(engines, offsets, sizes, strict=True)
        }
        return {"group_name": request.group_name, "world_size": request.world_size, "ranks": ranks}

    async def leave_group(self, group_name: str, engines: list[Engine]) -> None:
        """Make ``engines`` destroy their group ``group_name`` (an engine that holds none
        refuses: ignored) and forget it; the trainer must form it again."""
        self.groups.pop(group_name, None)

        async def leave(engine: Engine) -> None:
            try:
                await engine.client.destroy_weights_update_group(group_name)
            except Exception as exc:  # none held, or an engine without the route
                log.debug("%s: destroy_weights_update_group: %s", engine.url, exc)

        await asyncio.gather(*(leave(e) for e in engines))

    def _check_members(self, group_name: str, engines: list[Engine]) -> None:
        members = self.groups.get(group_name)
        if members is None:
            raise APIError(
                409,
                f"no weight update group {group_name!r}: POST /admin/weights/group first",
                code="no_group",
            )
        serving = [e.url for e in engines]
        if sorted(serving) != sorted(members):
            raise APIError(
                409,
                f"group {group_name!r} was made for {members}, engines in rotation are "
                f"{serving}: initialise the group again",
                code="group_stale",
            )

    async def refresh(self, request: DistributedRefreshRequest) -> dict[str, Any]:
        run = _VersionRun(self, request)
        try:
            summary = await self.coordinator.refresh(
                request.model_path,
                request.version,
                loader=run.load_all,
                check=lambda engines: self._check_members(request.group_name, engines),
                weights_sha256=request.weights_sha256,
                probes=request.probes,
                together=True,
                logprob_probe=request.logprob_probe,
            )
        except APIError as exc:
            if run.abandoned_at is not None:
                exc.message = f"{exc.message} (broadcast abandoned at bucket {run.abandoned_at})"
            raise
        summary["transport"] = "distributed"
        summary["broadcast_abandoned"] = run.abandoned_at is not None
        if run.abandoned_at is not None:
            summary["abandoned_at_bucket"] = run.abandoned_at
        return summary


class _VersionRun:
    """One distributed version on every engine in rotation: session, buckets in lock step,
    end of session, and the repair of a version abandoned midway."""

    def __init__(self, owner: DistributedWeights, request: DistributedRefreshRequest) -> None:
        self.owner = owner
        self.request = request
        self.abandoned_at: int | None = None  # the first bucket an engine refused

    async def load_all(self, engines: list[Engine]) -> dict[str, dict[str, Any]]:
        started = time.perf_counter()
        results: dict[str, dict[str, Any]] = {e.url: {"bucket_s": []} for e in engines}
        errors: dict[str, str] = {}
        began = await self._begin(engines, errors)
        last_error: dict[str, str] = {}
        try:
            if len(began) == len(engines):
                await self._send_buckets(engines, results, errors, last_error)
            else:
                self.abandoned_at = 0  # nobody receives anything: every broadcast would wait
        finally:
            await self._end(began, errors)
        for engine in engines:
            results[engine.url]["load_s"] = time.perf_counter() - started
        if self.abandoned_at is not None:
            await self.owner.leave_group(self.request.group_name, engines)
            return await self._repair(engines, results, errors, touched=began)
        return await self._confirm(engines, results, errors, last_error)

    async def _begin(self, engines: list[Engine], errors: dict[str, str]) -> list[Engine]:
        """``/begin_weight_update`` on every engine; an engine with a session left open (an
        adapter that died mid-version) has it ended and begun again."""

        async def begin(engine: Engine) -> bool:
            try:
                await engine.client.begin_weight_update()
                return True
            except EngineRequestError:
                try:  # a session still open: end it, begin again
                    await engine.client.end_weight_update()
                    await engine.client.begin_weight_update()
                    return True
                except Exception as exc:
                    errors[engine.url] = f"begin_weight_update: {exc}"
            except Exception as exc:
                errors[engine.url] = f"begin_weight_update: {exc}"
            return False

        opened = await asyncio.gather(*(begin(e) for e in engines))
        return [e for e, ok in zip(engines, opened, strict=True) if ok]

    async def _end(self, engines: list[Engine], errors: dict[str, str]) -> None:
        async def end(engine: Engine) -> None:
            try:
                await engine.client.end_weight_update()
            except Exception as exc:
                errors.setdefault(engine.url, f"end_weight_update: {exc}")

        await asyncio.gather(*(end(e) for e in engines))

    async def _send_buckets(
        self,
        engines: list[Engine],
        results: dict[str, dict[str, Any]],
        errors: dict[str, str],
        last_error: dict[str, str],
    ) -> None:
        """Every bucket to every engine, in lock step; stops at the first refused bucket
        other than the last (which only decides each engine's own outcome)."""
        request = self.request
        last = len(request.buckets) - 1
        for index, bucket in enumerate(request.buckets):

            async def send(engine: Engine, index: int = index, bucket: Bucket = bucket) -> None:
                t0 = time.perf_counter()
                try:
                    await engine.client.update_weights_from_distributed(
                        bucket.names,
                        bucket.dtypes,
                        bucket.shapes,
                        request.group_name,
                        weight_version=str(request.version) if index == last else None,
                        flush_cache=request.flush_cache and index == last,
                    )
                except Exception as exc:
                    target = last_error if index == last else errors
                    target[engine.url] = f"bucket {index}: {exc}"
                results[engine.url]["bucket_s"].append(time.perf_counter() - t0)

            await asyncio.gather(*(send(e) for e in engines))
            if index < last and errors:
                self.abandoned_at = index
                return

    async def _confirm(
        self,
        engines: list[Engine],
        results: dict[str, dict[str, Any]],
        errors: dict[str, str],
        last_error: dict[str, str],
    ) -> dict[str, dict[str, Any]]:
        """Each engine's outcome after a version sent in full: the version it reports decides
        (a last bucket refused only for its cache flush is a load); one that does not report
        it received some buckets and is repaired."""
        coordinator = self.owner.coordinator
        version, probes = self.request.version, self.request.probes
        out = await asyncio.gather(
            *(
                coordinator.confirm(
                    e,
                    version,
                    probes,
                    results[e.url],
                    errors.get(e.url) or last_error.get(e.url),
                    self.request.logprob_probe,
                )
                for e in engines
            )
        )
        confirmed = {e.url: r for e, r in zip(engines, out, strict=True)}
        mixed = [e for e in engines if not confirmed[e.url]["ok"]]
        if mixed:
            confirmed.update(await self._repair(mixed, confirmed, errors, touched=mixed))
        return confirmed

    async def _repair(
        self,
        engines: list[Engine],
        results: dict[str, dict[str, Any]],
        errors: dict[str, str],
        touched: list[Engine],
    ) -> dict[str, dict[str, Any]]:
        """Engines that may hold a mix of two versions load this version from its disk copy
        (``model_path``); without one they fail and readmission reloads them before they
        serve again."""
        coordinator = self.owner.coordinator
        request = self.request
        touched_urls = {e.url for e in touched}

        async def repair(engine: Engine) -> dict[str, Any]:
            failed = {
                **results[engine.url],
                "ok": False,
                "error": errors.get(engine.url)
                or results[engine.url].get("error")
                or f"broadcast abandoned at bucket {self.abandoned_at} (another engine refused)",
            }
            if request.model_path is None:
                if engine.url in touched_urls:
                    coordinator.needs_reload.add(engine.url)
                return failed
            loaded = await coordinator._load(
                engine,
                request.model_path,
                request.version,
                request.probes,
                request.logprob_probe,
            )
            if not loaded["ok"]:
                coordinator.needs_reload.add(engine.url)
                return {**failed, "repair_error": loaded.get("error")}
            return {
                **loaded,
                "bucket_s": results[engine.url].get("bucket_s", []),
                "repaired_from_disk": failed["error"],
            }

        repaired = await asyncio.gather(*(repair(e) for e in engines))
        return {e.url: r for e, r in zip(engines, repaired, strict=True)}
