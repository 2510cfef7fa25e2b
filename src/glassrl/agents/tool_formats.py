"""How the model families write a tool call in an assistant turn: one parser and one writer per family.

The chat template renders the prompt (with ``tools=``) and the tool results (:class:`glassrl.agents.
formats.HermesFormat`, whichever family); what differs is the text of the calls inside a turn, and
the tokens that end such a turn. ``rollout.agent.call_format`` names the family:

- ``hermes`` (Hermes 2 Pro, Qwen2.5, Qwen3): ``<tool_call>\\n{"name": N, "arguments": {…}}\\n</tool_call>``,
  one block per call; the turn ends at the template's end-of-turn token (``<|im_end|>``).
- ``qwen3_coder`` (Qwen3-Coder): ``<tool_call>\\n<function=N>\\n<parameter=P>\\nVALUE\\n</parameter>\\n…
  </function>\\n</tool_call>``; a value is written as text (a string as it is, an object or a list as
  JSON, a number or a boolean as its JSON text) and read back by the tool's declared type (the schema
  the prompt showed), as vLLM's qwen3_coder parser does: a parameter with no declared type is read as
  a string, so only strings round-trip there.
- ``llama3_json`` (Llama 3.1 / 3.2 JSON tool calling): the whole turn is ``{"name": N, "parameters":
  {…}}`` (optionally after ``<|python_tag|>``; several calls separated by ``;``, or back to back as
  Meta's llama-models writes them), ending at
  ``<|eom_id|>`` or ``<|eot_id|>``; ``"arguments"`` is read as ``"parameters"``.
- ``mistral`` (Mistral v3 tokenizers): ``[TOOL_CALLS] [{"name": N, "arguments": {…}}, …]`` ending at
  ``</s>``; the v11 form ``[TOOL_CALLS]N[ARGS]{…}`` (``[TOOL_CALLS]N[CALL_ID]ID[ARGS]{…}`` with the
  call's id, one ``[TOOL_CALLS]`` per call) is read too.

Each family's :meth:`write` is what its template writes for an assistant message with ``tool_calls``,
so ``parse(write(calls)) == calls`` (names and arguments) for any calls: nested JSON, several calls,
any unicode, strings holding the family's own delimiters (JSON strings escape nothing of them, so the
parsers find a call's end by decoding JSON, never by searching for the closing tag). The one text a
family cannot carry is refused when written: a qwen3_coder string value holding ``\\n</parameter>\\n``.

A call that cannot be read (malformed JSON, no name, arguments that are not an object, nested too
deep, a parameter with no end) is a :class:`ToolCall` with ``error`` saying why: the environment
answers it with that reason as an observation.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from glassrl.agents.tools import ToolCall
from glassrl.errors import GlassrlError
from glassrl.jsonl import TooDeep, load_json

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")


def _json_at(text: str, at: int) -> tuple[Any, int]:
    """The JSON value starting at ``text[at]`` (after blanks) and the index past it; JSONDecodeError or
    TooDeep (glassrl.jsonl's nesting limit) when there is none."""
    at = _SPACE.match(text, at).end()
    try:
        _, end = _DECODER.raw_decode(text, at)  # finds the end: a string holding "</tool_call>" stays inside
    except RecursionError:
        raise TooDeep from None
    return load_json(text[at:end]), end


def _why(err: Exception) -> str:
    if isinstance(err, json.JSONDecodeError):
        return f"malformed JSON: {err.msg} at character {err.pos}"
    return str(err)


def _call(obj: Any, raw: str, arguments_key: str, example: str) -> ToolCall:
    """A call from a decoded ``{"name": …, arguments_key: {…}}`` (arguments may be a JSON string)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall("", error=f"a tool call is {example}", raw=raw)
    arguments = obj.get(arguments_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = load_json(arguments)
        except json.JSONDecodeError as err:
            return ToolCall(obj["name"], error=f"malformed JSON arguments: {err.msg} at character {err.pos}", raw=raw)
        except TooDeep as err:
            return ToolCall(obj["name"], error=f"arguments {err}", raw=raw)
    if not isinstance(arguments, dict):
        got = type(arguments).__name__
        return ToolCall(obj["name"], error=f"arguments must be a JSON object, got {got}", raw=raw)
    return ToolCall(obj["name"], arguments=arguments, raw=raw)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class HermesCalls:
    """``<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>`` (module docstring)."""

    name = "hermes"
    stop_strings: tuple[str, ...] = ()
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    EXAMPLE = '{"name": ..., "arguments": {...}} inside <tool_call>…</tool_call>'

    def write(self, calls: Sequence[ToolCall]) -> str:
        blocks = [f"{self.OPEN}\n{_dumps({'name': c.name, 'arguments': c.arguments})}\n{self.CLOSE}" for c in calls]
        return "\n".join(blocks)

    def parse(self, text: str, schemas: Mapping[str, dict] | None = None) -> list[ToolCall]:
        calls, at = [], text.find(self.OPEN)
        while at >= 0:
            start = at + len(self.OPEN)
            try:
                obj, end = _json_at(text, start)
                end = _SPACE.match(text, end).end()
                if not text.startswith(self.CLOSE, end):
                    raise ValueError(f"{self.OPEN} holds more than one JSON object, or no {self.CLOSE} after it")
                end += len(self.CLOSE)
                calls.append(_call(obj, text[at:end], "arguments", self.EXAMPLE))
            except (json.JSONDecodeError, TooDeep, ValueError) as err:
                close = text.find(self.CLOSE, start)
                end = len(text) if close < 0 else close + len(self.CLOSE)
                why = f"a {self.OPEN} {err}"
                if isinstance(err, json.JSONDecodeError):
                    why = f"malformed JSON in {self.OPEN}: {err.msg} at character {err.pos}"
                calls.append(ToolCall("", error=why, raw=text[at:end]))
            at = text.find(self.OPEN, end)
        return calls

    def opens_call(self, text: str) -> bool:
        return self.OPEN in text


class Qwen3CoderCalls:
    """``<tool_call>\\n<function=N>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``."""

    name = "qwen3_coder"
    stop_strings: tuple[str, ...] = ()
    _OPEN = re.compile(r"<tool_call>\s*<function=([^>\n]*)>\n?")
    _PARAMETER = re.compile(r"\s*<parameter=([^>\n]*)>\n?")
    _CLOSE = re.compile(r"\s*</function>\s*</tool_call>")

    def write(self, calls: Sequence[ToolCall]) -> str:
        blocks = []
        for call in calls:
            lines = [f"<tool_call>\n<function={call.name}>"]
            for key, value in (call.arguments or {}).items():
                # as Qwen3-Coder's chat template writes a value (``args_value | string``, tojson for a mapping or a
                # list): booleans as Python writes them; null as JSON's null, which vLLM's parser reads back as
                # None (the template's "None" it reads as the text "None")
                text = value if isinstance(value, str) else str(value) if isinstance(value, bool) else _dumps(value)
                if "\n</parameter>" in text:
                    raise GlassrlError(
                        f"qwen3_coder: argument {key!r} holds '\\n</parameter>', which the format cannot carry"
                    )
                lines.append(f"<parameter={key}>\n{text}\n</parameter>")
            lines.append("</function>\n</tool_call>")
            blocks.append("\n".join(lines))
        return "\n".join(blocks)

    def parse(self, text: str, schemas: Mapping[str, dict] | None = None) -> list[ToolCall]:
        calls, at = [], text.find("<tool_call>")
        while at >= 0:
            call, end = self._one(text, at, schemas or {})
            calls.append(call)
            at = text.find("<tool_call>", end)
        return calls

    def _one(self, text: str, at: int, schemas: Mapping[str, dict]) -> tuple[ToolCall, int]:
        """The call whose ``<tool_call>`` is at ``at``, read in order (a value ends at the first
        ``\n</parameter>``: the writer refuses a value holding it), and the index past it."""
        opened = self._OPEN.match(text, at)
        if opened is None:
            return ToolCall("", error="<tool_call> without <function=NAME>", raw=text[at : at + 80]), at + 1
        name, pos = opened.group(1).strip(), opened.end()
        properties = (schemas.get(name) or {}).get("properties", {})
        arguments: dict[str, Any] = {}
        while (parameter := self._PARAMETER.match(text, pos)) is not None:
            key, start = parameter.group(1).strip(), parameter.end()
            close = text.find("\n</parameter>", start)
            close, width = (close, len("\n</parameter>")) if close >= 0 else (text.find("</parameter>", start), 12)
            if close < 0:
                return ToolCall(name, error=f"<parameter={key}> without </parameter>", raw=text[at:]), len(text)
            arguments[key] = _typed(text[start:close], properties.get(key, {}))
            pos = close + width
        closed = self._CLOSE.match(text, pos)
        if closed is None:
            why = f"<function={name}>: expected <parameter=…> or </function></tool_call>, got {text[pos : pos + 40]!r}"
            return ToolCall(name, error=why, raw=text[at:]), pos
        return ToolCall(name, arguments=arguments, raw=text[at : closed.end()]), closed.end()

    def opens_call(self, text: str) -> bool:
        return "<tool_call>" in text


def _typed(text: str, spec: Mapping[str, Any]) -> Any:
    """A qwen3_coder value read by its declared type, as vLLM's qwen3_coder parser reads it (vllm 0.32
    tool_parsers/utils.py ``coerce_to_schema_type``): the declared types tried in its order, null
    (``null``, any case), integer, number (finite), boolean (``true``/``false``/``1``/``0``, any case:
    Qwen3-Coder's chat template writes Python's ``True``), object and array (JSON), string (as
    written); a parameter with no declared type, or one the schema does not name, as written; else
    JSON when it parses, else the text. Type names are read as vLLM reads them: any case, and its
    aliases (``int``, ``float``, ``bool``, ``dict``, ``list``, ``str``, …: :data:`_TYPE_ALIASES`)."""
    kinds = spec.get("type")
    kinds = {kinds} if isinstance(kinds, str) else set(kinds or ())
    kinds = {_TYPE_ALIASES.get(k.strip().lower(), k.strip().lower()) for k in kinds if isinstance(k, str)}
    if not kinds:
        return text
    for kind in ("null", "integer", "number", "boolean", "object", "array", "string"):
        if kind not in kinds:
            continue
        if kind == "null" and text.lower() == "null":
            return None
        if kind == "string":
            return text
        if kind == "integer" and _INTEGER.fullmatch(text.strip()):
            return int(text)
        if kind == "number":
            try:
                number = float(text)
            except ValueError:
                continue
            if math.isfinite(number):
                return int(number) if number == int(number) else number
        if kind == "boolean" and text.lower().strip() in ("true", "1", "false", "0"):
            return text.lower().strip() in ("true", "1")
        if kind in ("object", "array"):
            value = _finite_json(text)
            if value is not _NOT_JSON:
                return value
    value = _finite_json(text)
    return text if value is _NOT_JSON else value


def _finite_json(text: str) -> Any:
    """``text`` as JSON, or _NOT_JSON when it is not JSON or holds a number JSON cannot write (1e999, NaN),
    as vLLM's ``_is_json_finite`` rejects it."""
    try:
        value = load_json(text)
    except (json.JSONDecodeError, TooDeep, ValueError):
        return _NOT_JSON
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return _NOT_JSON
        stack.extend(item.values() if isinstance(item, dict) else item if isinstance(item, list) else ())
    return value


_NOT_JSON = object()
# the type names vLLM reads as JSON Schema's (vllm 0.32 tool_parsers/utils.py ``_TYPE_ALIASES``)
_TYPE_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum"), "string"),
    **dict.fromkeys(("int", "int32", "int64", "uint", "uint32", "uint64", "long", "short", "unsigned"), "integer"),
    **dict.fromkeys(("float", "float32", "float64", "double"), "number"),
    "bool": "boolean",
    "dict": "object",
    **dict.fromkeys(("arr", "list", "sequence"), "array"),
}
_INTEGER = re.compile(r"[+-]?\d+")  # what Python's int() takes (underscores aside)


class Llama3JsonCalls:
    """``{"name": …, "parameters": {…}}`` as the whole turn, ``;`` between calls (module docstring)."""

    name = "llama3_json"
    stop_strings = ("<|eom_id|>", "<|eot_id|>")
    PYTHON_TAG = "<|python_tag|>"
    EXAMPLE = '{"name": ..., "parameters": {...}}'

    def write(self, calls: Sequence[ToolCall]) -> str:
        return "; ".join(_dumps({"name": c.name, "parameters": c.arguments}) for c in calls)

    def parse(self, text: str, schemas: Mapping[str, dict] | None = None) -> list[ToolCall]:
        body = text.strip().removeprefix(self.PYTHON_TAG).strip()
        if not body.startswith("{"):
            return []  # an answer in words
        calls, at = [], 0
        while at < len(body):
            try:
                obj, end = _json_at(body, at)
            except (json.JSONDecodeError, TooDeep) as err:
                calls.append(ToolCall("", error=f"tool call: {_why(err)}", raw=body[at:]))
                break
            calls.append(_call(obj, body[at:end], "parameters", self.EXAMPLE))
            at = _SPACE.match(body, end).end()
            if at < len(body):
                # llama-models' ChatFormat writes the calls back to back, vLLM's llama3_json writes "; "
                if body[at] == ";":
                    at = _SPACE.match(body, at + 1).end()
                elif body[at] != "{":
                    calls.append(ToolCall("", error="calls are separated by ';'", raw=body[at:]))
                    break
        return calls

    def opens_call(self, text: str) -> bool:
        body = text.strip().removeprefix(self.PYTHON_TAG).strip()
        return body.startswith("{")


class MistralCalls:
    """``[TOOL_CALLS] [{"name": …, "arguments": {…}}, …]`` (and ``[TOOL_CALLS]N[ARGS]{…}``)."""

    name = "mistral"
    stop_strings: tuple[str, ...] = ()
    TAG = "[TOOL_CALLS]"
    EXAMPLE = '[TOOL_CALLS] [{"name": ..., "arguments": {...}}]'
    # v11+: [TOOL_CALLS]name[ARGS]{…}, or with the call's id, [TOOL_CALLS]name[CALL_ID]id[ARGS]{…}
    # (mistral-common, tokens/tokenizers/instruct.py InstructTokenizerV11._encode_tool_calls_in_assistant_message)
    _V11 = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.-]*)(?:\[CALL_ID\][^\[]*)?\[ARGS\]")

    def write(self, calls: Sequence[ToolCall]) -> str:
        return self.TAG + " " + _dumps([{"name": c.name, "arguments": c.arguments} for c in calls])

    def parse(self, text: str, schemas: Mapping[str, dict] | None = None) -> list[ToolCall]:
        calls, at = [], text.find(self.TAG)
        while at >= 0:
            start = at + len(self.TAG)
            v11 = self._V11.match(text, start)
            try:
                if v11:
                    obj, end = _json_at(text, v11.end())
                    item = {"name": v11.group(1), "arguments": obj}
                    calls.append(_call(item, text[at:end], "arguments", self.EXAMPLE))
                else:
                    items, end = _json_at(text, start)
                    if not isinstance(items, list):
                        items = [items]
                    calls += [_call(item, text[at:end], "arguments", self.EXAMPLE) for item in items]
            except (json.JSONDecodeError, TooDeep) as err:
                calls.append(ToolCall("", error=f"{self.TAG}: {_why(err)}", raw=text[at:]))
                break
            at = text.find(self.TAG, end)
        return calls

    def opens_call(self, text: str) -> bool:
        return self.TAG in text


# rollout.agent.call_format -> the family's calls (the registry: one signature, an unknown name lists the valid)
CALL_SYNTAXES = {
    "hermes": HermesCalls,
    "qwen3_coder": Qwen3CoderCalls,
    "llama3_json": Llama3JsonCalls,
    "mistral": MistralCalls,
}


def call_syntax(name: str):
    """The family ``name``'s parser and writer; GlassrlError listing the valid names."""
    if name not in CALL_SYNTAXES:
        raise GlassrlError(f"call format {name!r}: valid families are {', '.join(CALL_SYNTAXES)}")
    return CALL_SYNTAXES[name]()


def same_calls(a: Sequence[ToolCall], b: Sequence[ToolCall]) -> bool:
    """The same calls: names, arguments (JSON equal) and errors, in order (``raw`` aside)."""

    def key(calls: Sequence[ToolCall]) -> list:
        return [(c.name, c.arguments, c.text, c.error is None) for c in calls]

    return key(a) == key(b)
