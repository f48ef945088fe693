"""OpenAI routes: chat completions (untracked, and recorded under ``/t/<id>/``) and models."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from adapter.errors import APIError
from adapter.openai_schema import ChatCompletionRequest, completion_response, stream_chunks
from adapter.routes.deps import Service, json_body
from adapter.service import AdapterService, ChatOutcome

router = APIRouter()

REQUEST_BODIES: dict[str, tuple[type[BaseModel], bool]] = {
    "/v1/chat/completions": (ChatCompletionRequest, True),
    "/t/{trajectory_id}/v1/chat/completions": (ChatCompletionRequest, True),
}


@router.post("/v1/chat/completions")
async def chat_untracked(request: Request, service: Service) -> Response:
    return await _chat(service, request, None)


@router.post("/t/{trajectory_id}/v1/chat/completions")
async def chat_tracked(trajectory_id: str, request: Request, service: Service) -> Response:
    return await _chat(service, request, trajectory_id)


@router.get("/v1/models")
async def list_models(service: Service) -> dict[str, Any]:
    return _models(service)


@router.get("/t/{trajectory_id}/v1/models")
async def list_models_tracked(
    trajectory_id: str, request: Request, service: Service
) -> dict[str, Any]:
    service.validate_id(trajectory_id)
    await service.authorize_trajectory(trajectory_id, request.headers)
    return _models(service)


async def _chat(service: AdapterService, request: Request, trajectory_id: str | None) -> Response:
    """Authorize, answer and count one chat completion (``trajectory_id`` None: untracked)."""
    route = "trajectory" if trajectory_id else "untracked"
    started = time.perf_counter()
    try:
        if trajectory_id is None:
            service.access.require_untracked(request.headers)
        else:
            await service.authorize_trajectory(trajectory_id, request.headers)
        outcome = await service.chat(trajectory_id, await json_body(request))
    except APIError as exc:
        service.metrics.requests.labels(route=route, status=str(exc.status)).inc()
        raise
    service.metrics.requests.labels(route=route, status="ok").inc()
    service.metrics.request_latency.labels(route=route).observe(time.perf_counter() - started)
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


def _models(service: AdapterService) -> dict[str, Any]:
    model = {
        "id": service.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "swerl",
        "max_model_len": service.context_length,
    }
    return {"object": "list", "data": [model]}


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
