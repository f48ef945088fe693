"""Test data: the tiny model's two chat templates as they were before their message loop became
one shared macro (issue 9), verbatim.

Tiny models cached on disk carry this text in their tokenizer_config.json, so the current
templates (:mod:`services.tiny_model.chat_templates`) must render byte-identically; this module is
the reference ``test_chat_templates.py`` compares them with. Do not edit it.
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

# Hermes / Qwen2.5 / Qwen3 style: tools listed as JSON inside <tools></tools> in the system turn,
# calls as <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>.
LEGACY_QWEN_JSON_TOOLS_TEMPLATE = (
    _CONTENT_MACRO
    + _REASONING_MACRO
    + """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- render_content(messages[0].content) + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and '
        'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'
        '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
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
                {{- '{"name": "' + tool_call.name + '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' }}
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
"""
)

# Qwen3-Coder style: tools described in XML, calls as
# <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>.
LEGACY_QWEN3_CODER_XML_TOOLS_TEMPLATE = (
    _CONTENT_MACRO
    + _REASONING_MACRO
    + """\
{%- macro render_value(value) -%}
    {%- if value is string -%}
        {{- value -}}
    {%- else -%}
        {{- value | tojson -}}
    {%- endif -%}
{%- endmacro -%}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- render_content(messages[0].content) + '\\n\\n' }}
    {%- endif %}
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
                    {{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
                {%- else %}
                    {{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
                {%- endif %}
                {%- if tool_call.arguments is defined and tool_call.arguments is not mapping %}
                    {{- raise_exception('the Qwen3-Coder template needs tool call arguments as an '
                                        'object (parse the JSON string first)') }}
                {%- endif %}
                {%- if tool_call.arguments is defined %}
                    {%- for key, value in tool_call.arguments | items %}
                        {{- '<parameter=' + key + '>\\n' + render_value(value)
                            + '\\n</parameter>\\n' }}
                    {%- endfor %}
                {%- endif %}
                {{- '</function>\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user\\n' }}
        {%- endif %}
        {{- '<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>\\n' }}
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
"""
)
