"""The tool-call formats of the model families (glassrl.agents.tool_formats, issue 42): each family's
writer and parser round-trip every call (names, nested JSON arguments, several calls, unicode, strings
holding the family's own delimiters); the hermes calls through the Qwen2.5 chat template as published
(tests/helpers.QWEN25_TEMPLATE, rendering an assistant message with ``tool_calls``); malformed calls
become calls with a reason; each family runs in the agent loop and passes ``glassrl audit``'s checks."""

from __future__ import annotations

import pytest
import torch

from glassrl.agents import AgentRolloutEngine, FunctionTool, ToolEnvironment
from glassrl.agents.formats import build_call_format
from glassrl.agents.tool_formats import CALL_SYNTAXES, call_syntax, same_calls
from glassrl.agents.tools import ToolCall
from glassrl.data.chat_template import render_chat
from glassrl.data.records import PromptRecord
from glassrl.diagnose.episode_audit import Recorder, ScriptedTurns, audit_batch
from glassrl.errors import GlassrlError
from glassrl.rollout.base import SamplingParams

# one string per family's delimiters, and JSON's own
DELIMITERS = (
    '</tool_call> <tool_call>{"name": "x"} </function></tool_call> <parameter=q> </parameter> '
    '[TOOL_CALLS] [ARGS] <|python_tag|> ; }] "quoted" \\ back\\slash'
)
CALLS = [
    ToolCall("search", {"query": "北京 天气 ☀️ — naïve", "k": 3, "exact": True, "ratio": 0.5, "none": None}),
    ToolCall("lookup", {"filter": {"and": [{"field": "a", "in": [1, 2, {"deep": {"er": []}}]}], "not": {}}}),
    ToolCall("echo", {"text": DELIMITERS, "multi": "line one\nline two\n", "list": ["</tool_call>", "\n"]}),
    ToolCall("noargs", {}),
]
SCHEMAS = {
    "search": {
        "properties": {
            "query": {"type": "string"},
            "k": {"type": "integer"},
            "exact": {"type": "boolean"},
            "ratio": {"type": "number"},
            "none": {"type": ["integer", "null"]},
        }
    },
    "lookup": {"properties": {"filter": {"type": "object"}}},
    "echo": {"properties": {"text": {"type": "string"}, "multi": {"type": "string"}, "list": {"type": "array"}}},
    "noargs": {"properties": {}},
}


@pytest.mark.parametrize("family", sorted(CALL_SYNTAXES))
def test_every_family_reads_back_what_it_writes(family):
    syntax = call_syntax(family)
    for calls in ([CALLS[0]], CALLS, CALLS[::-1]):
        text = syntax.write(calls)
        parsed = syntax.parse(text, SCHEMAS)
        assert same_calls(parsed, calls), (family, text, parsed)
        assert all(c.error is None for c in parsed) and syntax.opens_call(text)
    assert syntax.parse("The answer is 42.", SCHEMAS) == [] and not syntax.opens_call("The answer is 42.")


def test_hermes_calls_round_trip_through_the_qwen25_chat_template(qwen_tokenizer):
    """The template renders the assistant message's tool_calls (arguments through tojson); the parser reads
    the same calls back from the rendered text, and the writer writes that text."""
    syntax = call_syntax("hermes")
    tool_calls = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in CALLS]
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": tool_calls}]
    rendered = render_chat(qwen_tokenizer, messages)
    turn = rendered[rendered.rindex("<|im_start|>assistant") :]
    assert same_calls(syntax.parse(turn, SCHEMAS), CALLS)
    # the writer writes what the template writes (transformers' tojson: json.dumps, unicode kept)
    assert turn == "<|im_start|>assistant\n" + syntax.write(CALLS) + "<|im_end|>\n"


def test_qwen3_coder_reads_values_by_the_declared_type():
    syntax = call_syntax("qwen3_coder")
    text = (
        "<tool_call>\n<function=f>\n<parameter=s>\n3\n</parameter>\n<parameter=n>\n3\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    (call,) = syntax.parse(text, {"f": {"properties": {"s": {"type": "string"}, "n": {"type": "integer"}}}})
    assert call.arguments == {"s": "3", "n": 3}
    # as vLLM's qwen3_coder parser reads them (tests/agents/test_agent_tool_formats_vllm.py): no declared
    # type, or not in the schema, is a string; null is None only where the type allows it
    values = {"untyped": "3", "unnamed": '{"a": 1}', "s": "null", "n": "null", "o": '{"a": null}'}
    text = "<tool_call>\n<function=f>\n"
    text += "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items()) + "</function>\n</tool_call>"
    spec = {"untyped": {}, "s": {"type": "string"}, "n": {"type": ["integer", "null"]}, "o": {"type": "object"}}
    (call,) = syntax.parse(text, {"f": {"properties": spec}})
    assert call.arguments == {"untyped": "3", "unnamed": '{"a": 1}', "s": "null", "n": None, "o": {"a": None}}
    # vLLM's aliases of the type names (any case): each value here reads otherwise without its type
    text = "<tool_call>\n<function=f>\n"
    text += "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in zip("ifbs", ["+3", ".5", "1", "3"]))
    spec = {k: {"type": t} for k, t in zip("ifbs", ["int", "Float", ["bool", "null"], " str "])}
    (call,) = syntax.parse(text + "</function>\n</tool_call>", {"f": {"properties": spec}})
    assert call.arguments == {"i": 3, "f": 0.5, "b": True, "s": "3"} and call.arguments["b"] is True
    # Qwen3-Coder's chat template writes a boolean as Python does (``args_value | string``); read back by its type
    text = syntax.write([ToolCall("f", {"b": True, "c": False})])
    assert "<parameter=b>\nTrue\n</parameter>\n<parameter=c>\nFalse\n</parameter>" in text
    (call,) = syntax.parse(text, {"f": {"properties": {"b": {"type": "boolean"}, "c": {"type": "boolean"}}}})
    assert call.arguments == {"b": True, "c": False}
    with pytest.raises(GlassrlError, match=r"argument 's' holds '\\n</parameter>'"):
        syntax.write([ToolCall("f", {"s": "a\n</parameter>\nb"})])


@pytest.mark.parametrize(
    ("family", "text", "reason"),
    [
        ("hermes", "<tool_call>{oops}</tool_call>", "malformed JSON in <tool_call>"),
        ("hermes", '<tool_call>{"name": "f"} {"name": "g"}</tool_call>', "more than one JSON object"),
        ("hermes", '<tool_call>{"arguments": {}}</tool_call>', 'a tool call is {"name"'),
        ("hermes", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "arguments must be a JSON object"),
        ("hermes", "<tool_call>" + "[" * 100 + "]" * 100 + "</tool_call>", "nested deeper than 64 levels"),
        ("qwen3_coder", "<tool_call>\n<parameter=a>\n1\n</parameter>\n</tool_call>", "without <function=NAME>"),
        ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\n1\n", "<parameter=a> without </parameter>"),
        ("qwen3_coder", "<tool_call>\n<function=f>\nloose text\n</function>\n</tool_call>", "expected <parameter="),
        ("llama3_json", '{"name": "f", "parameters": {"a": 1}', "malformed JSON"),
        ("llama3_json", '{"name": "f", "parameters": {}} and more', "separated by ';'"),
        ("llama3_json", '<|python_tag|>{"parameters": {}}', 'a tool call is {"name"'),
        ("mistral", "[TOOL_CALLS] [{oops}]", "malformed JSON"),
        ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": "{1"}]', "malformed JSON arguments"),
        ("mistral", "[TOOL_CALLS] [42]", 'a tool call is [TOOL_CALLS] [{"name"'),
    ],
)
def test_a_malformed_call_is_a_call_with_its_reason(family, text, reason):
    calls = call_syntax(family).parse(text, {})
    assert calls and any(c.error is not None and reason in c.error for c in calls), calls


def test_llama3_and_mistral_read_their_other_spellings():
    (call,) = call_syntax("llama3_json").parse('<|python_tag|>{"name": "f", "arguments": {"a": 1}}')
    assert (call.name, call.arguments) == ("f", {"a": 1})
    (call,) = call_syntax("mistral").parse('[TOOL_CALLS]f[ARGS]{"a": [1, "]"]}')
    assert (call.name, call.arguments) == ("f", {"a": [1, "]"]})
    assert call_syntax("llama3_json").stop_strings == ("<|eom_id|>", "<|eot_id|>")


def test_an_unknown_family_lists_the_valid_ones(qwen_tokenizer):
    with pytest.raises(GlassrlError, match="valid formats are auto, tagged, hermes, qwen3_coder, llama3_json, mistral"):
        build_call_format(qwen_tokenizer, "pythonic")


def _episode(tokenizer, family, calls, fmt=None, turn=None):
    def echo(text: str, times: int = 1) -> str:
        """Echo."""
        return text * times

    fmt = fmt or build_call_format(tokenizer, family)
    recorder = Recorder(lambda: ToolEnvironment([FunctionTool(echo)]))
    turn = fmt.write(calls) if turn is None else turn
    engine = AgentRolloutEngine(ScriptedTurns(tokenizer, [turn, "done"]), tokenizer, recorder)
    engine.format = fmt
    records = [PromptRecord("go")]
    prompts = engine.format_prompts(records)
    params = SamplingParams(max_new_tokens=600)
    batch = engine.generate(prompts, n=1, params=params, generator=torch.Generator().manual_seed(0), records=records)
    (audit,) = audit_batch(batch, records, recorder, fmt, tokenizer, max_turns=4, budget=600)
    return batch, audit


def test_the_audit_catches_a_format_that_does_not_read_back_what_it_writes(qwen_tokenizer):
    fmt = build_call_format(qwen_tokenizer, "hermes")
    calls = [ToolCall("echo", {"text": "a", "times": 2})]
    text = fmt.write(calls)
    fmt.write = lambda calls: text.replace('"times": 2', '"times": 3')  # a writer that changes an argument
    _, audit = _episode(qwen_tokenizer, "hermes", calls, fmt, text)
    (failed,) = [r for r in audit.results if not r.ok]
    assert failed.check == "calls" and '"times": 3' in failed.detail


@pytest.mark.parametrize("family", sorted(CALL_SYNTAXES))
def test_each_family_runs_in_the_loop_and_passes_the_audit(family, qwen_tokenizer):
    """A scripted model writes one turn of two calls in the family's syntax, then answers; the environment
    runs them (results rendered by the chat template), and every check of the audit passes, calls included."""

    calls = [ToolCall("echo", {"text": "</tool_call>[TOOL_CALLS]北京", "times": 2}), ToolCall("echo", {"text": "x"})]
    batch, audit = _episode(qwen_tokenizer, family, calls)
    first = batch.turns[0][0]
    assert first.finish_reason == "tool_call" and [c["status"] for c in first.tool_calls] == ["ok", "ok"]
    assert "</tool_call>[TOOL_CALLS]北京</tool_call>[TOOL_CALLS]北京" in first.observation
    assert audit.ok, [r for r in audit.results if not r.ok]
    assert [r.check for r in audit.results][-1] == "calls"
