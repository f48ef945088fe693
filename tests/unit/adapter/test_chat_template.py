"""The torch-free chat-template renderer is byte-identical to transformers' apply_chat_template.

Every case renders one conversation with :class:`adapter.chat_template.ChatTemplate` and with
transformers (the reference; tests may import it, the adapter may not), for the tiny model's two
shipped templates and the real Qwen3 / Qwen3-Coder templates (tests/data/chat_templates/), and
compares the texts -- or, where the template refuses the input, the error messages.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import pytest

from adapter.chat_template import ChatTemplate, load_chat_template
from adapter.text_tokenizer import TextTokenizer

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "data" / "chat_templates"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "execute_bash",
            "description": "Run a command <in a shell> & return 'its' output: 日本語 🙂\n",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "the command"},
                    "timeout": {"type": "integer", "description": "seconds", "minimum": 1},
                    "mode": {"type": "string", "enum": ["fg", "bg"]},
                    "env": {
                        "type": "object",
                        "description": "extra variables",
                        "additionalProperties": {"type": "string"},
                    },
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "str_replace_editor",
            "description": "Edit a file",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "old-str": {"type": "string", "description": "text to replace"},
                    "new str": {"type": ["string", "null"]},
                },
                "required": ["path", "old-str"],
            },
        },
    },
]


def _call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _agent_loop(as_object: bool) -> list[dict[str, Any]]:
    """A SWE-agent trajectory: tool calls, parallel tool results, reasoning, a final answer."""

    def args(value: dict[str, Any]) -> Any:
        import json

        return value if as_object else json.dumps(value)

    return [
        {"role": "system", "content": "You are a careful software engineer."},
        {"role": "user", "content": "Fix the failing test in repo/ (see tests/test_x.py)."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Look at the test first.",
            "tool_calls": [_call("execute_bash", args({"command": "cat tests/test_x.py"}), "c1")],
        },
        {"role": "tool", "content": "def test_x():\n    assert f(1) == 2\n", "tool_call_id": "c1"},
        {
            "role": "assistant",
            "content": "Two reads at once.",
            "tool_calls": [
                _call("execute_bash", args({"command": "ls", "timeout": 5}), "c2"),
                _call("str_replace_editor", args({"path": "a.py", "old-str": "x < 1"}), "c3"),
            ],
        },
        {"role": "tool", "content": "a.py\nb.py", "tool_call_id": "c2", "name": "execute_bash"},
        {"role": "tool", "content": "edited <a.py> & saved", "tool_call_id": "c3"},
        {
            "role": "assistant",
            "content": "Fixed: `f` now adds one.",
            "reasoning_content": "The edit is in; the test passes.",
        },
    ]


CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "one_user": [{"role": "user", "content": "hello"}],
    "system_user": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ],
    "multi_turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
    ],
    "reasoning_then_user": [
        {"role": "user", "content": "think about it"},
        {"role": "assistant", "content": "done", "reasoning_content": "hmm, carefully"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "done again", "reasoning_content": "second thought"},
    ],
    "think_in_content": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>\nraw thoughts\n</think>\n\nthe answer"},
    ],
    "thinking_field_alias": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "thinking": "via the thinking key"},
    ],
    "none_fields_dropped": [
        {"role": "user", "content": "q", "name": None},
        {"role": "assistant", "content": "a", "reasoning_content": None, "tool_calls": None},
    ],
    "unicode_and_markup": [
        {"role": "user", "content": "é e\u0301 日本語 🙂 <b>&amp;</b> \"quoted\" 'x'\r\n\ttab"},
    ],
    "text_parts": [
        {"role": "user", "content": [{"type": "text", "text": "part one "}, "part two"]},
    ],
    "agent_loop_string_args": _agent_loop(as_object=False),
    "agent_loop_object_args": _agent_loop(as_object=True),
    "tool_result_last": _agent_loop(as_object=True)[:4],
    "no_content_tool_call": [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "tool_calls": [_call("execute_bash", {"command": "ls"}, "c9")]},
    ],
}

TEMPLATE_KWARGS: list[dict[str, Any]] = [{}, {"enable_thinking": False}, {"enable_thinking": True}]


def _template_texts(tiny_model_dir: Path, tiny_coder_dir: Path) -> dict[str, str]:
    texts = {
        "qwen3": (TEMPLATES_DIR / "qwen3.jinja").read_text(encoding="utf-8"),
        "qwen3_coder": (TEMPLATES_DIR / "qwen3_coder.jinja").read_text(encoding="utf-8"),
    }
    for name, directory in (("tiny", tiny_model_dir), ("tiny_coder", tiny_coder_dir)):
        source = load_chat_template(directory, TextTokenizer(directory).config)
        assert isinstance(source, str)
        texts[name] = source
    return texts


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def templates(tiny_model_dir: Path, tiny_coder_dir: Path) -> dict[str, str]:
    return _template_texts(tiny_model_dir, tiny_coder_dir)


def _outcome(render: Callable[[], Any]) -> tuple[str, str]:
    """("ok", text) or ("error", message): what a render gave."""
    try:
        return "ok", render()
    except (jinja2.TemplateError, TypeError, ValueError) as exc:
        return "error", str(exc)


def _reference(
    hf: Any, template: str, messages: list[dict[str, Any]], tools: Any, agp: bool, **kw: Any
) -> tuple[str, str]:
    return _outcome(
        lambda: hf.apply_chat_template(
            copy.deepcopy(messages),
            tools=copy.deepcopy(tools),
            chat_template=template,
            add_generation_prompt=agp,
            tokenize=False,
            **kw,
        )
    )


def _ours(
    template: ChatTemplate, messages: list[dict[str, Any]], tools: Any, agp: bool, **kw: Any
) -> tuple[str, str]:
    return _outcome(lambda: template.render(messages, tools=tools, add_generation_prompt=agp, **kw))


@pytest.mark.parametrize("template_name", ["tiny", "tiny_coder", "qwen3", "qwen3_coder"])
def test_renders_byte_identical_to_transformers_over_the_corpus(
    template_name: str, templates: dict[str, str], hf_tokenizer: Any
) -> None:
    text = templates[template_name]
    ours = ChatTemplate(text, hf_tokenizer.special_tokens_map)
    rendered = 0
    cases = itertools.product(CONVERSATIONS.items(), (None, TOOLS), (True, False), TEMPLATE_KWARGS)
    for (name, messages), tools, agp, kwargs in cases:
        before = copy.deepcopy(messages)
        expected = _reference(hf_tokenizer, text, messages, tools, agp, **kwargs)
        got = _ours(ours, messages, tools, agp, **kwargs)
        where = f"{template_name}/{name} tools={tools is not None} agp={agp} {kwargs}"
        assert got == expected, where
        assert messages == before, f"{where}: the caller's messages were changed"
        rendered += expected[0] == "ok"
    # Most cases render (the rest are refusals both sides give with the same message).
    assert rendered > len(CONVERSATIONS) * 2 * 2 * len(TEMPLATE_KWARGS) // 2


def test_the_token_ids_of_every_rendered_prompt_match_transformers(
    templates: dict[str, str], hf_tokenizer: Any, tiny_model_dir: Path
) -> None:
    ours = TextTokenizer(tiny_model_dir)
    for text in templates.values():
        template = ChatTemplate(text, ours.special_tokens_map)
        for messages in CONVERSATIONS.values():
            kind, prompt = _ours(template, messages, TOOLS, True)
            if kind == "ok":
                assert ours.encode(prompt) == hf_tokenizer.encode(prompt, add_special_tokens=False)


# Templates that exercise the environment itself (filters, globals, tags, the sandbox).
ENVIRONMENT_TEMPLATES = {
    "tojson_options": "{{ tools | tojson(indent=2) }}|{{ tools | tojson(sort_keys=true) }}"
    "|{{ {'a': '<&>', 'b': 'é'} | tojson(separators=(',', ':')) }}",
    "loop_controls": "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
    "{{ m.role }}{% endfor %}{% for m in messages %}{% if m.role == 'user' %}{% continue %}"
    "{% endif %}[{{ m.role }}]{% endfor %}",
    "trim_and_lstrip": "  {% if true %}\n    x\n  {% endif %}\n{% for m in messages %}\n"
    "  {{ m.content }}\n{% endfor %}\n",
    "generation_tag": "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
    "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
    "namespace_and_dict": "{% set ns = namespace(n=0) %}{% for m in messages %}"
    "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}{{ dict(a=1, b=2) | tojson }}"
    "{{ dict.fromkeys(['x', 'y'], 0) | tojson }}",
    "special_token_variables": "{{ eos_token }}|{{ pad_token }}|{{ bos_token is defined }}",
    "raise_exception": "{{ raise_exception('no ' + messages[0].role + ' allowed') }}",
    "strftime": "{{ strftime_now('%Y') }}",
    "sandbox_attribute": "{{ messages.__class__.__mro__ }}",
    "sandbox_mutation": "{% set x = messages.append(1) %}{{ x }}",
    "namespace_underscore": "{% set ns = namespace(_secret=1) %}{{ ns._secret }}",
    "reasoning_keys": "{% for m in messages %}{{ m | tojson }}\n{% endfor %}",
    "documents_and_undefined": "{{ documents is none }}|{{ nothing is defined }}|{{ nothing }}",
}


@pytest.mark.parametrize("name", sorted(ENVIRONMENT_TEMPLATES))
def test_the_jinja_environment_matches_transformers(name: str, hf_tokenizer: Any) -> None:
    text = ENVIRONMENT_TEMPLATES[name]
    messages = [
        *CONVERSATIONS["thinking_field_alias"],
        *CONVERSATIONS["reasoning_then_user"],
        *CONVERSATIONS["none_fields_dropped"],
    ]
    ours = ChatTemplate(text, hf_tokenizer.special_tokens_map)
    expected = _reference(hf_tokenizer, text, messages, TOOLS, False)
    assert _ours(ours, messages, TOOLS, False) == expected
    if name.startswith(("sandbox", "raise", "namespace_underscore")):
        assert expected[0] == "error"  # the case tests a refusal, not a text


def test_caller_variables_override_the_special_tokens(hf_tokenizer: Any) -> None:
    text = "{{ eos_token }}/{{ enable_thinking }}"
    ours = ChatTemplate(text, hf_tokenizer.special_tokens_map)
    messages = CONVERSATIONS["one_user"]
    kwargs = {"eos_token": "<custom>", "enable_thinking": False}
    expected = _reference(hf_tokenizer, text, messages, None, False, **kwargs)
    assert _ours(ours, messages, None, False, **kwargs) == expected == ("ok", "<custom>/False")


def test_an_empty_conversation_is_refused_like_transformers(hf_tokenizer: Any) -> None:
    ours = ChatTemplate("x", hf_tokenizer.special_tokens_map)
    assert _reference(hf_tokenizer, "x", [], None, False)[0] == "error"
    with pytest.raises(ValueError, match="at least one message"):
        ours.render([])


def test_model_dir_templates_are_found_where_transformers_looks(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """chat_template.jinja wins over tokenizer_config.json; several templates make a dict."""
    transformers = pytest.importorskip("transformers")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tiny_model_dir / name).read_bytes())
    config = TextTokenizer(tmp_path).config
    assert load_chat_template(tmp_path, config) is None

    import json

    config["chat_template"] = "from-config {{ messages[0].content }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "chat_template.jinja").write_text("from-file\r\n{{ messages[0].content }}")
    extra = tmp_path / "additional_chat_templates"
    extra.mkdir()
    (extra / "tool_use.jinja").write_text("tool-use {{ tools | length }}")
    source = load_chat_template(tmp_path, TextTokenizer(tmp_path).config)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert source == hf.chat_template
    ours = ChatTemplate(source or "", hf.special_tokens_map)
    messages = CONVERSATIONS["one_user"]
    for tools in (None, TOOLS):
        expected = hf.apply_chat_template(messages, tools=tools, tokenize=False)
        assert ours.render(messages, tools=tools) == expected
