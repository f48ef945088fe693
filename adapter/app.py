"""HTTP routes of the adapter (FastAPI). Request handling itself lives in :mod:`adapter.service`.

==============================================  ================================================
``POST /v1/chat/completions``                   untracked chat completion (nothing recorded)
``GET  /v1/models``                             the served model
``POST /t/{id}/v1/chat/completions``            chat completion recorded into trajectory ``id``
``GET  /t/{id}/v1/models``                      same as ``/v1/models`` (for per-trajectory
                                                ``base_url`` clients)
``POST /trajectories``                          open: body = TrajectoryMeta -> 201
``POST /trajectories/{id}/close``               close: optional ``{"outcome": Outcome}``
``GET  /trajectories/{id}``                     the record as JSON
``GET  /trajectories/{id}/raw``                 the binary entries, each ``u32 LE length + bytes``
``POST /admin/weights``                         ``{model_path, version}``, bearer token
``GET  /admin/versions``                        versions of the adapter and each engine, token
``GET  /health``, ``GET /metrics``              liveness, Prometheus text
==============================================  ================================================

Every error is ``{"error": {"message", "type", "code", "param"}}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import hmac
import json
import logging
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from adapter.errors import APIError
from adapter.openai_schema import completion_response, stream_chunks
from adapter.service import AdapterService, ChatOutcome
from services.protocol import Outcome, TrajectoryMeta

log = logging.getLogger("adapter.app")


class CloseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    outcome: Outcome | None = None


class RefreshRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_path: str = Field(min_length=1)
    version: int = Field(ge=0)


def _error(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _validation_message(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'body'}: "
        f"{'field required' if e['type'] == 'missing' else e['msg']}"
        for e in exc.errors()
    )


async def _read_body(request: Request) -> bytes:
    """The body, read only while it stays within the service's ``max_body_bytes`` (413 else):
    a declared ``Content-Length`` over the limit is refused before anything is read."""
    limit: int = request.app.state.service.max_body_bytes
    too_large = APIError(
        413,
        f"request body is larger than {limit} bytes, the most this adapter accepts "
        "(adapter.max_body_bytes; a prompt that long cannot fit the context window anyway)",
    )
    declared = request.headers.get("content-length", "").strip()
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_body(request: Request, required: bool = True) -> Any:
    raw = await _read_body(request)
    if not raw.strip():
        if required:
            raise APIError(400, "request body is empty: a JSON object is required")
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None


def _model(model: type[BaseModel], body: Any) -> Any:
    try:
        return model.model_validate(body if body is not None else {})
    except ValidationError as exc:
        raise APIError(400, _validation_message(exc)) from None


def _sse(outcome: ChatOutcome) -> StreamingResponse:
    chunks = stream_chunks(
        cid=outcome.cid,
        model=outcome.model,
        message=outcome.message,
        finish_reason=outcome.finish_reason,
        usage_=outcome.usage if outcome.include_usage else None,
    )

    async def events() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={**outcome.headers, "cache-control": "no-cache"},
    )


def create_app(service: AdapterService) -> FastAPI:
    """The FastAPI application around ``service`` (started and stopped with the app)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="swerl adapter", lifespan=lifespan)
    app.state.service = service

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(APIError(400, str(exc)))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(APIError(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _error(APIError(500, f"internal error: {type(exc).__name__}: {exc}"))

    def require_admin(request: Request) -> None:
        token = service.config.admin_token
        if not token:
            raise APIError(403, "admin routes are disabled: set adapter.admin_token")
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), token):
            raise APIError(401, "missing or wrong admin bearer token")

    async def chat(request: Request, trajectory_id: str | None) -> Response:
        route = "trajectory" if trajectory_id else "untracked"
        timer = service.metrics.request_latency
        started = time.perf_counter()
        try:
            outcome = await service.chat(trajectory_id, await _json_body(request))
        except APIError as exc:
            service.metrics.requests.inc(route=route, status=str(exc.status))
            raise
        service.metrics.requests.inc(route=route, status="ok")
        timer.observe(time.perf_counter() - started, route=route)
        if outcome.stream:
            return _sse(outcome)
        body = completion_response(
            cid=outcome.cid,
            model=outcome.model,
            message=outcome.message,
            finish_reason=outcome.finish_reason,
            usage_=outcome.usage,
        )
        return JSONResponse(body, headers=outcome.headers)

    def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": service.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "swerl",
                    "max_model_len": service.renderer.context_length,
                }
            ],
        }

    @app.post("/v1/chat/completions")
    async def chat_untracked(request: Request) -> Response:
        return await chat(request, None)

    @app.post("/t/{trajectory_id}/v1/chat/completions")
    async def chat_tracked(trajectory_id: str, request: Request) -> Response:
        return await chat(request, trajectory_id)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return models()

    @app.get("/t/{trajectory_id}/v1/models")
    async def list_models_tracked(trajectory_id: str) -> dict[str, Any]:
        service.validate_id(trajectory_id)
        return models()

    @app.get("/health")
    async def health() -> JSONResponse:
        view = service.health()
        return JSONResponse(view, status_code=200 if view["status"] == "ok" else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(
            service.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    @app.post("/trajectories", status_code=201)
    async def open_trajectory(request: Request) -> JSONResponse:
        meta: TrajectoryMeta = _model(TrajectoryMeta, await _json_body(request))
        await service.open_trajectory(meta)
        tid = meta.trajectory_id
        return JSONResponse(
            {"trajectory_id": tid, "status": "open", "base_url": f"/t/{tid}/v1"}, status_code=201
        )

    @app.post("/trajectories/{trajectory_id}/close")
    async def close_trajectory(trajectory_id: str, request: Request) -> dict[str, Any]:
        body: CloseRequest = _model(CloseRequest, await _json_body(request, required=False))
        return await service.close_trajectory(trajectory_id, body.outcome)

    @app.get("/trajectories/{trajectory_id}")
    async def get_trajectory(trajectory_id: str) -> dict[str, Any]:
        view, _ = await service.get_trajectory(trajectory_id)
        return view

    @app.get("/trajectories/{trajectory_id}/raw")
    async def get_trajectory_raw(trajectory_id: str) -> Response:
        _, raw = await service.get_trajectory(trajectory_id)
        payload = b"".join(struct.pack("<I", len(e)) + e for e in raw)
        return Response(
            payload,
            media_type="application/octet-stream",
            headers={"x-swerl-entries": str(len(raw))},
        )

    @app.post("/admin/weights")
    async def refresh_weights(request: Request) -> dict[str, Any]:
        require_admin(request)
        body: RefreshRequest = _model(RefreshRequest, await _json_body(request))
        return await service.weights.refresh(body.model_path, body.version)

    @app.get("/admin/versions")
    async def versions(request: Request) -> dict[str, Any]:
        require_admin(request)
        return await service.versions()

    return app
