"""The job API's FastAPI application: routes (:mod:`services.api.routes`), JSON errors that name
the offending field, request metrics, and the rollout job runner started with the app.

Every error is ``{"error": {"message", "type", "field"}}`` with a 4xx status (a 500 only for a
bug, also as JSON). ``field`` is dotted: ``body.steps``, ``query.limit``, ``path.job_id``,
``header.Authorization``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api import routes
from services.api.config import ApiConfig
from services.api.runner import RolloutJobRunner
from services.api.service import ApiError, ApiService
from services.queue.connection import connect

log = logging.getLogger("swerl.api")
VERSION = "1"


def error(status: int, kind: str, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "field": field}}, status)


def _field(loc: tuple[int | str, ...] | list[int | str]) -> str:
    return ".".join(str(p) for p in loc) or "(request)"


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    parts = [f"{_field(e['loc'])}: {e['msg']}" for e in errors]
    first = _field(errors[0]["loc"]) if errors else None
    return error(422, "invalid_request", "; ".join(parts) or "invalid request", first)


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error(exc.status, exc.kind, exc.message, exc.field)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error(exc.status_code, kind, str(exc.detail))


async def _redis_error(_: Request, exc: Exception) -> JSONResponse:
    log.warning("Redis error: %s", exc)
    return error(503, "unavailable", f"Redis unavailable: {type(exc).__name__}")


def create_app(cfg: ApiConfig, *, runner: bool = True) -> FastAPI:
    """The application; with ``runner`` (and ``cfg.runner.concurrency`` > 0) the rollout job
    runner runs in this process while the app is up."""
    client = connect(cfg.redis_url, cfg.queue)
    svc = ApiService(cfg, client)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if svc.authn.open:
            log.warning("no api.tokens configured: every caller has every scope (development)")
        job_runner = RolloutJobRunner(cfg) if runner and cfg.runner.concurrency else None
        if job_runner is not None:
            job_runner.start()
        yield
        if job_runner is not None:
            job_runner.stop()
        client.close()

    app = FastAPI(title="swerl job API", version=VERSION, lifespan=lifespan)
    app.state.service = svc
    app.include_router(routes.router)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(redis.RedisError, _redis_error)
    app.add_middleware(_Observed, svc=svc)
    return app


class _Observed:
    """ASGI middleware (cheaper than ``BaseHTTPMiddleware``): counts and times every request by
    route template, and turns an unexpected exception into a JSON 500 (logged)."""

    def __init__(self, app: ASGIApp, svc: ApiService) -> None:
        self.app = app
        self.svc = svc

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500, "started": False}

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            if not status["started"]:
                response = error(500, "internal", "internal error (logged by the server)")
                await response(scope, receive, send)
        route = scope.get("route")
        template = getattr(route, "path", "unmatched")
        metrics = self.svc.metrics
        metrics.requests.labels(template, scope["method"], str(status["code"])).inc()
        metrics.latency.labels(template).observe(time.perf_counter() - start)
