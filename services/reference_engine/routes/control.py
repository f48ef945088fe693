"""Scheduling control: pause / continue generation, abort requests, flush the prefix cache."""

from __future__ import annotations

import asyncio
import json
import time
from http import HTTPStatus

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from services.protocol.sglang import AbortRequest, PauseGenerationRequest
from services.reference_engine.state import State

FLUSH_CACHE_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
FLUSH_FAILED_TEXT = "Flush cache failed.\n"
FLUSH_TIMED_OUT = "Timed out waiting for idle state."
FLUSH_POLL_S = 0.05

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
async def flush_cache(state: State, timeout: float = Query(0.0, ge=0.0)) -> Response:
    """SGLang's ``/flush_cache``: refused (400 "Flush cache failed.") while requests are
    running, or queued unless generation is paused in place; with ``timeout`` > 0 a refused
    flush is retried until the engine is idle or the timeout passes (SGLang's deferred flush,
    ``SchedulerFlushWrapper``: "Timed out waiting for idle state.")."""
    deadline = time.monotonic() + timeout
    while True:
        if await asyncio.wrap_future(state.engine.flush_cache()):
            return Response(content=FLUSH_CACHE_TEXT, status_code=200)
        if timeout <= 0:
            return Response(content=FLUSH_FAILED_TEXT, status_code=HTTPStatus.BAD_REQUEST)
        if time.monotonic() >= deadline:
            return Response(content=FLUSH_TIMED_OUT, status_code=HTTPStatus.BAD_REQUEST)
        await asyncio.sleep(FLUSH_POLL_S)
