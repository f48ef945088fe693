"""Admin routes (admin token): weight refreshes from disk or by broadcast, and versions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from adapter.routes.deps import Distributed, Service, model_body, require_admin
from adapter.weight_check import LogprobProbe, WeightProbe
from adapter.weight_sync import DistributedRefreshRequest, GroupRequest


class RefreshRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_path: str = Field(min_length=1)
    version: int = Field(ge=0)
    weights_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="the manifest's weights_sha256: checked against model_path's manifest; "
        "the version and checksum already served again is a no-op",
    )
    probes: tuple[WeightProbe, ...] = Field(
        default=(),
        max_length=16,
        description="first values of a few 1-D tensors: each engine's are read back after "
        "the load (adapter.weight_check)",
    )
    logprob_probe: LogprobProbe | None = Field(
        default=None,
        description="a fixed token sequence and the trainer's logprobs of its tokens 1..L-1: "
        "each engine's are compared after the load (adapter.weight_check)",
    )


router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])

REQUEST_BODIES: dict[str, tuple[type[BaseModel], bool]] = {
    "/admin/weights": (RefreshRequest, True),
    "/admin/weights/group": (GroupRequest, True),
    "/admin/weights/distributed": (DistributedRefreshRequest, True),
}


@router.post("/weights")
async def refresh_weights(request: Request, service: Service) -> dict[str, Any]:
    body = await model_body(request, RefreshRequest)
    return await service.weights.refresh(
        body.model_path,
        body.version,
        weights_sha256=body.weights_sha256,
        probes=body.probes,
        logprob_probe=body.logprob_probe,
    )


@router.post("/weights/group")
async def weights_group(request: Request, distributed: Distributed) -> dict[str, Any]:
    return await distributed.init_group(await model_body(request, GroupRequest))


@router.post("/weights/distributed")
async def weights_distributed(request: Request, distributed: Distributed) -> dict[str, Any]:
    return await distributed.refresh(await model_body(request, DistributedRefreshRequest))


@router.get("/versions")
async def versions(service: Service) -> dict[str, Any]:
    return await service.versions()
