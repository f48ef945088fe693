"""Message shapes: OpenAI request messages -> chat-template dicts, and canonical comparison keys.

Two jobs, both about "the same message":

* :func:`template_messages` turns validated request messages into the plain dicts a Hugging Face
  chat template expects (content flattened to a string, ``developer`` as ``system``, tool-call
  arguments as a string or, for templates that name every parameter, as an object);
* :func:`canonical` gives a comparison key that ignores what a client may legitimately change
  when it echoes a message back -- surrounding/repeated whitespace, the JSON formatting and key
  order of tool-call arguments, tool-call ids -- so the recorder can tell whether a request
  continues the conversation it answered.
"""

from __future__ import annotations

import json
import re
from typing import Any

from adapter.errors import APIError
from adapter.openai_schema import ChatMessage


def _role(role: str) -> str:
    return "system" if role == "developer" else role


def _arguments(raw: str | dict[str, Any], as_object: bool, where: str) -> str | dict[str, Any]:
    if not as_object:
        return raw
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError:
        raise APIError(
            400,
            f"{where}: tool call arguments are not valid JSON; this model's chat template "
            "needs them as a JSON object",
            param="messages",
        ) from None
    if not isinstance(value, dict):
        raise APIError(400, f"{where}: tool call arguments must be a JSON object", param="messages")
    return value


def template_message(message: ChatMessage, index: int, arguments_as_object: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"role": _role(message.role), "content": message.text()}
    if message.role == "assistant":
        if message.reasoning_content:
            out["reasoning_content"] = message.reasoning_content
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id or f"call_{index}_{j}",
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": _arguments(
                            call.function.arguments, arguments_as_object, f"messages.{index}"
                        ),
                    },
                }
                for j, call in enumerate(message.tool_calls)
            ]
    elif message.role == "tool":
        if message.tool_call_id is not None:
            out["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            out["name"] = message.name
    elif message.name is not None:
        out["name"] = message.name
    return out


def template_messages(
    messages: list[ChatMessage], arguments_as_object: bool = False
) -> list[dict[str, Any]]:
    return [template_message(m, i, arguments_as_object) for i, m in enumerate(messages)]


_WS_SLICE = 1 << 16
_SPACE = re.compile(r"\s")


def _ws(text: str) -> str:
    """``" ".join(text.split())``, computed in slices of ~64 KiB cut at whitespace, so that a
    long text never holds the GIL for long (tens of ms per MB otherwise). The result is the
    same: no word is cut, and whitespace at a cut collapses like any other."""
    if len(text) <= _WS_SLICE:
        return " ".join(text.split())
    parts: list[str] = []
    start = 0
    while start < len(text):
        cut = _SPACE.search(text, start + _WS_SLICE) if start + _WS_SLICE < len(text) else None
        end = cut.start() if cut else len(text)
        part = " ".join(text[start:end].split())
        if part:
            parts.append(part)
        start = end
    return " ".join(parts)


def _canonical_arguments(raw: str | dict[str, Any]) -> str:
    value: Any = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return "text:" + _ws(raw)
    return "json:" + json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical(message: ChatMessage) -> tuple[Any, ...]:
    """Comparison key of a message (hashable, cheap to compare)."""
    calls: tuple[tuple[str, str], ...] = ()
    if message.tool_calls:
        calls = tuple(
            (c.function.name, _canonical_arguments(c.function.arguments))
            for c in message.tool_calls
        )
    tool_ref = message.tool_call_id if message.role == "tool" else None
    return (_role(message.role), _ws(message.text()), calls, tool_ref)
