"""Scheduling control: pause / continue generation, abort requests, flush the prefix cache."""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from services.protocol.sglang import AbortRequest, PauseGenerationRequest
from services.reference_engine.state import State

FLUSH_CACHE_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)

router = APIRouter()


@router.post("/pause_generation")
async def pause_generation(body: PauseGenerationRequest, state: State) -> JSONResponse:
    await asyncio.wrap_future(state.engine.pause(body.mode))
    return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})


@router.post("/continue_generation")
async def continue_generation(http: Request, state: State) -> JSONResponse:
    raw = await http.body()
    if raw.strip():
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            return JSONResponse(
                {"detail": "continue_generation takes a JSON object body"}, status_code=422
            )
    await asyncio.wrap_future(state.engine.resume())
    return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})


@router.post("/abort_request")
async def abort_request(body: AbortRequest, state: State) -> Response:
    await asyncio.wrap_future(state.engine.abort(body.rid, body.abort_all))
    return Response(status_code=200)


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(state: State) -> Response:
    ok = await asyncio.wrap_future(state.engine.flush_cache())
    return Response(content=FLUSH_CACHE_TEXT, status_code=200 if ok else 400)
