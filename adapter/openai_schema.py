"""OpenAI chat-completions request and response shapes, as OpenHands' SDK (litellm) sends them.

Accepted on input, besides the classic fields: message content as a string or a list of text
parts (extra keys such as ``cache_control`` ignored), ``max_completion_tokens``,
``prompt_cache_key``, ``reasoning_effort``, tool results as role ``tool`` with ``tool_call_id``
and ``name``, role ``developer`` (treated as ``system``). Fields the adapter does not use
(``seed``, ``user``, ``metadata``, ``parallel_tool_calls``, penalties, ...) are accepted and
ignored rather than failing a request an agent framework built in good faith. What the adapter
cannot honour (``n > 1``, non-text content, ``tool_choice`` other than auto/none) is rejected with
a 400 that says so.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

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


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions`` body. Extra fields are kept but never used."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessage]
    tools: list[ToolSpec] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

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

    def check_supported(self) -> None:
        """Reject what is well-formed but not supported, with a message naming the field."""
        if self.n is not None and self.n != 1:
            raise APIError(400, f"n={self.n} is not supported: only one choice (n=1)", param="n")
        choice = self.tool_choice
        if isinstance(choice, dict) or choice not in (None, "auto", "none"):
            raise APIError(
                400,
                f"tool_choice {choice!r} is not supported: use 'auto' or 'none'",
                param="tool_choice",
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


def parse_chat_request(body: Any) -> ChatCompletionRequest:
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
    request.check_supported()
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
) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created if created is not None else int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
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
) -> list[dict[str, Any]]:
    """The chunk objects of an SSE answer (OpenAI ``chat.completion.chunk`` format).

    Role first, then content in pieces, then each tool call (id, type, name, then its arguments),
    then an empty delta with ``finish_reason``, then (if requested) a usage chunk with no choices.
    """
    created = created if created is not None else int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
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
    chunks.append(chunk({}, finish_reason))
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
