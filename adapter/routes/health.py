"""Liveness (``/health``: 503 when no engine is in rotation), readiness (``/readyz``: 503 while
Redis is unreachable or no engine serves) and Prometheus ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from adapter.metrics import CONTENT_TYPE
from adapter.routes.deps import Service

router = APIRouter()


@router.get("/health")
async def health(service: Service) -> JSONResponse:
    view = service.health()
    return JSONResponse(view, status_code=200 if view["status"] == "ok" else 503)


@router.get("/readyz")
async def readyz(service: Service) -> JSONResponse:
    view = await service.readiness()
    return JSONResponse(view, status_code=200 if view["status"] == "ready" else 503)


@router.get("/metrics")
async def metrics(service: Service) -> Response:
    return Response(service.metrics.render(), media_type=CONTENT_TYPE)
