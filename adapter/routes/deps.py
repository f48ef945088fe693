"""Dependencies the routers inject (FastAPI ``Depends``) and the request-body helpers they share.

The service lives on ``app.state`` (set by :func:`adapter.app.create_app`); routers never close
over it, so each router module can be read, and mounted, on its own. The providers are ``async``
so that FastAPI calls them on the event loop (a plain ``def`` dependency is run in a worker
thread: a thread hop per request on the chat path).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from pydantic import BaseModel, ValidationError

from adapter.errors import APIError
from adapter.hygiene import decode_json
from adapter.service import AdapterService
from adapter.weight_sync import DistributedWeights


async def get_service(request: Request) -> AdapterService:
    service: AdapterService = request.app.state.service
    return service


async def get_distributed(request: Request) -> DistributedWeights:
    distributed: DistributedWeights | None = request.app.state.distributed
    if distributed is None:
        raise APIError(
            409, "relay mode: the adapter serves an upstream endpoint, it has no weights",
            code="relay_mode",
        )  # fmt: skip
    return distributed


Service = Annotated[AdapterService, Depends(get_service)]
Distributed = Annotated[DistributedWeights, Depends(get_distributed)]


async def require_admin(request: Request, service: Service) -> None:
    """The admin token (``/admin/*``)."""
    service.access.require_admin(request.headers)


async def require_worker(request: Request, service: Service) -> None:
    """The worker token in training mode (``/trajectories...``)."""
    service.access.require_worker(request.headers)


def _validation_message(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'body'}: "
        f"{'field required' if e['type'] == 'missing' else e['msg']}"
        for e in exc.errors()
    )


async def read_body(request: Request, limit: int) -> bytes:
    """The body, read only while it stays within ``limit`` bytes (413 else): a declared
    ``Content-Length`` over the limit is refused before anything is read."""
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


async def json_body(request: Request, required: bool = True, limit: int | None = None) -> Any:
    """The body as JSON (:func:`adapter.hygiene.decode_json`), within ``limit`` bytes (default:
    the service's ``max_body_bytes``); an empty body is a 400 when ``required``, else None."""
    service: AdapterService = request.app.state.service
    raw = await read_body(request, service.max_body_bytes if limit is None else limit)
    if not raw.strip():
        if required:
            raise APIError(400, "request body is empty: a JSON object is required")
        return None
    return decode_json(raw)


async def model_body[M: BaseModel](
    request: Request, model: type[M], required: bool = True, limit: int | None = None
) -> M:
    """The body validated as ``model`` (400 naming the fields; no body is ``{}`` when optional)."""
    body = await json_body(request, required, limit)
    try:
        return model.model_validate(body if body is not None else {})
    except ValidationError as exc:
        raise APIError(400, _validation_message(exc)) from None
