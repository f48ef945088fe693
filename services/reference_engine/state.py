"""The reference engine server's state, and the FastAPI dependency that hands it to a route."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from fastapi import Depends, Request

from services.reference_engine.distributed_weights import DistributedReceiver
from services.reference_engine.engine import ReferenceEngine
from services.reference_engine.model_runner import ModelRunner
from services.reference_engine.script import ScriptBook
from services.reference_engine.weight_session import WeightUpdateSession

# The architectures whose SGLang 0.5.23 model class has ``get_weights_by_name``: the classes
# that define it (sglang/srt/models/llama.py, granite.py, opt.py, exaone4.py,
# embedding_gemma2.py) and the registered classes that inherit it. For every other class
# (Qwen3ForCausalLM, Qwen3MoeForCausalLM, ...) SGLang's weight exporter answers None and
# ``/get_weights_by_name`` fails.
SGLANG_GET_WEIGHTS_BY_NAME_ARCHITECTURES = frozenset(
    {
        "LlamaForCausalLM",
        "Phi3ForCausalLM",
        "InternLM3ForCausalLM",
        "IQuestCoderForCausalLM",
        "MistralForCausalLM",
        "Ministral3ForCausalLM",
        "Llama4ForCausalLM",
        "TeleFLMForCausalLM",
        "LlamaForCausalLMEagle",
        "LlamaForCausalLMEagle3",
        "MistralForCausalLMEagle",
        "GraniteForCausalLM",
        "GraniteSWAForCausalLM",
        "OPTForCausalLM",
        "Exaone4ForCausalLM",
        "EmbeddingGemma2Model",
    }
)

GetWeightsByName = Literal["sglang", "always"]


def reads_weights_by_name(architectures: list[str] | None, mode: GetWeightsByName) -> bool:
    """Whether ``/get_weights_by_name`` answers: ``always`` (test opt-in), or ``sglang``: when
    the architecture SGLang would load (the first of ``architectures``) has the method."""
    if mode == "always":
        return True
    return bool(architectures) and architectures[0] in SGLANG_GET_WEIGHTS_BY_NAME_ARCHITECTURES


@dataclass
class ServerState:
    engine: ReferenceEngine
    runner: ModelRunner
    model_path: str
    script: ScriptBook | None
    receiver: DistributedReceiver | None = None
    tp_size: int = 1  # ranks taken in a weight-update group (--tp-size; SGLang's TP workers)
    session: WeightUpdateSession = field(default_factory=WeightUpdateSession)
    get_weights_by_name: GetWeightsByName = "sglang"  # --get-weights-by-name

    @property
    def reads_weights_by_name(self) -> bool:
        architectures = getattr(self.runner.config, "architectures", None)
        return reads_weights_by_name(architectures, self.get_weights_by_name)


async def get_state(request: Request) -> ServerState:
    """The state :func:`services.reference_engine.server.create_app` put on ``app.state``
    (``async``: FastAPI runs a plain ``def`` dependency in a worker thread)."""
    state: ServerState = request.app.state.server
    return state


State = Annotated[ServerState, Depends(get_state)]
