"""The reference engine server's state, and the FastAPI dependency that hands it to a route."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from services.reference_engine.distributed_weights import DistributedReceiver
from services.reference_engine.engine import ReferenceEngine
from services.reference_engine.model_runner import ModelRunner
from services.reference_engine.script import ScriptBook


@dataclass
class ServerState:
    engine: ReferenceEngine
    runner: ModelRunner
    model_path: str
    script: ScriptBook | None
    receiver: DistributedReceiver | None = None
    tp_size: int = 1  # ranks taken in a weight-update group (--tp-size; SGLang's TP workers)


async def get_state(request: Request) -> ServerState:
    """The state :func:`services.reference_engine.server.create_app` put on ``app.state``
    (``async``: FastAPI runs a plain ``def`` dependency in a worker thread)."""
    state: ServerState = request.app.state.server
    return state


State = Annotated[ServerState, Depends(get_state)]
