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
