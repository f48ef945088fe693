"""``POST|PUT /generate``: single, batch and streamed generation, aborted when the client leaves."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from services.protocol.sglang import GenerateRequest
from services.reference_engine.engine import EngineRequest
from services.reference_engine.generate_requests import build_requests
from services.reference_engine.routes import error_response
from services.reference_engine.state import ServerState, State

logger = logging.getLogger("services.reference_engine.server")

DISCONNECT_POLL_S = 1.0

router = APIRouter()


@router.api_route("/generate", methods=["POST", "PUT"], response_model=None)
async def generate(
    body: GenerateRequest, http: Request, state: State
) -> Response | dict[str, Any] | list[Any]:
    try:
        requests = build_requests(body, state)
    except ValueError as exc:
        return error_response(str(exc))
    if body.stream:
        try:
            stream = _stream(state, requests[0])
            first = await anext(stream)
        except ValueError as exc:
            return error_response(str(exc))

        async def chained() -> AsyncIterator[bytes]:
            yield first
            async for chunk in stream:
                yield chunk

        return StreamingResponse(chained(), media_type="text/event-stream")
    # JSONResponse directly: FastAPI's generic encoder walks every logprob entry.
    try:
        if not body.is_batch:
            return JSONResponse(await run_to_end(state, requests[0], http))
        tasks = []
        for request in requests:
            tasks.append(asyncio.ensure_future(run_to_end(state, request, http)))
            await asyncio.sleep(0)
        return JSONResponse(list(await asyncio.gather(*tasks)))
    except ValueError as exc:  # duplicate rid
        return error_response(str(exc))


def _attach_queue(request: EngineRequest) -> asyncio.Queue[tuple[dict[str, Any], bool]]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[dict[str, Any], bool]] = asyncio.Queue()

    def sink(output: dict[str, Any], finished: bool) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (output, finished))

    request.sink = sink
    return queue


async def run_to_end(state: ServerState, request: EngineRequest, http: Request) -> dict[str, Any]:
    queue = _attach_queue(request)
    state.engine.submit(request)
    aborted = False
    while True:
        try:
            output, finished = await asyncio.wait_for(queue.get(), timeout=DISCONNECT_POLL_S)
        except TimeoutError:
            if not aborted and await http.is_disconnected():
                logger.info("client disconnected; aborting %s", request.rid)
                state.engine.cancel(request.rid)
                aborted = True
            continue
        if finished:
            return output


async def _stream(state: ServerState, request: EngineRequest) -> AsyncIterator[bytes]:
    queue = _attach_queue(request)
    state.engine.submit(request)
    finished = False
    try:
        while not finished:
            output, finished = await queue.get()
            yield b"data: " + json.dumps(output).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        if not finished:
            state.engine.cancel(request.rid)
