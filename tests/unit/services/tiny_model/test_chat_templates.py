"""The tiny model's chat templates: Qwen/Hermes JSON tools, Qwen3-Coder XML, prefix stability."""

from __future__ import annotations

from typing import Any

import pytest
from jinja2 import TemplateError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "execute_bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command."},
                    "timeout": {"type": "integer"},
                },
                "required": ["command"],
            },
        },
    }
]

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Fix the bug in app.py."},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "execute_bash", "arguments": {"command": "cat app.py"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "name": "execute_bash", "content": "x = 1"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c2",
                "type": "function",
                "function": {"name": "execute_bash", "arguments": {"command": "ls"}},
            },
            {
                "id": "c3",
                "type": "function",
                "function": {"name": "execute_bash", "arguments": {"command": "pwd"}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "c2", "name": "execute_bash", "content": "app.py"},
    {"role": "tool", "tool_call_id": "c3", "name": "execute_bash", "content": "/work"},
    {"role": "user", "content": [{"type": "text", "text": "Go on."}]},
    {"role": "assistant", "content": "Done.", "reasoning_content": "All good."},
]


def render(tok: Any, messages: list[dict[str, Any]], generation: bool, tools: Any = TOOLS) -> str:
    return tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=generation
    )


def test_plain_chat_without_tools(tokenizer: Any) -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    assert render(tokenizer, messages, True, tools=None) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render(tokenizer, messages[1:], False, tools=None) == "<|im_start|>user\nHi<|im_end|>\n"


def test_tools_are_listed_as_json_in_the_system_turn(tokenizer: Any) -> None:
    text = render(tokenizer, CONVERSATION[:2], True)
    assert text.startswith("<|im_start|>system\nYou are an agent.\n\n# Tools\n")
    assert (
        '<tools>\n{"type": "function", "function": {"name": "execute_bash", '
        '"description": "Run a shell command.", "parameters"'
    ) in text
    assert "</tools>" in text and "<tool_call></tool_call> XML tags" in text
    # The system message is rendered once, inside the tools preamble.
    assert text.count("You are an agent.") == 1
    assert text.endswith(
        "<|im_start|>user\nFix the bug in app.py.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_json_tool_calls_and_grouped_tool_responses(tokenizer: Any) -> None:
    text = render(tokenizer, CONVERSATION, False)
    assert (
        "<|im_start|>assistant\nLet me look.\n<tool_call>\n"
        '{"name": "execute_bash", "arguments": {"command": "cat app.py"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert ("<|im_start|>user\n<tool_response>\nx = 1\n</tool_response><|im_end|>\n") in text
    # Two calls without content: the first starts right after the header.
    ls_call = '{"name": "execute_bash", "arguments": {"command": "ls"}}'
    pwd_call = '{"name": "execute_bash", "arguments": {"command": "pwd"}}'
    assert (
        f"<|im_start|>assistant\n<tool_call>\n{ls_call}\n</tool_call>\n"
        f"<tool_call>\n{pwd_call}\n</tool_call><|im_end|>\n"
    ) in text
    # Consecutive tool results share one user turn.
    assert (
        "<|im_start|>user\n<tool_response>\napp.py\n</tool_response>\n<tool_response>\n/work"
        "\n</tool_response><|im_end|>\n"
    ) in text
    assert "<|im_start|>user\nGo on.<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n<think>\nAll good.\n</think>\n\nDone.<|im_end|>\n")


def test_string_arguments_are_rendered_verbatim(tokenizer: Any) -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}],
    }
    text = render(tokenizer, [message], False)
    assert '{"name": "f", "arguments": {"b": 1, "a": 2}}' in text


def test_coder_template_uses_xml_calls(coder_tokenizer: Any) -> None:
    text = render(coder_tokenizer, CONVERSATION[:4], True)
    assert (
        "<function>\n<name>execute_bash</name>\n<description>Run a shell command.</description>"
        in text
    )
    assert "<parameter>\n<name>command</name>\n<type>string</type>" in text
    assert (
        "<|im_start|>assistant\nLet me look.\n<tool_call>\n<function=execute_bash>\n"
        "<parameter=command>\ncat app.py\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
    ) in text
    assert "<|im_start|>user\n<tool_response>\nx = 1\n</tool_response>\n<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_coder_template_renders_non_string_values_as_json(coder_tokenizer: Any) -> None:
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "f", "arguments": {"n": 3, "xs": [1, 2]}}}],
    }
    text = render(coder_tokenizer, [message], False)
    assert "<parameter=n>\n3\n</parameter>\n<parameter=xs>\n[1, 2]\n</parameter>\n" in text


def test_coder_template_rejects_string_arguments(coder_tokenizer: Any) -> None:
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
    }
    with pytest.raises(TemplateError, match="arguments as an object"):
        render(coder_tokenizer, [message], False)


@pytest.mark.parametrize("fixture", ["tokenizer", "coder_tokenizer"])
def test_unknown_role_is_an_error(request: pytest.FixtureRequest, fixture: str) -> None:
    tok = request.getfixturevalue(fixture)
    with pytest.raises(TemplateError, match="unsupported message role"):
        render(tok, [{"role": "narrator", "content": "x"}], True)


@pytest.mark.parametrize("fixture", ["tokenizer", "coder_tokenizer"])
def test_rendering_is_prefix_stable(request: pytest.FixtureRequest, fixture: str) -> None:
    """History + returned assistant (no generation prompt) prefixes every longer rendering."""
    tok = request.getfixturevalue(fixture)
    assistant_positions = [i for i, m in enumerate(CONVERSATION) if m["role"] == "assistant"]
    assert len(assistant_positions) == 3
    for k in assistant_positions:
        before = render(tok, CONVERSATION[: k + 1], False)
        for end in range(k + 2, len(CONVERSATION) + 1):
            after = render(tok, CONVERSATION[:end], True)
            assert after.startswith(before), (k, end)
            # The suffix starts with the newline after the end-of-turn token.
            assert before.endswith("<|im_end|>\n")


@pytest.mark.parametrize("fixture", ["tokenizer", "coder_tokenizer"])
def test_rendered_prompt_round_trips_through_tokens(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    tok = request.getfixturevalue(fixture)
    text = render(tok, CONVERSATION, True)
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == text.count("<|im_start|>")


# -- the shared conversation macro renders exactly what the two full templates rendered ---------

CODER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "str_replace_editor",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "enum": ["view", "create"]},
                    "path": {"type": "string", "description": "Absolute path."},
                    "view_range": {"type": ["array", "null"], "items": {"type": "integer"}},
                },
                "required": ["command", "path"],
            },
        },
    },
    {"name": "finish", "description": "", "parameters": {"type": "object"}},
]

# (messages, tools) pairs covering every branch of the message loop: system first / later / in
# the tools preamble, user text and text parts, assistant with content, reasoning, one and
# several tool calls (with and without content, bare and OpenAI-shaped), tool results alone,
# grouped, first and last, multi-turn conversations.
EQUIVALENCE_CASES: list[tuple[list[dict[str, Any]], Any]] = [
    ([{"role": "user", "content": "Hi"}], None),
    ([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}], None),
    ([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}], TOOLS),
    ([{"role": "user", "content": "Hi"}, {"role": "system", "content": "late"}], TOOLS),
    ([{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}], None),
    ([{"role": "user", "content": None}], None),
    (CONVERSATION, TOOLS),
    (CONVERSATION, CODER_TOOLS),
    (CONVERSATION, None),
    (CONVERSATION[:3], TOOLS),
    (CONVERSATION[:4], TOOLS),
    (CONVERSATION[:6], TOOLS),
    ([CONVERSATION[3]], TOOLS),
    ([CONVERSATION[1], CONVERSATION[3], CONVERSATION[5], CONVERSATION[6]], TOOLS),
    (
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"name": "finish", "arguments": {"message": "done", "n": [1]}}],
            },
            {"role": "tool", "content": [{"type": "text", "text": "ok"}]},
            {"role": "assistant", "content": "bye", "reasoning_content": ""},
            {"role": "user", "content": "again"},
        ],
        CODER_TOOLS,
    ),
]

STRING_ARGUMENT_CASES: list[list[dict[str, Any]]] = [
    [
        {
            "role": "assistant",
            "content": "x",
            "tool_calls": [{"function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}],
        }
    ],
]

BAD_CASES: list[list[dict[str, Any]]] = [
    [{"role": "narrator", "content": "x"}],
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
    [{"role": "user", "content": {"text": "a mapping"}}],
]


def _render_with(tok: Any, template: str, messages: Any, tools: Any, generation: bool) -> str:
    return tok.apply_chat_template(
        messages,
        tools=tools,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=generation,
    )


def _outcome(tok: Any, template: str, messages: Any, tools: Any, generation: bool) -> str:
    try:
        return _render_with(tok, template, messages, tools, generation)
    except TemplateError as exc:
        return f"error: {exc}"


@pytest.mark.parametrize("coder", [False, True], ids=["json", "coder"])
def test_templates_render_byte_identically_to_the_cached_models_templates(
    tokenizer: Any, coder: bool
) -> None:
    from services.tiny_model.chat_templates import (
        QWEN3_CODER_XML_TOOLS_TEMPLATE,
        QWEN_JSON_TOOLS_TEMPLATE,
    )
    from tests.support.legacy_chat_templates import (
        LEGACY_QWEN3_CODER_XML_TOOLS_TEMPLATE,
        LEGACY_QWEN_JSON_TOOLS_TEMPLATE,
    )

    new = QWEN3_CODER_XML_TOOLS_TEMPLATE if coder else QWEN_JSON_TOOLS_TEMPLATE
    old = LEGACY_QWEN3_CODER_XML_TOOLS_TEMPLATE if coder else LEGACY_QWEN_JSON_TOOLS_TEMPLATE
    assert new != old  # the comparison below is between two different texts
    cases = [*EQUIVALENCE_CASES, *((m, TOOLS) for m in STRING_ARGUMENT_CASES + BAD_CASES)]
    rendered = 0
    for messages, tools in cases:
        for generation in (False, True):
            expected = _outcome(tokenizer, old, messages, tools, generation)
            assert _outcome(tokenizer, new, messages, tools, generation) == expected, (
                messages,
                tools,
                generation,
            )
            rendered += not expected.startswith("error: ")
    # Most cases render (the comparison is not between two identical error messages).
    assert rendered >= 2 * len(EQUIVALENCE_CASES)


def test_the_cached_models_template_is_the_legacy_text(tokenizer: Any) -> None:
    """The reference above is what the cached tiny models really carry (built before the macro);
    a freshly built model carries the new text, which renders the same."""
    from services.tiny_model.chat_templates import QWEN_JSON_TOOLS_TEMPLATE
    from tests.support.legacy_chat_templates import (
        LEGACY_QWEN_JSON_TOOLS_TEMPLATE,
    )

    assert tokenizer.chat_template in (LEGACY_QWEN_JSON_TOOLS_TEMPLATE, QWEN_JSON_TOOLS_TEMPLATE)
