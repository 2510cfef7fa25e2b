"""How a model writes a tool call and reads the result back: two formats.

**hermes** (chosen when the tokenizer's chat template takes ``tools=``, as Qwen2.5/Qwen3 and
Hermes templates do). The prompt is rendered by the chat template with the tools' schemas; the
model ends a turn with its end-of-turn token (the tokenizer's EOS, e.g. ``<|im_end|>``), and a
turn that calls tools contains one or more ::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "4821+975"}}
    </tool_call>

The results go back as ``tool`` messages rendered by the same template (Qwen:
``<|im_start|>user\\n<tool_response>\\n5796\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n``).
Only the new messages are rendered: the template's text for [user, assistant, tool…] minus its
text for [user, assistant], plus what the template writes after the assistant's end-of-turn
token (Qwen: a newline). The sampled tokens are never re-rendered, so the context stays
exactly the tokens that were sampled.

**tagged** (every other tokenizer, e.g. the default model, which has no tool-aware template).
The model writes, inside its one answer, ::

    <call>calculator {"expression": "4821+975"}</call>
    <call>calculator 4821+975</call>          (short form: bare text for a tool with exactly
                                                one required string argument)

Generation stops at ``</call>``; the result is appended as `` <result>5796</result>\\n`` (a space
before, a newline after) and the model continues. A turn without a call is the final answer; it
ends at EOS. The tool list is described in the prompt (``describe_tools``): before a plain-text
prompt, or as a system message of a chat prompt; a task whose model learnt the format from data
turns it off.

Why the space and the newline: the context is the sampled tokens and the observation's tokens
laid end to end, and it must also be what the tokenizer makes of its text in one piece (SFT on a
transcript, an inference server, ``glassrl audit``'s render check). A byte-level BPE only merges
inside one pre-token, so the observation starts and ends where every such pre-tokenizer cuts:
with ``</call><result>`` GPT-2's regex and Llama 3's / Qwen2's (`` ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*``)
both make ``><`` one pre-token, and a real vocabulary has it as one token (issue 44: the audit of a
Qwen tokenizer); after a space (`` <``) neither regex joins it to ``>``. A newline (rather than a
space) before would not do: Llama 3's regex takes the newlines after a punctuation run (``>\\n``).
At the end, ``</result>`` followed by the next turn's letters is one pre-token in Llama 3's regex
(a letter run takes one punctuation character before it: ``>5796`` does not, ``>The`` does); the
newline closes the observation's last pre-token (``>\\n``) in both. Tested with tokenizers trained
on text that holds ``><`` (tests/commands/test_commands_audit_bpe.py).

Either way, a call that cannot be parsed (malformed JSON, no name, arguments that are not an
object, nested deeper than glassrl.jsonl.MAX_NESTING) is still a call: the environment answers it
with an observation saying what was wrong.

A tool's output is tokenised as plain text: the text of a special token in it (the EOS
``<|im_end|>``, ``<|im_start|>``) becomes ordinary tokens, the same characters, so no output can
end a turn or open a fake one in the context (glassrl.data.formatting.plain_ids: the rule of every
text from data). Where a chat template does not
keep a tool message's text verbatim, such an output cannot be told from the template's own tokens,
and is refused: replaced by :data:`REFUSED`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

from glassrl.agents.tool_formats import CALL_SYNTAXES, HermesCalls, call_syntax
from glassrl.agents.tools import TOOL_NAME, Tool, ToolCall, schema
from glassrl.data.chat_template import render_chat
from glassrl.data.formatting import Prompt, chat_ids, format_prompt, plain_ids, special_text
from glassrl.errors import GlassrlError
from glassrl.jsonl import TooDeep, load_json

_PROBE_TOOL = "glassrl_probe_tool"


class CallFormat(Protocol):
    """The parts of a call format the rollout loop uses (module docstring)."""

    name: str
    stop_strings: tuple[str, ...]  # a turn also ends at these (besides EOS)

    def prompt_ids(self, prompt: Prompt, tools: Sequence[Tool]) -> list[int]: ...

    def parse(self, text: str) -> list[ToolCall]: ...

    def write(self, calls: Sequence[ToolCall]) -> str: ...  # the calls as the format writes them

    def opens_call(self, text: str) -> bool: ...  # a call was started, complete or cut off

    def observation(self, results: Sequence[str]) -> tuple[str, list[int]]: ...  # text and token ids


def _json_error(err: json.JSONDecodeError) -> str:
    return f"malformed JSON arguments: {err.msg} at character {err.pos}"


class TaggedFormat:
    """``<call>NAME {json}</call>`` → ``<result>…</result>`` (module docstring)."""

    name = "tagged"
    stop_strings = ("</call>",)
    _CALL = re.compile(r"<call>(.*?)</call>", re.S)

    def __init__(self, tokenizer, *, describe_tools: bool = True) -> None:
        self.tokenizer = tokenizer
        self.describe_tools = describe_tools

    def describe(self, tools: Sequence[Tool]) -> str:
        """The tool list and the call syntax, in words the prompt carries."""
        lines = [
            'Tools: call one by writing <call>NAME {"argument": value}</call>; the answer comes back as '
            "<result>…</result>. Write the final answer without a call."
        ]
        for tool in tools:
            arguments = ", ".join(
                f'"{k}": {v.get("type", "any")}' for k, v in tool.parameters.get("properties", {}).items()
            )
            lines.append(f"- {tool.name} {{{arguments}}}: {tool.description}")
        return "\n".join(lines)

    def prompt_ids(self, prompt: Prompt, tools: Sequence[Tool]) -> list[int]:
        if self.describe_tools and tools:
            text = self.describe(tools)
            if isinstance(prompt, str):
                prompt = f"{text}\n\n{prompt}"
            else:
                messages = [dict(m) for m in prompt]
                if messages and messages[0].get("role") == "system":
                    messages[0]["content"] = f"{messages[0]['content']}\n\n{text}"
                else:
                    messages.insert(0, {"role": "system", "content": text})
                prompt = messages
        return format_prompt(self.tokenizer, prompt)

    def parse(self, text: str) -> list[ToolCall]:
        return [self._one(m.group(0), m.group(1).strip()) for m in self._CALL.finditer(text)]

    def _one(self, raw: str, body: str) -> ToolCall:
        name = TOOL_NAME.match(body)
        if name is None:
            return ToolCall("", error="a call starts with a tool name: <call>NAME {json}</call>", raw=raw)
        rest = body[name.end() :].strip()
        if not rest:
            return ToolCall(name.group(0), arguments={}, raw=raw)
        if not rest.startswith("{"):
            return ToolCall(name.group(0), text=rest, raw=raw)
        try:
            arguments = load_json(rest)
        except json.JSONDecodeError as err:
            return ToolCall(name.group(0), error=_json_error(err), raw=raw)
        except TooDeep as err:
            return ToolCall(name.group(0), error=f"arguments {err}", raw=raw)
        return ToolCall(name.group(0), arguments=arguments, raw=raw)

    def opens_call(self, text: str) -> bool:
        return "<call>" in text

    def write(self, calls: Sequence[ToolCall]) -> str:
        """The calls as the format writes them (the audit's round trip): the short form for bare text."""
        return "".join(
            f"<call>{c.name} {c.text if c.arguments is None else json.dumps(c.arguments, ensure_ascii=False)}</call>"
            for c in calls
        )

    def observation(self, results: Sequence[str]) -> tuple[str, list[int]]:
        # A space before and a newline after (module docstring: "Why the space and the newline").
        text = " " + "".join(f"<result>{r}</result>" for r in results) + "\n"
        return text, plain_ids(self.tokenizer, text)  # the format's text holds no special token of its own


class HermesFormat:
    """The chat template renders the prompt (with the tools) and the results; a model family's calls
    (``syntax``, glassrl.agents.tool_formats: hermes by default, qwen3_coder, llama3_json, mistral)
    are parsed from its turns (module docstring)."""

    def __init__(self, tokenizer, syntax=None) -> None:
        self.tokenizer = tokenizer
        self.syntax = syntax if syntax is not None else HermesCalls()
        self.name, self.stop_strings = self.syntax.name, tuple(self.syntax.stop_strings)
        self.schemas: dict[str, dict] = {}  # tool name -> parameters, of the tools the prompts showed
        self._after_eos = self._text_after_end_of_turn()

    def _render(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        return render_chat(self.tokenizer, messages, **kwargs)

    def _text_after_end_of_turn(self) -> str:
        """What the template writes after an assistant message's EOS (checked once, here)."""
        base = self._render([{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}])
        eos = self.tokenizer.eos_token
        if not eos or eos not in base:
            raise GlassrlError(
                f"chat template: an assistant message does not end with the EOS token {eos!r}; "
                "use the tagged call format"
            )
        return base[base.rfind(eos) + len(eos) :]

    def prompt_ids(self, prompt: Prompt, tools: Sequence[Tool]) -> list[int]:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        self.schemas.update({t.name: t.parameters for t in tools})
        return chat_ids(self.tokenizer, messages, tools=[schema(t) for t in tools] or None)

    def parse(self, text: str) -> list[ToolCall]:
        return self.syntax.parse(text, self.schemas)

    def write(self, calls: Sequence[ToolCall]) -> str:
        """The text the family's template writes for these calls (the audit's round trip)."""
        return self.syntax.write(calls)

    def opens_call(self, text: str) -> bool:
        return self.syntax.opens_call(text)

    def observation(self, results: Sequence[str]) -> tuple[str, list[int]]:
        text = self._observation_text(results)
        if not any(special_text(self.tokenizer, r) for r in results):
            return text, list(self.tokenizer.encode(text, add_special_tokens=False))
        # A result holds a special token's text: the template's own text is encoded as it is, each
        # result as plain text. The results' places come from a rendering with marks in their stead.
        marks = [f"\ue000{k}\ue001" for k in range(len(results))]
        pieces = re.split("(" + "|".join(map(re.escape, marks)) + ")", self._observation_text(marks))
        spliced = "".join(results[k // 2] if k % 2 else piece for k, piece in enumerate(pieces))
        if pieces[1::2] != marks or spliced != text:  # the template does not hold results verbatim: refuse
            return self.observation([REFUSED if special_text(self.tokenizer, r) else r for r in results])
        ids = []
        for k, piece in enumerate(pieces):
            ids += (
                plain_ids(self.tokenizer, results[k // 2])
                if k % 2
                else self.tokenizer.encode(piece, add_special_tokens=False)
            )
        return text, ids

    def _observation_text(self, results: Sequence[str]) -> str:
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        tool_messages = [{"role": "tool", "content": r} for r in results]
        before = self._render(base)
        after = self._render(base + tool_messages, add_generation_prompt=True)
        if not after.startswith(before):
            raise GlassrlError("chat template: rendering tool messages changes the earlier messages; use tagged")
        return self._after_eos + after[len(before) :]


# What a tool's output becomes when it holds a special token's text and the chat template does not
# keep tool output verbatim (so that it cannot be encoded apart from the template's own tokens).
REFUSED = "error: the tool's output held a special token of the tokenizer; it is not shown"


def supports_tools(tokenizer) -> bool:
    """The chat template renders ``tools=`` (a probe tool's name appears in the rendered prompt)."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    probe = {
        "type": "function",
        "function": {"name": _PROBE_TOOL, "description": "probe", "parameters": {"type": "object", "properties": {}}},
    }
    try:
        text = render_chat(tokenizer, [{"role": "user", "content": "hi"}], tools=[probe], add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that cannot take tools= is one without tool support
        return False
    return _PROBE_TOOL in text


CALL_FORMATS = ("auto", "tagged", *CALL_SYNTAXES)


def build_call_format(tokenizer, name: str = "auto", *, describe_tools: bool = True) -> CallFormat:
    """The format ``name``: tagged, or a model family's calls with the chat template (hermes,
    qwen3_coder, llama3_json, mistral: glassrl.agents.tool_formats); "auto" is hermes when the chat
    template takes ``tools=``, else tagged."""
    if name not in CALL_FORMATS:
        raise GlassrlError(f"call format {name!r}: valid formats are {', '.join(CALL_FORMATS)}")
    if name in CALL_SYNTAXES:
        return HermesFormat(tokenizer, call_syntax(name))
    if name == "auto" and supports_tools(tokenizer):
        return HermesFormat(tokenizer)
    return TaggedFormat(tokenizer, describe_tools=describe_tools)
