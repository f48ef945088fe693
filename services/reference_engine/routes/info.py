"""Health, model info, weight version, load and server info."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from services.protocol.sglang import SamplingParams
from services.reference_engine.engine import EngineRequest
from services.reference_engine.generate_requests import no_sink
from services.reference_engine.routes.generate import run_to_end
from services.reference_engine.state import ServerState, State

HEALTH_CHECK_TIMEOUT_S = 20.0

router = APIRouter()


@router.get("/health")
async def health(state: State) -> Response:
    return Response(status_code=200 if state.engine.alive else 503)


@router.get("/health_generate")
async def health_generate(http: Request, state: State) -> Response:
    if not state.engine.alive:
        return Response(status_code=503)
    if state.engine.load()["num_running_reqs"] and state.engine.paused is None:
        return Response(status_code=200)
    probe = EngineRequest(
        rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
        prompt=[0],
        sampling=SamplingParams(max_new_tokens=1, temperature=0.0),
        sink=no_sink,
    )
    try:
        await asyncio.wait_for(run_to_end(state, probe, http), HEALTH_CHECK_TIMEOUT_S)
    except TimeoutError:
        state.engine.cancel(probe.rid)
        return Response(status_code=503)
    return Response(status_code=200)


def model_info(state: ServerState) -> dict[str, Any]:
    config = state.runner.config
    return {
        "model_path": state.model_path,
        "tokenizer_path": state.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": state.engine.tokenizer_weight_version,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": getattr(config, "model_type", None),
        "architectures": getattr(config, "architectures", None),
        "engine": "swerl-reference-scripted" if state.script else "swerl-reference",
        "scripted": state.script is not None,
        "script_path": state.script.path if state.script else None,
        "context_length": state.runner.context_length,
        "vocab_size": state.runner.vocab_size,
    }


@router.get("/model_info")
@router.get("/get_model_info")
async def get_model_info(state: State) -> dict[str, Any]:
    return model_info(state)


@router.get("/get_weight_version")
@router.get("/weight_version")
async def weight_version(state: State) -> dict[str, Any]:
    return {"weight_version": state.engine.tokenizer_weight_version}


@router.get("/get_load")
async def get_load(state: State) -> list[dict[str, Any]]:
    load = state.engine.load()
    return [
        {
            "dp_rank": 0,
            "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
            "num_waiting_reqs": load["num_waiting_reqs"],
            "ts_tic": time.perf_counter(),
        }
    ]


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(state: State) -> dict[str, Any]:
    return {
        **model_info(state),
        "paused": state.engine.paused,
        "steps": state.engine.steps,
        "decoded_tokens": state.engine.decoded_tokens,
        "prefix_cache_entries": len(state.engine.prefix_cache),
        "tp_size": state.tp_size,
        "num_held_reqs": state.engine.num_held(),
        "weight_update_session": state.session.is_open,
        **state.engine.load(),
    }
