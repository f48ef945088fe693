"""Turn a model's generated text into OpenAI ``content`` + ``tool_calls``.

Two formats, as the Qwen family writes them:

* **Hermes / Qwen JSON** -- ``<tool_call>\\n{"name": "N", "arguments": {...}}\\n</tool_call>``,
  one block per call;
* **Qwen3-Coder XML** -- ``<tool_call>\\n<function=N>\\n<parameter=K>\\nV\\n</parameter>\\n...
  </function>\\n</tool_call>``; parameter values are raw text, converted with the tool's JSON
  schema (``integer``, ``number``, ``boolean``, ``object``, ``array``; anything else stays text).

Text before the first ``<tool_call>`` is the message content. If anything about the calls is
malformed (unclosed block, bad JSON, missing name, stray text between or after the blocks) the
*whole* output is returned as plain content and ``malformed`` is set: the agent sees what the
model wrote, and the recorder keeps the generated tokens exactly as produced either way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from adapter.config import ToolParserName

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*)</function>\s*$", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any]

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class ParsedOutput:
    content: str | None
    tool_calls: list[ParsedCall] = field(default_factory=list)
    malformed: bool = False


class ToolParser(Protocol):
    name: ToolParserName

    def parse(self, text: str, tools: list[dict[str, Any]] | None) -> ParsedOutput: ...


class _Malformed(ValueError):
    pass


def _split_blocks(text: str) -> tuple[str, list[str]] | None:
    """Content before the first call and the bodies of the call blocks; None if there is none.

    Raises :class:`_Malformed` when the blocks do not tile the rest of the text (an unclosed
    block, or text between or after blocks).
    """
    start = text.find(TOOL_CALL_OPEN)
    if start < 0:
        return None
    rest = text[start:]
    bodies = [m.group(1) for m in _BLOCK.finditer(rest)]
    leftover = _BLOCK.sub("", rest)
    if not bodies or leftover.strip():
        raise _Malformed("unclosed tool call block or text outside the blocks")
    return text[:start], bodies


def _content(text: str) -> str | None:
    stripped = text.strip()
    return stripped or None


def _parse_with(text: str, parse_body: Any) -> ParsedOutput:
    try:
        split = _split_blocks(text)
        if split is None:
            return ParsedOutput(content=text)
        before, bodies = split
        calls = [parse_body(body) for body in bodies]
    except _Malformed:
        return ParsedOutput(content=text, malformed=True)
    return ParsedOutput(content=_content(before), tool_calls=calls)


class HermesParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen2.5, Qwen3)."""

    name = ToolParserName.HERMES

    def parse(self, text: str, tools: list[dict[str, Any]] | None) -> ParsedOutput:
        return _parse_with(text, self._body)

    @staticmethod
    def _body(body: str) -> ParsedCall:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            raise _Malformed(f"tool call is not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise _Malformed("tool call JSON is not an object")
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            raise _Malformed("tool call has no name")
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                raise _Malformed("tool call arguments string is not JSON") from None
        if not isinstance(args, dict):
            raise _Malformed("tool call arguments are not an object")
        return ParsedCall(name=name, arguments=args)


def _param_types(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """tool name -> {parameter name: JSON schema type} from OpenAI tool specs."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool)
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[str(fn.get("name"))] = {
            k: v.get("type") for k, v in props.items() if isinstance(v, dict)
        }
    return out


def _convert(raw: str, kind: Any) -> Any:
    if kind is None or kind == "string" or (isinstance(kind, list) and "string" in kind):
        return raw
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        if kind == "boolean" and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        return raw
    expected = {
        "integer": int,
        "number": (int, float),
        "boolean": bool,
        "object": dict,
        "array": list,
        "null": type(None),
    }.get(kind if isinstance(kind, str) else "", object)
    if expected is int and isinstance(value, bool):
        return raw
    return value if isinstance(value, expected) else raw


class Qwen3CoderParser:
    """``<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>``."""

    name = ToolParserName.QWEN3_CODER

    def parse(self, text: str, tools: list[dict[str, Any]] | None) -> ParsedOutput:
        types = _param_types(tools)
        return _parse_with(text, lambda body: self._body(body, types))

    @staticmethod
    def _body(body: str, types: dict[str, dict[str, Any]]) -> ParsedCall:
        match = _FUNCTION.match(body)
        if match is None:
            raise _Malformed("tool call block holds no <function=...>...</function>")
        name = match.group(1).strip()
        inner = match.group(2)
        if not name:
            raise _Malformed("tool call has no function name")
        if _PARAMETER.sub("", inner).strip():
            raise _Malformed("text outside <parameter> tags, or an unclosed parameter")
        schema = types.get(name, {})
        args: dict[str, Any] = {}
        for pm in _PARAMETER.finditer(inner):
            key = pm.group(1).strip()
            raw = pm.group(2)
            raw = raw.removeprefix("\n").removesuffix("\n")
            args[key] = _convert(raw, schema.get(key))
        return ParsedCall(name=name, arguments=args)


_PARSERS: dict[ToolParserName, ToolParser] = {
    ToolParserName.HERMES: HermesParser(),
    ToolParserName.QWEN3_CODER: Qwen3CoderParser(),
}


def detect_parser(chat_template: str | None) -> ToolParserName:
    """The tool-call format a chat template renders: Coder XML if it writes ``<function=``."""
    if chat_template and "<function=" in chat_template:
        return ToolParserName.QWEN3_CODER
    return ToolParserName.HERMES


def get_parser(name: ToolParserName, chat_template: str | None = None) -> ToolParser:
    if name is ToolParserName.AUTO:
        name = detect_parser(chat_template)
    return _PARSERS[name]
