"""Weight updates: from disk, and by broadcast (SGLang's ``/init_weights_update_group``,
``/destroy_weights_update_group``, the ``/begin_weight_update`` ... ``/end_weight_update``
session and ``/update_weights_from_distributed``, see
:mod:`services.reference_engine.distributed_weights`); reading a parameter back
(``/get_weights_by_name``).

Each answers as SGLang 0.5.23's ``http_server.py`` does: ``{success, message}`` (plus
``num_paused_requests`` for the disk route, always 0 as SGLang's scheduler reports it), 200 on
success and 400 otherwise. A successful load that carries ``weight_version`` moves the version
``/model_info`` reports and appends " Weight version updated to V." to the message (SGLang's
tokenizer manager, ``_update_weight_version_if_provided``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from http import HTTPStatus

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from services.protocol.sglang import (
    BeginWeightUpdateRequest,
    DestroyWeightsUpdateGroupRequest,
    EndWeightUpdateRequest,
    GetWeightsByNameRequest,
    InitWeightsUpdateGroupRequest,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    UpdateWeightVersionRequest,
)
from services.reference_engine.distributed_weights import (
    DistributedReceiver,
    DistributedUpdateError,
)
from services.reference_engine.engine import WeightUpdateResult
from services.reference_engine.model_runner import WeightLoadError
from services.reference_engine.routes import error_response
from services.reference_engine.state import ServerState, State
from services.reference_engine.weight_session import DISTRIBUTED_OUTSIDE

logger = logging.getLogger("services.reference_engine.server")

DISK_LOADED = "Succeeded to update model weights."
DISTRIBUTED_LOADED = "Succeeded to update parameter online."
GET_WEIGHTS_FAILED = "Get parameter by name failed"

router = APIRouter()


def _disk_result(success: bool, message: str) -> JSONResponse:
    content = {"success": success, "message": message, "num_paused_requests": 0}
    return JSONResponse(content, status_code=200 if success else HTTPStatus.BAD_REQUEST)


def _result(success: bool, message: str) -> JSONResponse:
    content = {"success": success, "message": message}
    return JSONResponse(content, status_code=200 if success else HTTPStatus.BAD_REQUEST)


async def _load(
    state: ServerState,
    future: Future[WeightUpdateResult],
    version: str | None,
) -> WeightUpdateResult:
    """Await the engine's load; a success with a version moves the tokenizer manager's version
    (what ``/model_info`` reports) and says so, as SGLang's tokenizer manager does."""
    result = await asyncio.wrap_future(future)
    if not result.success or version is None:
        return result
    state.engine.tokenizer_weight_version = version
    return WeightUpdateResult(True, f"{result.message} Weight version updated to {version}.")


async def _abort_all_first(state: ServerState, abort_all_requests: bool) -> None:
    """SGLang's tokenizer manager aborts every request before anything else of the update."""
    if abort_all_requests:
        await asyncio.wrap_future(state.engine.abort("", True))


@router.post("/update_weights_from_disk")
async def update_weights_from_disk(
    body: UpdateWeightsFromDiskRequest, state: State
) -> JSONResponse:
    """No session needed (SGLang's ``update_weights_from_disk`` does not check one)."""
    await _abort_all_first(state, body.abort_all_requests)
    if body.load_format not in (None, "auto", "safetensors"):
        return _disk_result(False, f"load_format {body.load_format!r} is not supported")
    started = time.perf_counter()
    try:
        tensors = await asyncio.to_thread(state.runner.read_weights, body.model_path)
    except WeightLoadError as exc:
        return _disk_result(False, str(exc))
    future = state.engine.update_weights(
        tensors, body.weight_version, body.flush_cache, loaded_message=DISK_LOADED
    )
    result = await _load(state, future, body.weight_version)
    logger.info(
        "update_weights_from_disk %s -> %s (%.3f s): %s",
        body.model_path,
        state.engine.weight_version,
        time.perf_counter() - started,
        result.message,
    )
    return _disk_result(result.success, result.message)


def receiver_of(state: ServerState) -> DistributedReceiver:
    """The state's broadcast receiver (made with the first group request)."""
    if state.receiver is None:
        state.receiver = DistributedReceiver(state.runner, tp_size=state.tp_size)
    return state.receiver


@router.post("/init_weights_update_group")
async def init_weights_update_group(
    body: InitWeightsUpdateGroupRequest, state: State
) -> JSONResponse:
    try:
        message = await asyncio.to_thread(receiver_of(state).init_group, body)
    except DistributedUpdateError as exc:
        return _result(False, str(exc))
    return _result(True, message)


@router.post("/destroy_weights_update_group")
async def destroy_weights_update_group(
    body: DestroyWeightsUpdateGroupRequest, state: State
) -> JSONResponse:
    """SGLang's ``destroy_weights_update_group``: no lock, no session."""
    try:
        message = receiver_of(state).destroy_group(body.group_name)
    except DistributedUpdateError as exc:
        return _result(False, str(exc))
    return _result(True, message)


async def _session_call(state: ServerState, call: Callable[[], tuple[bool, str]]) -> JSONResponse:
    """``_weight_update_session_call``: under the writer lock unless paused."""
    success, message = await asyncio.wrap_future(state.engine.exclusive(call))
    return _result(success, message)


@router.post("/begin_weight_update")
async def begin_weight_update(body: BeginWeightUpdateRequest, state: State) -> JSONResponse:
    return await _session_call(state, lambda: state.session.begin(body.selector))


@router.post("/end_weight_update")
async def end_weight_update(body: EndWeightUpdateRequest, state: State) -> JSONResponse:
    return await _session_call(state, state.session.end)


@router.post("/update_weights_from_distributed")
async def update_weights_from_distributed(
    body: UpdateWeightsFromDistributedRequest, state: State
) -> JSONResponse:
    """One bucket: refused outside a session before anything is received; else received in
    full, checked, and loaded at once (see :mod:`services.reference_engine.distributed_weights`)."""
    await _abort_all_first(state, body.abort_all_requests)
    if not state.session.is_open:
        return _result(False, DISTRIBUTED_OUTSIDE)
    started = time.perf_counter()
    try:
        tensors = await asyncio.to_thread(receiver_of(state).receive, body)
    except DistributedUpdateError as exc:
        return _result(False, str(exc))
    future = state.engine.update_weights(
        tensors,
        body.weight_version,
        body.flush_cache,
        loaded_message=DISTRIBUTED_LOADED,
        on_loaded=state.session.mark_loaded,
    )
    result = await _load(state, future, body.weight_version)
    logger.info(
        "update_weights_from_distributed %d tensors -> %s (%.3f s): %s",
        len(tensors),
        state.engine.weight_version,
        time.perf_counter() - started,
        result.message,
    )
    return _result(result.success, result.message)


@router.post("/update_weight_version")
async def update_weight_version(body: UpdateWeightVersionRequest, state: State) -> JSONResponse:
    """SGLang's route: abort everything if asked (its default), then both the scheduler's and
    the tokenizer manager's version are the new one; answers ``{success, message,
    new_version}``."""
    await _abort_all_first(state, body.abort_all_requests)
    await asyncio.wrap_future(state.engine.set_weight_version(body.new_version))
    state.engine.tokenizer_weight_version = body.new_version
    content = {
        "success": True,
        "message": f"Weight version updated to {body.new_version}",
        "new_version": body.new_version,
    }
    return JSONResponse(content, status_code=200)


@router.api_route("/get_weights_by_name", methods=["GET", "POST"])
async def get_weights_by_name(body: GetWeightsByNameRequest, state: State) -> JSONResponse:
    """The parameter's first ``truncate_size`` entries along its first dimension, as a JSON
    list, for the model classes SGLang implements it for (``--get-weights-by-name``, see
    :func:`services.reference_engine.state.reads_weights_by_name`); otherwise, and for a name
    the model does not have, SGLang's ``_create_error_response("Get parameter by name
    failed")``: 400 ``{"error": {"message": ...}}``."""
    if not state.reads_weights_by_name:
        return error_response(GET_WEIGHTS_FAILED)
    tensor = state.runner.weight_by_name(body.name)
    if tensor is None:
        return error_response(GET_WEIGHTS_FAILED)
    values = tensor.detach()[: body.truncate_size].float().tolist()
    return JSONResponse(values)
