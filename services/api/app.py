"""The job API's FastAPI application: routes (:mod:`services.api.routes`), JSON errors that name
the offending field, request metrics, and the rollout job runner started with the app.

Every error is ``{"error": {"message", "type", "field"}}`` with a 4xx status (a 500 only for a
bug, also as JSON). ``field`` is dotted: ``body.steps``, ``query.limit``, ``path.job_id``,
``header.Authorization``.

A request body over ``api.max_body_bytes`` is a 413 (:class:`_BodyCap`): at once when its
``Content-Length`` says so (nothing of it is read), else as soon as the streamed (chunked)
bytes pass the cap, so no caller makes the API buffer more than the cap.
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
from services.api.config import ApiConfig, is_loopback
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
    kinds = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
    kind = kinds.get(exc.status_code, "http_error")
    field = "body" if exc.status_code == 413 else None
    return error(exc.status_code, kind, str(exc.detail), field)


def _too_large(cap: int, seen: str) -> str:
    return (
        f"request body {seen} is over the cap of {cap} bytes (api.max_body_bytes): send a "
        "smaller request"
    )


class BodyTooLarge(StarletteHTTPException):
    """Raised from ``receive`` when the streamed body passes the cap; FastAPI re-raises an
    HTTPException met while reading the body, so it reaches :func:`_http_error` (a JSON
    413) instead of becoming its generic 400."""

    def __init__(self, cap: int) -> None:
        super().__init__(413, _too_large(cap, f"of more than {cap} bytes (streamed)"))


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
            if not is_loopback(cfg.host):
                log.warning("api.insecure_dev: listening on %s without tokens", cfg.host)
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
    app.add_middleware(_BodyCap, cap=cfg.max_body_bytes)
    app.add_middleware(_Observed, svc=svc)  # outermost: counts the 413s too
    return app


class _BodyCap:
    """ASGI middleware: a request body over ``cap`` bytes is a 413 (see the module doc).

    ``Content-Length`` over the cap: answered before the app runs, the body left unread (the
    server then closes the connection). Otherwise ``receive`` counts the bytes and raises
    :class:`BodyTooLarge` the moment they pass the cap (a chunked body, or one longer than its
    header claimed), whatever reads the body."""

    def __init__(self, app: ASGIApp, cap: int) -> None:
        self.app = app
        self.cap = cap

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.cap:
            message = _too_large(self.cap, f"of {declared} bytes (Content-Length)")
            response = error(413, "body_too_large", message, "body")
            response.headers["Connection"] = "close"
            await response(scope, receive, send)
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.cap:
                    raise BodyTooLarge(self.cap)
            return message

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watch)
        except BodyTooLarge as exc:  # raised where no handler turned it into a response
            if started:
                raise
            await error(413, "body_too_large", str(exc.detail), "body")(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


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
