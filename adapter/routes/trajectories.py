"""Trajectory routes (worker token in training mode): open, close, read as JSON or raw entries."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from adapter.routes.deps import Service, model_body, require_worker
from services.protocol import Outcome, TrajectoryMeta
from services.protocol.raw_frames import COUNT_HEADER, MEDIA_TYPE, encode_frames


class CloseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    outcome: Outcome | None = None


router = APIRouter(prefix="/trajectories", dependencies=[Depends(require_worker)])

REQUEST_BODIES: dict[str, tuple[type[BaseModel], bool]] = {
    "/trajectories": (TrajectoryMeta, True),
    "/trajectories/{trajectory_id}/close": (CloseRequest, False),
}


@router.post("", status_code=201)
async def open_trajectory(request: Request, service: Service) -> JSONResponse:
    meta = await model_body(request, TrajectoryMeta)
    token = await service.open_trajectory(meta)
    tid = meta.trajectory_id
    body = {"trajectory_id": tid, "status": "open", "base_url": f"/t/{tid}/v1", "token": token}
    return JSONResponse(body, status_code=201, headers={"cache-control": "no-store"})


@router.post("/{trajectory_id}/close")
async def close_trajectory(
    trajectory_id: str, request: Request, service: Service
) -> dict[str, Any]:
    # A limit of its own, not the context window's: the outcome carries the agent's patch
    # (capped by the worker) and the test report; a 413 here would abort the trajectory.
    limit = max(service.config.max_close_body_bytes, service.max_body_bytes)
    body = await model_body(request, CloseRequest, False, limit)
    return await service.close_trajectory(trajectory_id, body.outcome)


@router.get("/{trajectory_id}")
async def get_trajectory(trajectory_id: str, service: Service) -> dict[str, Any]:
    view, _ = await service.get_trajectory(trajectory_id)
    return view


@router.get("/{trajectory_id}/raw")
async def get_trajectory_raw(trajectory_id: str, service: Service) -> Response:
    """The record's binary entries, framed by :mod:`services.protocol.raw_frames`."""
    _, raw = await service.get_trajectory(trajectory_id)
    return Response(
        encode_frames(raw), media_type=MEDIA_TYPE, headers={COUNT_HEADER: str(len(raw))}
    )
