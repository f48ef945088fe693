"""The adapter's FastAPI application. Request handling itself lives in :mod:`adapter.service`.

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
``GET  /trajectories/{id}/raw``                 the binary entries (framing: ``raw_frames``)
``POST /admin/weights``                         ``{model_path, version}``, admin token
``POST /admin/weights/group``                   engines join the trainer's broadcast group; admin
``POST /admin/weights/distributed``             ``{version, group_name, buckets}``: refresh by
                                                broadcast (:mod:`adapter.weight_sync`); admin
``GET  /admin/versions``                        versions of the adapter and each engine, admin
``GET  /health``, ``GET /metrics``              liveness, Prometheus text
``GET  /readyz``                                 readiness: Redis reachable and an engine serving
==============================================  ================================================

The routes live in :mod:`adapter.routes`, one router per concern, with the service and the
credential checks injected as FastAPI dependencies (:mod:`adapter.routes.deps`); this module
assembles them and adds what every route shares: error handlers, the last-resort 500 middleware
and the published request bodies. Credentials are bearer tokens checked by :mod:`adapter.auth`
(worker and trajectory tokens only in training mode, i.e. with ``adapter.worker_token`` set).
Every error is ``{"error": {"message", "type", "code", "param"}}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adapter.errors import APIError
from adapter.routes import admin, chat, health, trajectories
from adapter.service import AdapterService
from adapter.weight_sync import DistributedWeights
from services.protocol.ids import ID_MAX_LENGTH, ID_PATTERN

if TYPE_CHECKING:
    from adapter.relay import RelayService

log = logging.getLogger("adapter.app")

ROUTERS = (chat, trajectories, admin, health)


def create_app(service: AdapterService | RelayService) -> FastAPI:
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
    relay = service.router is None  # relay mode: no engines, no weights
    app.state.distributed = None if relay else DistributedWeights(service.router, service.weights)
    install_error_handlers(app)
    if not service.access.training_mode:
        log.warning(
            "no adapter.worker_token: trajectory records and /t/<id>/ routes are open to "
            "anyone who reaches the adapter (development only; see docs/security.md)"
        )
    bodies: dict[str, tuple[type[BaseModel], bool]] = {}
    for module in ROUTERS:
        app.include_router(module.router)
        bodies.update(getattr(module, "REQUEST_BODIES", {}))
    publish_request_bodies(app, bodies)
    return app


def _error(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every error as ``{"error": {...}}``: APIError, FastAPI's validation errors, Starlette's
    404/405, and (middleware) any unexpected exception as a JSON 500."""

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
