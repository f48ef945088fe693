"""Chat templates rendered exactly as transformers' ``apply_chat_template(tokenize=False)`` does,
without importing transformers (which imports torch).

A model's chat template is a Jinja program, and its output depends on the environment it runs in
as much as on its text. :class:`ChatTemplate` reproduces the environment transformers builds for
chat templates -- a sandboxed immutable environment with ``trim_blocks`` and ``lstrip_blocks``,
loop controls, a ``tojson`` filter that does not escape HTML or non-ASCII characters,
``raise_exception``, ``strftime_now``, a restricted ``dict`` and ``namespace``, and the
``{% generation %}`` tag (rendered as its body) -- and the way transformers prepares the
variables: ``None`` message fields dropped, inputs rebuilt from plain JSON types, reasoning
aliased under ``reasoning_content`` and ``thinking``, the tokenizer's named special tokens
(``eos_token``, ...) passed as variables that the caller's keyword arguments override.

:func:`load_chat_template` finds the template where transformers looks for it:
``chat_template.jinja`` (plus ``additional_chat_templates/*.jinja``) in the model directory, else
``chat_template`` in ``tokenizer_config.json``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"

# The names a message's reasoning is passed under; templates read the first (``thinking``: gpt-oss).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

ChatTemplateSource = str | dict[str, str]


class ChatTemplateError(ValueError):
    """The model has no usable chat template, or the caller's input cannot be rendered."""


def _read_text(path: Path) -> str:
    with open(path, encoding="utf-8") as handle:  # universal newlines, as transformers reads
        return handle.read()


def load_chat_template(
    model_dir: str | Path, tokenizer_config: Mapping[str, Any]
) -> ChatTemplateSource | None:
    """The model's chat template(s): one string, or ``{name: template}`` when it has several
    (the default one under ``"default"``); None when it has none."""
    root = Path(model_dir)
    templates: dict[str, str] = {}
    if (root / CHAT_TEMPLATE_FILE).is_file():
        templates["default"] = _read_text(root / CHAT_TEMPLATE_FILE)
    extra = root / CHAT_TEMPLATE_DIR
    if extra.is_dir():
        for path in sorted(extra.glob("*.jinja")):
            templates[path.stem] = _read_text(path)
    if templates:
        return templates["default"] if list(templates) == ["default"] else templates
    value = tokenizer_config.get("chat_template")
    if isinstance(value, list):
        return {str(item["name"]): str(item["template"]) for item in value}
    if isinstance(value, str):
        return value
    return None


def select_template(source: ChatTemplateSource, tools: list[Any] | None) -> str:
    """The template transformers picks from ``source`` when no template is named: ``tool_use``
    when tools are passed and the model has one, else ``default``."""
    if isinstance(source, str):
        return source
    if tools is not None and "tool_use" in source:
        return source["tool_use"]
    if "default" in source:
        return source["default"]
    raise ChatTemplateError(
        f"the model has several chat templates ({', '.join(sorted(source))}) and none is the "
        "default: add chat_template.jinja to the model directory"
    )


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (assistant-mask markers): renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Callable[[], str]) -> str:
        return caller()


class _TemplateDict:
    """The ``dict`` global: builds dicts, and exposes nothing of the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _check_namespace_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            "Chat templates cannot store underscore-prefixed attributes on a namespace, but got "
            f"{name!r}. Please rename the attribute."
        )


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore-prefixed attributes."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        # Jinja's own signature trick: ``self`` is args[0], so namespace(self=...) works
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_namespace_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def chat_environment() -> ImmutableSandboxedEnvironment:
    """A fresh Jinja environment configured like transformers' chat-template environment."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def _plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types (what the sandboxed template may see); anything
    else becomes a placeholder naming its type, as transformers does."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if type(value).__module__ == "numpy" and callable(getattr(value, "item", None)):
        return _plain(value.item())  # numpy scalars
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _as_dicts(value: Any) -> Any:
    """Message objects (pydantic models, dataclasses) turned into dicts, recursively."""
    if isinstance(value, Mapping):
        return {key: _as_dicts(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_dicts(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_as_dicts(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _as_dicts(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _as_dicts(value.model_dump())
    return value


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def prepare_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """The messages as the template sees them: dicts without ``None`` fields, plain data,
    reasoning under every name templates read."""
    if not messages:
        raise ChatTemplateError("cannot render an empty conversation: send at least one message")
    prepared: list[dict[str, Any]] = []
    for message in _as_dicts(list(messages)):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"chat messages must be objects, got {message!r}")
        kept = _plain({key: value for key, value in message.items() if value is not None})
        prepared.append(_alias_reasoning(kept))
    return prepared


def _plain_tools(tools: list[Any] | None) -> list[Any] | None:
    if tools is None:
        return None
    for tool in tools:
        if not isinstance(tool, dict):
            raise ChatTemplateError("tools must be JSON schema objects")
    return list(_plain(tools))


class ChatTemplate:
    """One model's chat template(s), compiled once; :meth:`render` gives transformers' text."""

    def __init__(
        self, source: ChatTemplateSource, special_tokens: Mapping[str, str] | None = None
    ) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        env = chat_environment()
        if isinstance(source, str):
            self._compiled: dict[str | None, jinja2.Template] = {None: env.from_string(source)}
        else:
            self._compiled = {name: env.from_string(text) for name, text in source.items()}

    def _template(self, tools: list[Any] | None) -> jinja2.Template:
        if None in self._compiled:
            return self._compiled[None]
        text = select_template(self.source, tools)
        name = next(n for n, t in dict(self.source).items() if t == text)
        return self._compiled[name]

    def render(
        self,
        messages: list[Any],
        tools: list[Any] | None = None,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str:
        """The rendered prompt; Jinja errors (``raise_exception`` included) propagate."""
        template = self._template(tools)
        chat = prepare_messages(messages)
        variables = _plain({**self.special_tokens, **kwargs})
        text: str = template.render(
            messages=chat,
            tools=_plain_tools(tools),
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
        return text
