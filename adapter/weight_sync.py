"""Distributed weight refresh: the adapter's side of SGLang's broadcast protocol.

``POST /admin/weights/group {master_address, master_port, world_size, group_name, backend}``
makes every engine in rotation join the trainer's broadcast group. Rank 0 is the trainer; an
engine takes one rank per tensor-parallel worker (``tp_size`` of its ``/get_server_info``: SGLang
joins as ``rank_offset + tp_rank``), so engine ``i`` (in the order of ``adapter.engines``) gets
``rank_offset = 1 + tp_size_0 + ... + tp_size_{i-1}`` and ``world_size`` must be ``1 + the sum
of the tp_sizes`` (``GET /admin/versions`` reports each engine's).

``POST /admin/weights/distributed {version, group_name, buckets: [{names, dtypes, shapes}],
model_path?}`` is a refresh in the adapter's refresh mode
(:class:`adapter.weights.WeightCoordinator`: validate, close the gate, drain in-flight agent
steps or pause them, load, reopen) whose load is, on every engine
concurrently, one ``update_weights_from_distributed`` per bucket, in order, while the trainer
broadcasts the same buckets; the version's last bucket carries ``weight_version``. An engine
whose bucket fails still gets the remaining buckets (so no broadcast waits for it forever), is
reported, and leaves rotation. ``model_path``, if given, is a disk copy of the same weights: the
path readmitted engines reload from.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from adapter.errors import APIError
from adapter.routing import Engine, Router
from adapter.weight_check import WeightProbe
from adapter.weights import WeightCoordinator


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
            self.groups.pop(request.group_name, None)
            raise APIError(502, f"engines did not join {request.group_name!r}: {failed}")
        self.groups[request.group_name] = [e.url for e in engines]
        ranks = {
            e.url: list(range(o, o + n)) for e, o, n in zip(engines, offsets, sizes, strict=True)
        }
        return {"group_name": request.group_name, "world_size": request.world_size, "ranks": ranks}

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
        version = request.version

        async def load(engine: Engine) -> dict[str, Any]:
            started = time.perf_counter()
            first_error: str | None = None
            bucket_s: list[float] = []
            last = len(request.buckets) - 1
            for index, bucket in enumerate(request.buckets):
                t0 = time.perf_counter()
                try:
                    await engine.client.update_weights_from_distributed(
                        bucket.names,
                        bucket.dtypes,
                        bucket.shapes,
                        request.group_name,
                        weight_version=str(version) if index == last else None,
                        flush_cache=request.flush_cache,
                    )
                except Exception as exc:
                    # Keep going: the engine still receives the remaining buckets, so the
                    # trainer's broadcasts complete; it applies nothing of this version.
                    first_error = first_error or f"bucket {index}: {exc}"
                bucket_s.append(time.perf_counter() - t0)
            out: dict[str, Any] = {"load_s": time.perf_counter() - started, "bucket_s": bucket_s}
            if first_error is not None:
                return {"ok": False, "error": first_error, **out}
            try:
                reported = await engine.client.get_weight_version()
            except Exception as exc:
                return {"ok": False, "error": str(exc), **out}
            engine.weight_version = reported
            return await self.coordinator.verify(
                engine, version, request.probes, {**out, "version": reported}
            )

        summary = await self.coordinator.refresh(
            request.model_path,
            version,
            loader=load,
            check=lambda engines: self._check_members(request.group_name, engines),
            weights_sha256=request.weights_sha256,
            probes=request.probes,
        )
        summary["transport"] = "distributed"
        return summary
