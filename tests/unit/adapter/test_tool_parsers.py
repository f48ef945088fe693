"""Tool-call parsing: Hermes/Qwen JSON and Qwen3-Coder XML, well-formed and malformed."""

from __future__ import annotations

import pytest

from adapter.config import ToolParserName
from adapter.tool_parsers import HermesParser, Qwen3CoderParser, detect_parser, get_parser
from services.tiny_model.chat_templates import (
    QWEN3_CODER_XML_TOOLS_TEMPLATE,
    QWEN_JSON_TOOLS_TEMPLATE,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout": {"type": "integer"},
                    "ratio": {"type": "number"},
                    "background": {"type": "boolean"},
                    "env": {"type": "object"},
                    "paths": {"type": "array"},
                },
            },
        },
    }
]


class TestHermes:
    parser = HermesParser()

    def test_plain_text_has_no_calls(self) -> None:
        out = self.parser.parse("just an answer", TOOLS)
        assert out.content == "just an answer"
        assert out.tool_calls == []
        assert not out.malformed

    def test_single_call_with_leading_content(self) -> None:
        text = (
            'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}'
            "\n</tool_call>"
        )
        out = self.parser.parse(text, TOOLS)
        assert out.content == "Let me look."
        assert [(c.name, c.arguments) for c in out.tool_calls] == [("bash", {"command": "ls -la"})]
        assert not out.malformed

    def test_several_calls_and_string_arguments(self) -> None:
        text = (
            '<tool_call>\n{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}'
            "\n</tool_call>\n"
            '<tool_call>\n{"name": "edit", "arguments": {"path": "/a", "n": 2}}\n</tool_call>'
        )
        out = self.parser.parse(text, TOOLS)
        assert out.content is None
        assert [(c.name, c.arguments) for c in out.tool_calls] == [
            ("bash", {"command": "pwd"}),
            ("edit", {"path": "/a", "n": 2}),
        ]

    def test_arguments_json_is_valid_json_of_the_arguments(self) -> None:
        out = self.parser.parse(
            '<tool_call>{"name": "bash", "arguments": {"command": "echo é"}}</tool_call>', TOOLS
        )
        assert out.tool_calls[0].arguments_json() == '{"command": "echo é"}'

    @pytest.mark.parametrize(
        "text",
        [
            # bad JSON
            '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n</tool_call>',
            '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}',  # unclosed
            '<tool_call>\n{"arguments": {"command": "ls"}}\n</tool_call>',  # no name
            '<tool_call>\n["bash"]\n</tool_call>',  # not an object
            '<tool_call>\n{"name": "bash", "arguments": [1]}\n</tool_call>',  # args not object
            '<tool_call>{"name": "bash", "arguments": {}}</tool_call> and then more text',
            '<tool_call>{"name": "bash", "arguments": "not json"}</tool_call>',
        ],
    )
    def test_malformed_call_is_plain_content(self, text: str) -> None:
        out = self.parser.parse(text, TOOLS)
        assert out.malformed
        assert out.tool_calls == []
        assert out.content == text


class TestQwen3Coder:
    parser = Qwen3CoderParser()

    def test_call_with_typed_parameters(self) -> None:
        text = (
            "I will run it.\n<tool_call>\n<function=bash>\n"
            "<parameter=command>\nls -la\n/tmp\n</parameter>\n"
            "<parameter=timeout>\n30\n</parameter>\n"
            "<parameter=ratio>\n0.5\n</parameter>\n"
            "<parameter=background>\nfalse\n</parameter>\n"
            '<parameter=env>\n{"A": "1"}\n</parameter>\n'
            '<parameter=paths>\n["a", "b"]\n</parameter>\n'
            "</function>\n</tool_call>"
        )
        out = self.parser.parse(text, TOOLS)
        assert not out.malformed
        assert out.content == "I will run it."
        assert len(out.tool_calls) == 1
        call = out.tool_calls[0]
        assert call.name == "bash"
        assert call.arguments == {
            "command": "ls -la\n/tmp",
            "timeout": 30,
            "ratio": 0.5,
            "background": False,
            "env": {"A": "1"},
            "paths": ["a", "b"],
        }

    def test_unknown_tool_keeps_string_values(self) -> None:
        text = (
            "<tool_call>\n<function=other>\n<parameter=x>\n42\n</parameter>\n"
            "</function>\n</tool_call>"
        )
        out = self.parser.parse(text, TOOLS)
        assert out.tool_calls[0].arguments == {"x": "42"}

    def test_value_not_matching_schema_stays_text(self) -> None:
        text = (
            "<tool_call>\n<function=bash>\n<parameter=timeout>\nsoon\n</parameter>\n"
            "</function>\n</tool_call>"
        )
        out = self.parser.parse(text, TOOLS)
        assert out.tool_calls[0].arguments == {"timeout": "soon"}

    def test_two_calls(self) -> None:
        one = (
            "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n"
            "</function>\n</tool_call>"
        )
        out = self.parser.parse(one + "\n" + one.replace("ls", "pwd"), TOOLS)
        assert [c.arguments["command"] for c in out.tool_calls] == ["ls", "pwd"]

    @pytest.mark.parametrize(
        "text",
        [
            "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</tool_call>",
            "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</function>\n</tool_call>",
            "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>",
            '<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>',
            "<tool_call>\n<function=bash>\nstray\n</function>\n</tool_call>",
        ],
    )
    def test_malformed_call_is_plain_content(self, text: str) -> None:
        out = self.parser.parse(text, TOOLS)
        assert out.malformed
        assert out.tool_calls == []
        assert out.content == text


def test_detect_parser_from_template() -> None:
    assert detect_parser(QWEN3_CODER_XML_TOOLS_TEMPLATE) is ToolParserName.QWEN3_CODER
    assert detect_parser(QWEN_JSON_TOOLS_TEMPLATE) is ToolParserName.HERMES
    assert get_parser(ToolParserName.AUTO, QWEN3_CODER_XML_TOOLS_TEMPLATE).name == "qwen3_coder"
    assert get_parser(ToolParserName.HERMES, QWEN3_CODER_XML_TOOLS_TEMPLATE).name == "hermes"
