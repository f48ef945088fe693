"""Weight updates: from disk, and by broadcast (SGLang's ``/init_weights_update_group`` and
``/update_weights_from_distributed``, see :mod:`services.reference_engine.distributed_weights`);
reading a parameter back (``/get_weights_by_name``, what a refresh's spot check asks)."""

from __future__ import annotations

import asyncio
import logging
import time
from http import HTTPStatus

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from services.protocol.sglang import (
    GetWeightsByNameRequest,
    InitWeightsUpdateGroupRequest,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
)
from services.reference_engine.distributed_weights import (
    DistributedReceiver,
    DistributedUpdateError,
)
from services.reference_engine.model_runner import WeightLoadError
from services.reference_engine.state import ServerState, State

logger = logging.getLogger("services.reference_engine.server")

router = APIRouter()


def _disk_result(success: bool, message: str, paused: int = 0) -> JSONResponse:
    content = {"success": success, "message": message, "num_paused_requests": paused}
    return JSONResponse(content, status_code=200 if success else HTTPStatus.BAD_REQUEST)


def _group_result(success: bool, message: str) -> JSONResponse:
    content = {"success": success, "message": message}
    return JSONResponse(content, status_code=200 if success else HTTPStatus.BAD_REQUEST)


@router.post("/update_weights_from_disk")
async def update_weights_from_disk(
    body: UpdateWeightsFromDiskRequest, state: State
) -> JSONResponse:
    if body.load_format not in (None, "auto", "safetensors"):
        return _disk_result(False, f"load_format {body.load_format!r} is not supported")
    started = time.perf_counter()
    try:
        tensors = await asyncio.to_thread(state.runner.read_weights, body.model_path)
    except WeightLoadError as exc:
        return _disk_result(False, str(exc))
    future = state.engine.update_weights(
        tensors, body.weight_version, body.abort_all_requests, body.flush_cache
    )
    success, message, paused = await asyncio.wrap_future(future)
    logger.info(
        "update_weights_from_disk %s -> %s (%.3f s): %s",
        body.model_path,
        state.engine.weight_version,
        time.perf_counter() - started,
        message,
    )
    return _disk_result(success, message, paused)


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
        return _group_result(False, str(exc))
    return _group_result(True, message)


@router.post("/update_weights_from_distributed")
async def update_weights_from_distributed(
    body: UpdateWeightsFromDistributedRequest, state: State
) -> JSONResponse:
    started = time.perf_counter()
    try:
        tensors = await asyncio.to_thread(receiver_of(state).receive, body)
    except DistributedUpdateError as exc:
        return _group_result(False, str(exc))
    except Exception as exc:  # a broken broadcast (peer gone, timeout)
        return _group_result(False, f"broadcast failed: {type(exc).__name__}: {exc}")
    if tensors is None:
        return _group_result(True, f"Staged {len(body.names)} tensors (no weight_version).")
    future = state.engine.update_weights(
        tensors, body.weight_version, body.abort_all_requests, body.flush_cache
    )
    success, message, _ = await asyncio.wrap_future(future)
    logger.info(
        "update_weights_from_distributed %d tensors -> %s (%.3f s): %s",
        len(tensors),
        state.engine.weight_version,
        time.perf_counter() - started,
        message,
    )
    return _group_result(success, message)


@router.api_route("/get_weights_by_name", methods=["GET", "POST"])
async def get_weights_by_name(body: GetWeightsByNameRequest, state: State) -> JSONResponse:
    """The parameter's first ``truncate_size`` entries along its first dimension, as a JSON
    list (SGLang's answer); an unknown name is a 400."""
    tensor = state.runner.weight_by_name(body.name)
    if tensor is None:
        message = f"Get parameter by name failed: no parameter {body.name!r}"
        return JSONResponse({"error": {"message": message}}, status_code=HTTPStatus.BAD_REQUEST)
    values = tensor.detach()[: body.truncate_size].float().tolist()
    return JSONResponse(values)
