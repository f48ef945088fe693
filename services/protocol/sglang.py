"""The subset of SGLang's native HTTP protocol that swerl uses, as typed models.

Shared by the reference engine (which must accept and produce exactly this) and the SGLang client
(which validates what a real or reference server answers). Field names, shapes and defaults follow
SGLang's ``GenerateReqInput``, ``SamplingParams``, ``UpdateWeightFromDiskReqInput``,
``PauseGenerationReqInput``, ``AbortReq`` and the ``meta_info`` that its tokenizer manager builds:

* ``POST /generate`` takes ``input_ids`` (one list, or a batch of lists) or ``text``,
  ``sampling_params``, ``return_logprob``, ``rid``, ``stream`` and answers
  ``{"text", "output_ids", "meta_info"}`` (a list of those for a batch).
* ``meta_info.output_token_logprobs`` is a list of ``[logprob, token_id, text_or_null]``
  (text only with ``return_text_in_logprobs``); with ``top_logprobs_num = k > 0``,
  ``meta_info.output_top_logprobs`` has one entry per output token: a list of the ``k`` most
  likely ``[logprob, token_id, text_or_null]``, most likely first (or ``null``).
* ``meta_info.finish_reason`` is ``{"type": "stop", "matched": int | str}``,
  ``{"type": "length", "length": int}`` or ``{"type": "abort", "message": str}``; it is ``null``
  in streamed chunks until the last one.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

# SGLang treats a temperature below this as greedy (top_k = 1, temperature = 1).
SAMPLING_EPS = 1e-6

# Sampling fields SGLang knows that the reference engine accepts only at their neutral value:
# they change the distribution in ways the reference engine does not model.
NEUTRAL_SAMPLING_DEFAULTS: dict[str, Any] = {
    "min_new_tokens": 0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "n": 1,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "custom_params": None,
    "logit_bias": None,
}
# Sampling fields SGLang knows that only shape text output (or are hints); accepted and ignored.
IGNORED_SAMPLING_FIELDS: frozenset[str] = frozenset(
    {"spaces_between_special_tokens", "stream_interval"}
)


class SamplingParams(BaseModel):
    """SGLang ``sampling_params`` (the fields swerl uses, with SGLang's defaults)."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(default=128, ge=0)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = -1
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    # Constrained decoding: a JSON schema as a string (what SGLang's OpenAI server sends for
    # response_format). The reference engine refuses it (see reference_server).
    json_schema: str | None = None

    @field_validator("top_k")
    @classmethod
    def _check_top_k(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {value}")
        return value

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        strings = [value] if isinstance(value, str) else (value or [])
        if any(s == "" for s in strings):
            raise ValueError("stop strings must not be empty")
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _check_stop_ids(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(i < 0 for i in value):
            raise ValueError("stop_token_ids must be non-negative")
        return value

    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def to_wire(self) -> dict[str, Any]:
        """The JSON object to send: only fields that differ from SGLang's defaults."""
        return self.model_dump(exclude_defaults=True)


class GenerateRequest(BaseModel):
    """Body of ``POST /generate`` (SGLang ``GenerateReqInput`` subset)."""

    model_config = ConfigDict(extra="ignore")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool | list[bool] = False
    logprob_start_len: int | list[int] = -1
    top_logprobs_num: int | list[int] = 0
    return_text_in_logprobs: bool = False
    rid: str | list[str] | None = None
    stream: bool = False

    @property
    def is_batch(self) -> bool:
        if self.input_ids is not None:
            return bool(self.input_ids) and isinstance(self.input_ids[0], list)
        return isinstance(self.text, list)


FinishType = Literal["stop", "length", "abort"]


class FinishReason(BaseModel):
    """``meta_info.finish_reason`` of a finished request."""

    model_config = ConfigDict(extra="allow")

    type: FinishType
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None


LogprobEntry = Annotated[list[Any], Field(min_length=3, max_length=3)]


class MetaInfo(BaseModel):
    """``meta_info`` of a ``/generate`` answer (fields swerl reads; others pass through)."""

    model_config = ConfigDict(extra="allow")

    id: str
    finish_reason: FinishReason | None
    # SGLang 0.5.23 leaves prompt_tokens and cached_tokens out of the answer of a request
    # aborted while still queued (``TokenizerManager._handle_abort_req``): optional here.
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int = Field(ge=0)
    cached_tokens: int = Field(default=0, ge=0)
    weight_version: str | None = None
    e2e_latency: float | None = None
    output_token_logprobs: list[LogprobEntry] | None = None
    output_top_logprobs: list[list[LogprobEntry] | None] | None = None
    # The reference engine's scripted mode (test machinery; SGLang never sends it): the output
    # replays a script instead of sampling the policy.
    scripted: StrictBool = False


class GenerateOutput(BaseModel):
    """One ``/generate`` answer (or one streamed chunk)."""

    model_config = ConfigDict(extra="allow")

    text: str = ""
    output_ids: list[int]
    meta_info: MetaInfo


class UpdateWeightsFromDiskRequest(BaseModel):
    """Body of ``POST /update_weights_from_disk`` (SGLang ``UpdateWeightFromDiskReqInput``)."""

    model_config = ConfigDict(extra="ignore")

    model_path: str = Field(min_length=1)
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class UpdateWeightsResult(BaseModel):
    model_config = ConfigDict(extra="allow")

    success: bool
    message: str
    num_paused_requests: int | None = 0


class GetWeightsByNameRequest(BaseModel):
    """Body of ``GET|POST /get_weights_by_name`` (SGLang ``GetWeightsByNameReqInput``): the
    answer is the parameter's first ``truncate_size`` entries (along its first dimension) as a
    JSON list."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1)
    truncate_size: int = Field(default=100, ge=1)


class InitWeightsUpdateGroupRequest(BaseModel):
    """Body of ``POST /init_weights_update_group`` (SGLang ``InitWeightsUpdateGroupReqInput``)."""

    model_config = ConfigDict(extra="ignore")

    master_address: str = Field(min_length=1)
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(ge=1)
    world_size: int = Field(ge=2)
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class UpdateWeightsFromDistributedRequest(BaseModel):
    """Body of ``POST /update_weights_from_distributed`` (SGLang
    ``UpdateWeightsFromDistributedReqInput``): one bucket of tensors that rank 0 broadcasts,
    in this order, while the call runs."""

    model_config = ConfigDict(extra="ignore")

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None


class WeightsUpdateGroupResult(BaseModel):
    """Answer of both distributed weight routes: ``{success, message}``, 200 or 400."""

    model_config = ConfigDict(extra="allow")

    success: bool
    message: str


PauseMode = Literal["abort", "retract", "in_place"]


class PauseGenerationRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    mode: PauseMode = "abort"


class AbortRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    rid: str = ""
    abort_all: bool = False


class ModelInfo(BaseModel):
    """``GET /model_info``; ``weight_version`` is where current SGLang reports the version."""

    model_config = ConfigDict(extra="allow")

    model_path: str
    is_generation: bool = True
    weight_version: str | None = None


RunnerSelector = Literal["target", "draft", "all"]


class BeginWeightUpdateRequest(BaseModel):
    """Body of ``POST /begin_weight_update`` (SGLang ``BeginWeightUpdateReqInput``): opens the
    weight-update session that ``/update_weights_from_distributed`` must run inside."""

    model_config = ConfigDict(extra="ignore")

    selector: RunnerSelector = "all"


class EndWeightUpdateRequest(BaseModel):
    """Body of ``POST /end_weight_update`` (SGLang ``EndWeightUpdateReqInput``: no fields)."""

    model_config = ConfigDict(extra="ignore")


class DestroyWeightsUpdateGroupRequest(BaseModel):
    """Body of ``POST /destroy_weights_update_group`` (SGLang
    ``DestroyWeightsUpdateGroupReqInput``)."""

    model_config = ConfigDict(extra="ignore")

    group_name: str = "weight_update_group"


class UpdateWeightVersionRequest(BaseModel):
    """Body of ``POST /update_weight_version`` (SGLang ``UpdateWeightVersionReqInput``): the
    version the engine reports from now on; ``abort_all_requests`` defaults to true there."""

    model_config = ConfigDict(extra="ignore")

    new_version: str
    abort_all_requests: bool = True
