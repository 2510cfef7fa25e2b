"""Every call format's writer against vLLM's own tool-call parser of that family (``make test-vllm``,
in .venv-vllm): our writer's text -> vLLM's hermes, qwen3_coder, llama3_json and mistral parsers
(``vllm.tool_parsers.ToolParserManager``, given the tools' schemas in the request) -> the same calls.
For qwen3_coder this is the only reference that parses the format; for the others a second one
besides tests/agents/test_agent_tool_formats_upstream.py.

vLLM's parsers find a call's end by searching for the closing tag (hermes, qwen3_coder) or split at
every ``[TOOL_CALLS]`` (mistral, before v11), so a string argument holding those delimiters is read
wrong by them, not by ours (tests/agents/test_agent_tool_formats.py): the calls here hold none.
The tokenizer is a small local one with each family's markers as special tokens (the parsers look
them up in its vocabulary; none has ``[ARGS]``, so vLLM's mistral parser reads the pre-v11 form,
the one our writer writes)."""

from __future__ import annotations

import json

import pytest
from test_agent_tool_formats import CALLS, SCHEMAS

from glassrl.agents.tool_formats import call_syntax, same_calls
from glassrl.agents.tools import ToolCall

pytestmark = pytest.mark.vllm

# CALLS without the one holding every family's delimiters (see the module docstring)
REFERENCE_CALLS = [*CALLS[:2], ToolCall("echo", {"multi": "line one\nline two", "list": ["a", "\n"]}), CALLS[3]]


@pytest.fixture(scope="module")
def request_and_tokenizer():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    from glassrl.models.default_tokenizer import build_tokenizer

    tokenizer = build_tokenizer(["a tool call"] * 5)
    markers = ["<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]"]
    tokenizer.add_special_tokens({"additional_special_tokens": markers})
    tools = [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object", **schema}}}
        for name, schema in SCHEMAS.items()
    ]
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "go"}], tools=tools)
    return request, tokenizer


@pytest.mark.parametrize("family", ["hermes", "qwen3_coder", "llama3_json", "mistral"])
def test_vllm_parses_what_our_writer_writes(request_and_tokenizer, family):
    from vllm.tool_parsers import ToolParserManager

    request, tokenizer = request_and_tokenizer
    parser = ToolParserManager.get_tool_parser(family)(tokenizer, request.tools)
    syntax = call_syntax(family)
    for calls in ([REFERENCE_CALLS[0]], REFERENCE_CALLS, REFERENCE_CALLS[::-1]):
        text = syntax.write(calls)
        info = parser.extract_tool_calls(text, request)
        got = [ToolCall(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]
        assert info.tools_called and same_calls(got, calls), (family, text, got)
        assert same_calls(syntax.parse(text, SCHEMAS), got)  # and ours reads it as vLLM does


def test_qwen3_coder_values_are_typed_as_vllm_types_them():
    """Each value × declared type: our qwen3_coder parser reads what vLLM's coerce_to_schema_type returns
    (Qwen3-Coder's chat template writes Python's True, False and None)."""
    from vllm.tool_parsers.utils import coerce_to_schema_type

    syntax = call_syntax("qwen3_coder")
    values = ["3", " 3 ", "-2", "3.0", "2.5", "1e999", "nan", "True", "false", "1", "0", "null", "NULL", "None"]
    values += ['{"a": [1, null]}', "[1, 2]", "[1e999]", "{oops", "text", ""]
    types = ["string", "integer", "number", "boolean", "object", "array", "null", ["integer", "null"]]
    types += [["string", "null"], ["boolean", "string"], ["number", "integer"], ["object", "array", "null"]]
    types += ["int", "float", "bool", "dict", "list", "str", " Int64 ", ["double", "null"], ["enum", "uint"]]  # aliases
    for kind in types:
        for value in values:
            text = f"<tool_call>\n<function=f>\n<parameter=p>\n{value}\n</parameter>\n</function>\n</tool_call>"
            (call,) = syntax.parse(text, {"f": {"properties": {"p": {"type": kind}}}})
            expected = coerce_to_schema_type(value, kind)
            assert call.arguments == {"p": expected} and type(call.arguments["p"]) is type(expected), (kind, value)
