"""HTTP routes of the adapter (FastAPI). Request handling itself lives in :mod:`adapter.service`.

==============================================  ================================================
``POST /v1/chat/completions``                   untracked chat completion (nothing recorded);
                                                credential per ``untracked_completions``
``GET  /v1/models``                             the served model
``POST /t/{id}/v1/chat/completions``            chat completion recorded into trajectory ``id``;
                                                trajectory token (training mode)
``GET  /t/{id}/v1/models``                      same as ``/v1/models`` (for per-trajectory
                                                ``base_url`` clients); trajectory token
``POST /trajectories``                          open: body = TrajectoryMeta -> 201 with the
                                                trajectory's ``token``; worker token
``POST /trajectories/{id}/close``               close: optional ``{"outcome": Outcome}``; worker
``GET  /trajectories/{id}``                     the record as JSON; worker token
``GET  /trajectories/{id}/raw``                 the binary entries, each ``u32 LE length + bytes``
``POST /admin/weights``                         ``{model_path, version}``, admin token
``POST /admin/weights/group``                   engines join the trainer's broadcast group; admin
``POST /admin/weights/distributed``             ``{version, group_name, buckets}``: refresh by
                                                broadcast (:mod:`adapter.weight_sync`); admin
``GET  /admin/versions``                        versions of the adapter and each engine, admin
``GET  /health``, ``GET /metrics``              liveness, Prometheus text
==============================================  ================================================

Credentials are bearer tokens checked by :mod:`adapter.auth` (worker and trajectory tokens only
in training mode, i.e. with ``adapter.worker_token`` set). Every error is
``{"error": {"message", "type", "code", "param"}}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adapter.errors import APIError
from adapter.hygiene import decode_json
from adapter.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from adapter.openai_schema import ChatCompletionRequest, completion_response, stream_chunks
from adapter.service import AdapterService, ChatOutcome
from adapter.weight_sync import DistributedRefreshRequest, DistributedWeights, GroupRequest
from services.protocol import Outcome, TrajectoryMeta
from services.protocol.ids import ID_MAX_LENGTH, ID_PATTERN
from services.protocol.raw_frames import COUNT_HEADER, encode_frames
from services.protocol.raw_frames import MEDIA_TYPE as RAW_MEDIA_TYPE

log = logging.getLogger("adapter.app")


class CloseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    outcome: Outcome | None = None


class RefreshRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_path: str = Field(min_length=1)
    version: int = Field(ge=0)


def _error(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


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
    return decode_json(raw)


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
        logprobs=outcome.logprobs,
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
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            message = f"method {request.method} is not allowed on {request.url.path}" + (
                f" (allowed: {allowed})" if allowed else ""
            )
        return _error(APIError(exc.status_code, message, headers=exc.headers))

    # Unexpected exceptions: a JSON 500 that keeps the connection usable (see _Unexpected).
    app.add_middleware(_Unexpected)

    access = service.access
    if not access.training_mode:
        log.warning(
            "no adapter.worker_token: trajectory records and /t/<id>/ routes are open to "
            "anyone who reaches the adapter (development only; see docs/security.md)"
        )

    def require_admin(request: Request) -> None:
        access.require_admin(request.headers)

    async def chat(request: Request, trajectory_id: str | None) -> Response:
        route = "trajectory" if trajectory_id else "untracked"
        timer = service.metrics.request_latency
        started = time.perf_counter()
        try:
            if trajectory_id is None:
                access.require_untracked(request.headers)
            else:
                await service.authorize_trajectory(trajectory_id, request.headers)
            outcome = await service.chat(trajectory_id, await _json_body(request))
        except APIError as exc:
            service.metrics.requests.labels(route=route, status=str(exc.status)).inc()
            raise
        service.metrics.requests.labels(route=route, status="ok").inc()
        timer.labels(route=route).observe(time.perf_counter() - started)
        if outcome.stream:
            return _sse(outcome)
        body = completion_response(
            cid=outcome.cid,
            model=outcome.model,
            message=outcome.message,
            finish_reason=outcome.finish_reason,
            usage_=outcome.usage,
            logprobs=outcome.logprobs,
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
    async def list_models_tracked(trajectory_id: str, request: Request) -> dict[str, Any]:
        service.validate_id(trajectory_id)
        await service.authorize_trajectory(trajectory_id, request.headers)
        return models()

    @app.get("/health")
    async def health() -> JSONResponse:
        view = service.health()
        return JSONResponse(view, status_code=200 if view["status"] == "ok" else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.post("/trajectories", status_code=201)
    async def open_trajectory(request: Request) -> JSONResponse:
        access.require_worker(request.headers)
        meta: TrajectoryMeta = _model(TrajectoryMeta, await _json_body(request))
        token = await service.open_trajectory(meta)
        tid = meta.trajectory_id
        body = {"trajectory_id": tid, "status": "open", "base_url": f"/t/{tid}/v1", "token": token}
        return JSONResponse(body, status_code=201, headers={"cache-control": "no-store"})

    @app.post("/trajectories/{trajectory_id}/close")
    async def close_trajectory(trajectory_id: str, request: Request) -> dict[str, Any]:
        access.require_worker(request.headers)
        body: CloseRequest = _model(CloseRequest, await _json_body(request, required=False))
        return await service.close_trajectory(trajectory_id, body.outcome)

    @app.get("/trajectories/{trajectory_id}")
    async def get_trajectory(trajectory_id: str, request: Request) -> dict[str, Any]:
        access.require_worker(request.headers)
        view, _ = await service.get_trajectory(trajectory_id)
        return view

    @app.get("/trajectories/{trajectory_id}/raw")
    async def get_trajectory_raw(trajectory_id: str, request: Request) -> Response:
        access.require_worker(request.headers)
        _, raw = await service.get_trajectory(trajectory_id)
        return Response(
            encode_frames(raw), media_type=RAW_MEDIA_TYPE, headers={COUNT_HEADER: str(len(raw))}
        )

    @app.post("/admin/weights")
    async def refresh_weights(request: Request) -> dict[str, Any]:
        require_admin(request)
        body: RefreshRequest = _model(RefreshRequest, await _json_body(request))
        return await service.weights.refresh(body.model_path, body.version)

    distributed = DistributedWeights(service.router, service.weights)

    @app.post("/admin/weights/group")
    async def weights_group(request: Request) -> dict[str, Any]:
        require_admin(request)
        body: GroupRequest = _model(GroupRequest, await _json_body(request))
        return await distributed.init_group(body)

    @app.post("/admin/weights/distributed")
    async def weights_distributed(request: Request) -> dict[str, Any]:
        require_admin(request)
        body: DistributedRefreshRequest = _model(
            DistributedRefreshRequest, await _json_body(request)
        )
        return await distributed.refresh(body)

    @app.get("/admin/versions")
    async def versions(request: Request) -> dict[str, Any]:
        require_admin(request)
        return await service.versions()

    publish_request_bodies(
        app,
        {
            "/v1/chat/completions": (ChatCompletionRequest, True),
            "/t/{trajectory_id}/v1/chat/completions": (ChatCompletionRequest, True),
            "/trajectories": (TrajectoryMeta, True),
            "/trajectories/{trajectory_id}/close": (CloseRequest, False),
            "/admin/weights": (RefreshRequest, True),
            "/admin/weights/group": (GroupRequest, True),
            "/admin/weights/distributed": (DistributedRefreshRequest, True),
        },
    )
    return app


def publish_request_bodies(app: FastAPI, bodies: dict[str, tuple[type[BaseModel], bool]]) -> None:
    """Describe the JSON bodies of POST routes in ``/openapi.json`` (and the id rule's pattern
    on ``trajectory_id`` path parameters).

    The routes read their bodies themselves (for error messages and input hygiene, see
    :mod:`adapter.hygiene`), so FastAPI does not know them; the schema is what clients and API
    fuzzers (schemathesis) generate bodies from.
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for operations in schema["paths"].values():
            for operation in operations.values():
                for parameter in operation.get("parameters", []):
                    if parameter["in"] == "path" and parameter["name"] == "trajectory_id":
                        parameter["schema"].update(
                            {"pattern": ID_PATTERN, "minLength": 1, "maxLength": ID_MAX_LENGTH}
                        )
        for path, (model, required) in bodies.items():
            model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(model_schema.pop("$defs", {}))
            components[model.__name__] = model_schema
            schema["paths"][path]["post"]["requestBody"] = {
                "required": required,
                "content": {
                    "application/json": {
                        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}
                    }
                },
            }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


class _Unexpected:
    """ASGI middleware: an unexpected exception becomes a JSON 500, and the connection stays up.

    Starlette's own last-resort handler re-raises after answering, and uvicorn then closes the
    keep-alive connection (the client's next request on it fails). Here the exception ends
    with the answer. Only an exception after the answer has started (a broken SSE stream)
    still goes up: a half-sent answer cannot be repaired.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:
                raise
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            error = APIError(500, f"internal error: {type(exc).__name__}: {exc}")
            await _error(error)(scope, receive, send)
