"""Jinja chat templates of the tiny model (Qwen/Hermes JSON tools and Qwen3-Coder XML tools).

Both templates follow the prompt format of the Qwen family (``<|im_start|>role\\n...<|im_end|>\\n``)
so that the adapter's rendering, tool-call parsing and token bookkeeping are exercised on the same
format a real Qwen3 model uses. They deliberately differ from the upstream Qwen3 templates in one
respect: they never drop or rewrite history (no stripping of ``<think>`` blocks from earlier
assistant turns). Rendering is therefore *prefix-stable*: the rendering of ``messages[:k]`` followed
by an assistant message, without a generation prompt, is a string prefix of the rendering of any
longer conversation that starts with those messages, with a generation prompt. The adapter relies
on this to append only new observation tokens to a trajectory.

Message content may be a string or a list of OpenAI text parts (``{"type": "text", "text": ...}``);
both render the same text. Assistant ``tool_calls`` accept the OpenAI shape
(``{"function": {"name", "arguments"}}``) or a bare ``{"name", "arguments"}``; ``arguments`` may be
a JSON string (rendered verbatim) or a mapping (rendered with ``tojson``) in the JSON template, and
must be a mapping in the Coder template (the XML format names every parameter).

The message loop is one Jinja macro (``render_conversation``) shared by both templates; each
template adds only what differs (tool list, tool-call body, tool-result framing). Tiny models built
before the macro carry the older, fully spelled-out text in their tokenizer_config.json: both
render byte-identically (``tests/unit/services/tiny_model/test_chat_templates.py``).
"""

from __future__ import annotations

# Shared Jinja macro: the text of a message's content, whether a string or a list of text parts.
_CONTENT_MACRO = """\
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}
            {%- if part is mapping and part.type == 'text' -%}
                {{- part.text -}}
            {%- elif part is string -%}
                {{- part -}}
            {%- else -%}
                {{- raise_exception('only text content parts are supported') -}}
            {%- endif -%}
        {%- endfor -%}
    {%- elif content is none -%}
    {%- else -%}
        {{- raise_exception('message content must be a string or a list of text parts') -}}
    {%- endif -%}
{%- endmacro -%}
"""

_REASONING_MACRO = """\
{%- macro render_reasoning(message) -%}
    {%- if message.reasoning_content is defined and message.reasoning_content is string
          and message.reasoning_content -%}
        {{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' -}}
    {%- endif -%}
{%- endmacro -%}
"""

# The conversation, shared by both templates: a system turn (with the tool list when there are
# tools), then every message, then the generation prompt. Each template defines how its tools are
# listed (``render_tools``), the body of one tool call after ``<tool_call>\n`` up to the closing
# ``\n</tool_call>`` (``render_tool_call``), how a tool turn opens (``tool_turn_open``) and one
# tool result inside it (``render_tool_response``).
_CONVERSATION_MACRO = """\
{%- macro render_conversation(messages, tools, add_generation_prompt) -%}
    {%- if tools %}
        {{- '<|im_start|>system\\n' }}
        {%- if messages and messages[0].role == 'system' %}
            {{- render_content(messages[0].content) + '\\n\\n' }}
        {%- endif %}
        {{- render_tools(tools) }}
    {%- elif messages and messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + render_content(messages[0].content) + '<|im_end|>\\n' }}
    {%- endif %}
    {%- for message in messages %}
        {%- if message.role == 'system' %}
            {%- if not loop.first %}
                {{- '<|im_start|>system\\n' + render_content(message.content) + '<|im_end|>\\n' }}
            {%- endif %}
        {%- elif message.role == 'user' %}
            {{- '<|im_start|>user\\n' + render_content(message.content) + '<|im_end|>\\n' }}
        {%- elif message.role == 'assistant' %}
            {{- '<|im_start|>assistant\\n' + render_reasoning(message) }}
            {{- render_content(message.content) }}
            {%- if message.tool_calls %}
                {%- for tool_call in message.tool_calls %}
                    {%- if tool_call.function is defined %}
                        {%- set tool_call = tool_call.function %}
                    {%- endif %}
                    {%- if loop.first and not render_content(message.content) %}
                        {{- '<tool_call>\\n' }}
                    {%- else %}
                        {{- '\\n<tool_call>\\n' }}
                    {%- endif %}
                    {{- render_tool_call(tool_call) + '\\n</tool_call>' }}
                {%- endfor %}
            {%- endif %}
            {{- '<|im_end|>\\n' }}
        {%- elif message.role == 'tool' %}
            {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
                {{- tool_turn_open() }}
            {%- endif %}
            {{- render_tool_response(message.content) }}
            {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
                {{- '<|im_end|>\\n' }}
            {%- endif %}
        {%- else %}
            {{- raise_exception('unsupported message role: ' + (message.role | string)) }}
        {%- endif %}
    {%- endfor %}
    {%- if add_generation_prompt %}
        {{- '<|im_start|>assistant\\n' }}
    {%- endif %}
{%- endmacro -%}
"""

_RENDER = "{{- render_conversation(messages, tools, add_generation_prompt) }}\n"

# Hermes / Qwen2.5 / Qwen3 style: tools listed as JSON inside <tools></tools> in the system turn,
# calls as <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>.
QWEN_JSON_TOOLS_TEMPLATE = (
    _CONTENT_MACRO
    + _REASONING_MACRO
    + _CONVERSATION_MACRO
    + """\
{%- macro render_tools(tools) -%}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and '
        'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'
        '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- endmacro -%}
{%- macro render_tool_call(tool_call) -%}
    {{- '{"name": "' + tool_call.name + '", "arguments": ' }}
    {%- if tool_call.arguments is string %}
        {{- tool_call.arguments }}
    {%- else %}
        {{- tool_call.arguments | tojson }}
    {%- endif %}
    {{- '}' }}
{%- endmacro -%}
{%- macro tool_turn_open() -%}
    {{- '<|im_start|>user' }}
{%- endmacro -%}
{%- macro render_tool_response(content) -%}
    {{- '\\n<tool_response>\\n' + render_content(content) + '\\n</tool_response>' }}
{%- endmacro -%}
"""
    + _RENDER
)

# Qwen3-Coder style: tools described in XML, calls as
# <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>.
QWEN3_CODER_XML_TOOLS_TEMPLATE = (
    _CONTENT_MACRO
    + _REASONING_MACRO
    + _CONVERSATION_MACRO
    + """\
{%- macro render_value(value) -%}
    {%- if value is string -%}
        {{- value -}}
    {%- else -%}
        {{- value | tojson -}}
    {%- endif -%}
{%- endmacro -%}
{%- macro render_tools(tools) -%}
    {{- '# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' }}
    {%- for tool in tools %}
        {%- if tool.function is defined %}
            {%- set tool = tool.function %}
        {%- endif %}
        {{- '\\n<function>\\n<name>' + tool.name + '</name>' }}
        {%- if tool.description is defined and tool.description %}
            {{- '\\n<description>' + tool.description + '</description>' }}
        {%- endif %}
        {{- '\\n<parameters>' }}
        {%- if tool.parameters is defined and tool.parameters.properties is defined %}
            {%- for name, spec in tool.parameters.properties | items %}
                {{- '\\n<parameter>\\n<name>' + name + '</name>' }}
                {%- if spec.type is defined %}
                    {{- '\\n<type>' + render_value(spec.type) + '</type>' }}
                {%- endif %}
                {%- if spec.description is defined %}
                    {{- '\\n<description>' + spec.description + '</description>' }}
                {%- endif %}
                {%- if spec.enum is defined %}
                    {{- '\\n<enum>' + (spec.enum | tojson) + '</enum>' }}
                {%- endif %}
                {{- '\\n</parameter>' }}
            {%- endfor %}
            {%- if tool.parameters.required is defined %}
                {{- '\\n<required>' + (tool.parameters.required | tojson) + '</required>' }}
            {%- endif %}
        {%- endif %}
        {{- '\\n</parameters>\\n</function>' }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format '
        'with NO suffix:\\n\\n<tool_call>\\n<function=example_function_name>\\n'
        '<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n</function>\\n</tool_call>'
        '<|im_end|>\\n' }}
{%- endmacro -%}
{%- macro render_tool_call(tool_call) -%}
    {{- '<function=' + tool_call.name + '>\\n' }}
    {%- if tool_call.arguments is defined and tool_call.arguments is not mapping %}
        {{- raise_exception('the Qwen3-Coder template needs tool call arguments as an '
                            'object (parse the JSON string first)') }}
    {%- endif %}
    {%- if tool_call.arguments is defined %}
        {%- for key, value in tool_call.arguments | items %}
            {{- '<parameter=' + key + '>\\n' + render_value(value) + '\\n</parameter>\\n' }}
        {%- endfor %}
    {%- endif %}
    {{- '</function>' }}
{%- endmacro -%}
{%- macro tool_turn_open() -%}
    {{- '<|im_start|>user\\n' }}
{%- endmacro -%}
{%- macro render_tool_response(content) -%}
    {{- '<tool_response>\\n' + render_content(content) + '\\n</tool_response>\\n' }}
{%- endmacro -%}
"""
    + _RENDER
)
