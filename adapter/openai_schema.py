"""OpenAI chat-completions request and response shapes, as OpenHands' SDK (litellm) sends them.

Accepted on input, besides the classic fields: message content as a string or a list of text
parts (extra keys such as ``cache_control`` ignored), ``max_completion_tokens``, tool results as
role ``tool`` with ``tool_call_id`` and ``name``, role ``developer`` (treated as ``system``).

Nothing at the request's top level is silently ignored (:class:`ChatCompletionRequest`): every
OpenAI field is honoured, or accepted as bookkeeping with no effect on the output
(:data:`METADATA_FIELDS`: ``user``, ``metadata``, ``prompt_cache_key``...), or refused with a
400 that names it (``n > 1``, ``tool_choice`` other than auto/none, non-zero penalties,
``reasoning_effort``, ``parallel_tool_calls=false``...); unknown fields are refused too. Types
are strict: ``"5"`` is not an integer and ``1`` is not ``true``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from adapter.errors import APIError


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One message of the conversation. Unknown keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        if isinstance(value, list):
            for i, part in enumerate(value):
                kind = part.get("type")
                if kind != "text":
                    raise ValueError(
                        f"content part {i} has type {kind!r}; only text parts are supported"
                    )
                if not isinstance(part.get("text"), str):
                    raise ValueError(f"content part {i} needs a string 'text'")
        return value

    def text(self) -> str:
        """The content as one string (text parts concatenated, as the chat template does)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part["text"] for part in self.content)


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionSpec


def _json_int(value: Any) -> Any:
    """JSON integers only: ``5`` and ``5.0`` (a JSON number with a zero fraction), never
    ``"5"`` or ``true`` (pydantic's lax mode would coerce those)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be an integer (a JSON number, not a string or boolean)")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be a whole number")
        return int(value)
    return value


def _json_number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number (a JSON number, not a string or boolean)")
    return value


JSONInt = Annotated[int, BeforeValidator(_json_int)]
JSONNumber = Annotated[float, BeforeValidator(_json_number)]
# Strict models: no coercion between JSON types ("5" is not 5, 1 is not true).
_STRICT = ConfigDict(extra="forbid", strict=True)


class StreamOptions(BaseModel):
    model_config = _STRICT

    include_usage: bool = False
    include_obfuscation: bool | None = None  # refused when true (no obfuscation padding)


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """``response_format``: ``text``, ``json_object`` or ``json_schema`` (SGLang's mapping)."""

    model_config = _STRICT

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required exactly when type is 'json_schema'")
        return self

    @property
    def constrains(self) -> bool:
        return self.type != "text"

    def engine_json_schema(self) -> str | None:
        """SGLang's ``sampling_params.json_schema`` for this format (as SGLang's OpenAI server
        builds it: ``{"type": "object"}`` for ``json_object``)."""
        if self.type == "json_object":
            return '{"type": "object"}'
        if self.type == "json_schema" and self.json_schema is not None:
            return json.dumps(self.json_schema.schema_ or {})
        return None


# Request fields with no effect on what is generated (bookkeeping for OpenAI's own service).
# Named here so that they are accepted while a misspelled field is still refused.
METADATA_FIELDS = (
    "user",
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "service_tier",
)
# OpenAI features the adapter does not provide: refused (400 naming the field) unless absent,
# null or the neutral value given here.
UNSUPPORTED_FIELDS: dict[str, tuple[Any, ...]] = {
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "web_search_options": (),
    "functions": (),
    "function_call": (),
    "reasoning_effort": (),
    "verbosity": (),
    "store": (False,),
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logit_bias": ({},),
    "parallel_tool_calls": (True,),
}


def _neutral_only(name: str) -> Any:
    """A field of UNSUPPORTED_FIELDS: validated by check_supported (so the 400 names it); the
    published JSON schema lists the accepted values, so API clients and fuzzers see them."""
    accepted: list[Any] = [None]
    for value in UNSUPPORTED_FIELDS[name]:
        if not any(value == v for v in accepted):  # JSON Schema: 0 and 0.0 are one value
            accepted.append(value)
    return Field(default=None, json_schema_extra={"enum": accepted})


_UNSUPPORTED_WHY = {
    "audio": "only text is generated",
    "modalities": "only text is generated",
    "prediction": "predicted outputs are not implemented",
    "web_search_options": "there is no web search",
    "functions": "use tools",
    "function_call": "use tool_choice",
    "reasoning_effort": "the model's chat template decides how it reasons",
    "verbosity": "the model has no verbosity control",
    "store": "completions are not stored for OpenAI's evals",
    "frequency_penalty": "penalties would change the sampling distribution the trainer assumes",
    "presence_penalty": "penalties would change the sampling distribution the trainer assumes",
    "logit_bias": "a bias would change the sampling distribution the trainer assumes",
    "parallel_tool_calls": "every tool call the model writes is returned",
}
MAX_TOP_LOGPROBS = 20


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions`` body.

    Every field of OpenAI's chat-completions request is either honoured or refused with a 400
    that names it; a field OpenAI does not define is refused too (``extra="forbid"``), so
    nothing a client sends is silently ignored. Honoured: ``model`` (echoed back), ``messages``,
    ``tools``, ``tool_choice`` (auto/none), ``max_tokens`` / ``max_completion_tokens``,
    ``temperature``, ``top_p``, ``top_k`` and ``ignore_eos`` (SGLang/vLLM extensions: the
    end-of-sequence token does not end the answer; sampling is unchanged), ``stop``, ``n`` (1),
    ``seed`` (SGLang ``sampling_seed``), ``stream``, ``stream_options.include_usage``,
    ``logprobs`` (the recorded behaviour logprobs), ``top_logprobs`` (the engine's
    ``top_logprobs_num``), ``response_format`` (SGLang's ``json_schema`` constraint; untracked
    routes only). :data:`METADATA_FIELDS` are accepted and have no effect on the output;
    :data:`UNSUPPORTED_FIELDS` are refused unless neutral.
    """

    model_config = _STRICT

    model: str | None = None
    messages: list[ChatMessage]
    tools: list[ToolSpec] | None = None
    # Checked by check_supported (a 400 naming the field); the schema lists what is accepted.
    tool_choice: str | dict[str, Any] | None = Field(
        default=None, json_schema_extra={"enum": [None, "auto", "none"]}
    )
    max_tokens: JSONInt | None = Field(default=None, ge=1)
    max_completion_tokens: JSONInt | None = Field(default=None, ge=1)
    temperature: JSONNumber | None = Field(default=None, ge=0.0)
    top_p: JSONNumber | None = Field(default=None, gt=0.0, le=1.0)
    top_k: JSONInt | None = None
    ignore_eos: bool | None = None
    stop: str | list[str] | None = None
    n: JSONInt | None = Field(default=None, json_schema_extra={"minimum": 1, "maximum": 1})
    seed: JSONInt | None = Field(default=None, ge=0, le=2**63 - 1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: JSONInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    # metadata (METADATA_FIELDS)
    user: str | None = None
    metadata: dict[str, str] | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    # refused unless neutral (UNSUPPORTED_FIELDS); typed loosely so the 400 names the field
    audio: Any = _neutral_only("audio")
    modalities: Any = _neutral_only("modalities")
    prediction: Any = _neutral_only("prediction")
    web_search_options: Any = _neutral_only("web_search_options")
    functions: Any = _neutral_only("functions")
    function_call: Any = _neutral_only("function_call")
    reasoning_effort: Any = _neutral_only("reasoning_effort")
    verbosity: Any = _neutral_only("verbosity")
    store: Any = _neutral_only("store")
    frequency_penalty: Any = _neutral_only("frequency_penalty")
    presence_penalty: Any = _neutral_only("presence_penalty")
    logit_bias: Any = _neutral_only("logit_bias")
    parallel_tool_calls: Any = _neutral_only("parallel_tool_calls")

    @field_validator("messages")
    @classmethod
    def _non_empty(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not value:
            raise ValueError("messages must be a non-empty list")
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value < 1:
            raise ValueError("top_k must be -1 (disabled) or at least 1")
        return value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        items = [value] if isinstance(value, str) else (value or [])
        if any(s == "" for s in items):
            raise ValueError("stop strings must not be empty")
        if len(items) > 16:
            raise ValueError("at most 16 stop strings are supported")
        return value

    def parse_tools_enabled(self) -> bool:
        """Whether tool calls in the output should be parsed (tools given, choice not none)."""
        return bool(self.tools) and self.tool_choice != "none"

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def top_logprobs_num(self) -> int:
        """How many alternatives per token to ask the engine for (0: none)."""
        return (self.top_logprobs or 0) if self.logprobs else 0

    def check_supported(self, tracked: bool = False) -> None:
        """Reject what is well-formed but not supported, with a message naming the field.

        ``tracked``: the request is recorded into a trajectory (``/t/<id>/`` routes), where
        constrained decoding is refused: grammar-masked sampling makes the recorded behaviour
        logprobs differ from what the trainer recomputes without the mask.
        """
        if self.n is not None and self.n != 1:
            raise APIError(400, f"n={self.n} is not supported: only one choice (n=1)", param="n")
        choice = self.tool_choice
        if isinstance(choice, dict) or choice not in (None, "auto", "none"):
            raise APIError(
                400,
                f"tool_choice {choice!r} is not supported: use 'auto' or 'none'",
                param="tool_choice",
            )
        for name, neutral in UNSUPPORTED_FIELDS.items():
            value = getattr(self, name)
            if value is not None and not any(
                value == ok and type(value) is type(ok) for ok in neutral
            ):
                raise APIError(
                    400,
                    f"{name}={json.dumps(value)[:80]} is not supported: {_UNSUPPORTED_WHY[name]}",
                    param=name,
                )
        if self.stream_options is not None:
            if not self.stream:
                raise APIError(
                    400, "stream_options is only allowed with stream=true", param="stream_options"
                )
            if self.stream_options.include_obfuscation:
                raise APIError(
                    400,
                    "stream_options.include_obfuscation=true is not supported",
                    param="stream_options",
                )
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        if tracked and self.response_format is not None and self.response_format.constrains:
            raise APIError(
                400,
                f"response_format type {self.response_format.type!r} is not allowed on "
                "trajectory routes (/t/<id>/): constrained decoding masks the sampling "
                "distribution, so the recorded behaviour logprobs would differ from what the "
                "trainer recomputes. Use the untracked /v1/chat/completions route.",
                param="response_format",
            )


def _format_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "body"
        msg = err["msg"]
        if err["type"] == "missing":
            msg = "field required"
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts[:8]) + (f" (+{len(parts) - 8} more)" if len(parts) > 8 else "")


def parse_chat_request(body: Any, tracked: bool = False) -> ChatCompletionRequest:
    """Validate a decoded JSON body; raise :class:`APIError` 400 with a readable message."""
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        param = None
        first = exc.errors()[0]["loc"] if exc.errors() else ()
        if first:
            param = str(first[0])
        raise APIError(400, _format_validation(exc), param=param) from None
    request.check_supported(tracked)
    return request


# ---------------------------------------------------------------------------------------------
# responses


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def assistant_message(content: str | None, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The OpenAI assistant message returned to the client (and remembered by the recorder)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def completion_response(
    *,
    cid: str,
    model: str,
    message: dict[str, Any],
    finish_reason: str,
    usage_: dict[str, Any],
    created: int | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created if created is not None else int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": logprobs}
        ],
        "usage": usage_,
    }


def stream_chunks(
    *,
    cid: str,
    model: str,
    message: dict[str, Any],
    finish_reason: str,
    usage_: dict[str, Any] | None,
    content_chunk_chars: int = 64,
    created: int | None = None,
    logprobs: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The chunk objects of an SSE answer (OpenAI ``chat.completion.chunk`` format).

    Role first, then content in pieces, then each tool call (id, type, name, then its arguments),
    then an empty delta with ``finish_reason`` (carrying all token ``logprobs`` if asked for:
    the answer is generated before it is streamed), then (if requested) a usage chunk with no
    choices.
    """
    created = created if created is not None else int(time.time())

    def chunk(
        delta: dict[str, Any], finish: str | None = None, lps: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": lps}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    content = message.get("content") or ""
    for start in range(0, len(content), content_chunk_chars):
        chunks.append(chunk({"content": content[start : start + content_chunk_chars]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        head = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        chunks.append(chunk({"tool_calls": [head]}))
        args = call["function"]["arguments"]
        chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": args}}]}))
    chunks.append(chunk({}, finish_reason, logprobs))
    if usage_ is not None:
        chunks.append(
            {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage_,
            }
        )
    return chunks
