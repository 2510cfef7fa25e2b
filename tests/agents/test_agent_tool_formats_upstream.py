"""The mistral and llama3_json call formats (glassrl.agents.tool_formats, issue 42) against the families'
own renderers and parsers, installed from PyPI (the ``formats`` extra), nothing of them copied here:

- Mistral: ``mistral-common``'s MistralTokenizer renders an assistant message with tool calls for the
  v3 (sentencepiece and tekken), v7 and v11 tokenizers, from the tokenizer files the package ships; the
  decoded text goes through our parser; our writer's text, tokenized, goes through mistral-common's own
  tool-call decoder (the one its server uses, ``mistral_common.experimental.tools``).
- Llama 3.1 / 3.2: Meta's ``llama-models`` ChatFormat renders the calls (ToolPromptFormat.json) with the
  Llama 3 tokenizer model it ships; our parser reads the decoded text; its ChatFormat/ToolUtils reads our
  writer's text.

Nothing is downloaded. The v11 tokenizer is the shipped tekken vocabulary with the v11 version and its
special tokens (``[ARGS]``, ``[CALL_ID]``) declared, written to tmp_path: mistral-common ships no v11 file.
"""

from __future__ import annotations

import json

import pytest
from test_agent_tool_formats import CALLS, DELIMITERS, SCHEMAS

from glassrl.agents.tool_formats import call_syntax, same_calls
from glassrl.agents.tools import ToolCall

mistral = pytest.importorskip("mistral_common", reason="the formats extra: pip install -e '.[formats]'")
llama_models = pytest.importorskip("llama_models", reason="the formats extra: pip install -e '.[formats]'")

from llama_models.datatypes import RawMessage, StopReason, ToolPromptFormat  # noqa: E402
from llama_models.datatypes import ToolCall as LlamaCall  # noqa: E402
from llama_models.llama3.chat_format import ChatFormat  # noqa: E402
from llama_models.llama3.tokenizer import Tokenizer as LlamaTokenizer  # noqa: E402
from mistral_common.experimental.tools import _decode_tool_calls, _split_content_and_tool_calls  # noqa: E402
from mistral_common.protocol.instruct.messages import AssistantMessage, ToolMessage, UserMessage  # noqa: E402
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool  # noqa: E402
from mistral_common.protocol.instruct.tool_calls import ToolCall as MistralCall  # noqa: E402
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy  # noqa: E402
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # noqa: E402
from mistral_common.tokens.tokenizers.tekken import Tekkenizer  # noqa: E402

CALL_SETS = ([CALLS[0]], CALLS, CALLS[::-1])


@pytest.fixture(scope="module")
def mistral_tokenizers(tmp_path_factory) -> dict[str, MistralTokenizer]:
    tekken = json.loads((MistralTokenizer._data_path() / "tekken_240911.json").read_text())
    tekken["config"]["version"] = "v11"  # a v11 file must list its special tokens: v3's, then [ARGS], [CALL_ID]
    named = {int(t["rank"]): str(t["token_str"]) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS} | {
        32: "[ARGS]",
        33: "[CALL_ID]",
    }
    count = tekken["config"]["default_num_special_tokens"]
    tekken["special_tokens"] = [
        {"rank": i, "token_str": named.get(i, f"<SPECIAL_{i}>"), "is_control": True} for i in range(count)
    ]
    v11 = tmp_path_factory.mktemp("mistral") / "tekken_v11.json"
    v11.write_text(json.dumps(tekken))
    return {
        "v3": MistralTokenizer.v3(),
        "v3-tekken": MistralTokenizer.v3(is_tekken=True),
        "v7": MistralTokenizer.v7(),
        "v11": MistralTokenizer.from_file(v11),
    }


def _mistral_text(tokenizer, ids: list[int]) -> str:
    """The text of ``ids`` as a model's output reads: control tokens as their names, every run of
    ordinary tokens decoded as text."""
    inner = tokenizer.instruct_tokenizer.tokenizer
    parts, run = [], []
    for i in [*ids, None]:
        if i is not None and not inner.is_special(i):
            run.append(i)
            continue
        if run:
            parts.append(inner.decode(run, special_token_policy=SpecialTokenPolicy.IGNORE))
            run = []
        if i is not None:
            parts.append(inner.decode([i], special_token_policy=SpecialTokenPolicy.KEEP))
    return "".join(parts)


@pytest.mark.parametrize("version", ["v3", "v3-tekken", "v7", "v11"])
def test_mistral_reads_the_calls_mistral_common_renders(mistral_tokenizers, version):
    """mistral-common renders [user, assistant with tool calls, the tool results]; our parser reads the
    assistant turn (``[TOOL_CALLS] [{…}, …]`` up to v7, ``[TOOL_CALLS]N[CALL_ID]ID[ARGS]{…}`` per call
    from v11) back to the same calls."""
    tokenizer = mistral_tokenizers[version]
    for calls in CALL_SETS:
        ids = [f"call{n:05d}" for n in range(len(calls))]  # mistral-common wants 9 letters or digits
        tool_calls = [
            MistralCall(id=i, function=FunctionCall(name=c.name, arguments=json.dumps(c.arguments)))
            for i, c in zip(ids, calls, strict=True)
        ]
        messages = [
            UserMessage(content="go"),
            AssistantMessage(content=None, tool_calls=tool_calls),
            *(ToolMessage(content="done", tool_call_id=i) for i in ids),
        ]
        tools = [Tool(function=Function(name=c.name, parameters={})) for c in calls]
        encoded = tokenizer.encode_chat_completion(ChatCompletionRequest(messages=messages, tools=tools))
        text = _mistral_text(tokenizer, encoded.tokens)
        turn = text[text.rindex("[/INST]") + len("[/INST]") : text.index("</s>", text.rindex("[/INST]"))]
        assert turn.startswith("[TOOL_CALLS]"), turn
        assert (turn.removeprefix("[TOOL_CALLS]").lstrip()[0] == "[") == (version != "v11"), turn  # the form
        parsed = call_syntax("mistral").parse(turn, SCHEMAS)
        assert same_calls(parsed, calls), (version, turn, parsed)


@pytest.mark.parametrize("version", ["v3", "v3-tekken", "v7"])
def test_mistral_common_reads_the_calls_our_writer_writes(mistral_tokenizers, version):
    """Our writer's ``[TOOL_CALLS] [...]`` as the model would emit it (the control token, then the text
    tokenized) goes through mistral-common's tool-call decoder to the same calls."""
    inner = mistral_tokenizers[version].instruct_tokenizer.tokenizer
    tag = inner.get_special_token("[TOOL_CALLS]")
    for calls in CALL_SETS:
        text = call_syntax("mistral").write(calls)
        assert text.startswith("[TOOL_CALLS]")
        ids = [tag, *inner.encode(text.removeprefix("[TOOL_CALLS]"), bos=False, eos=False)]
        content, call_ids = _split_content_and_tool_calls(ids, tag)
        decoded = _decode_tool_calls(call_ids, inner)
        assert content == []
        got = [ToolCall(c.function.name, json.loads(c.function.arguments)) for c in decoded]
        assert same_calls(got, calls), (version, text, got)


# llama-models' ToolCall holds arguments two levels deep at most (scalars, lists and maps of scalars)
LLAMA_CALLS = [
    ToolCall("search", {"query": "北京 天气 ☀️ — naïve", "k": 3, "exact": True, "ratio": 0.5, "none": None}),
    ToolCall("echo", {"text": DELIMITERS, "list": ["</tool_call>", "\n", 1, False], "map": {"a": 1, "b": None}}),
    ToolCall("noargs", {}),
]


@pytest.fixture(scope="module")
def llama_format() -> ChatFormat:
    return ChatFormat(LlamaTokenizer.get_instance())  # the tokenizer.model llama-models ships


@pytest.mark.parametrize("stop", [StopReason.end_of_message, StopReason.end_of_turn])
def test_llama3_json_reads_the_calls_llama_models_renders(llama_format, stop):
    """ChatFormat.encode_message writes each call as ``{"type": "function", "name": N, "parameters":
    {…}}`` (ASCII-escaped JSON), several back to back, then ``<|eom_id|>`` or ``<|eot_id|>``: our parser
    reads them back, and the turn ends at one of the format's stop strings."""
    syntax = call_syntax("llama3_json")
    for calls in ([LLAMA_CALLS[0]], LLAMA_CALLS, LLAMA_CALLS[::-1]):
        message = RawMessage(
            role="assistant",
            content="",
            stop_reason=stop,
            tool_calls=[
                LlamaCall(call_id=f"{n}", tool_name=c.name, arguments=c.arguments) for n, c in enumerate(calls)
            ],
        )
        tokens, _ = llama_format.encode_message(message, ToolPromptFormat.json)
        text = llama_format.tokenizer.decode(tokens)
        turn = text.removeprefix("<|start_header_id|>assistant<|end_header_id|>\n\n")
        ends = [s for s in syntax.stop_strings if turn.endswith(s)]
        assert len(ends) == 1, turn
        turn = turn.removesuffix(ends[0])
        assert syntax.opens_call(turn)
        assert same_calls(syntax.parse(turn, SCHEMAS), calls), turn


def test_llama_models_reads_the_call_our_writer_writes(llama_format):
    """ChatFormat.decode_assistant_message (ToolUtils' JSON branch) reads our writer's call, as the
    model's tokens with the stop token, to the same call. It reads one call per message (its FIXME:
    "Enable multiple tool calls"), so the calls go one at a time."""
    syntax = call_syntax("llama3_json")
    for call in LLAMA_CALLS:
        text = syntax.write([call]) + "<|eom_id|>"
        tokens = llama_format.tokenizer.encode(text, bos=False, eos=False, allowed_special="all")
        message = llama_format.decode_assistant_message(tokens, StopReason.end_of_turn)
        assert message.stop_reason == StopReason.end_of_message and message.content == ""
        (got,) = message.tool_calls
        assert same_calls([ToolCall(str(got.tool_name), got.arguments)], [call]), syntax.write([call])
