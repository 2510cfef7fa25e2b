"""The tool protocol: a name, a JSON schema of the arguments, and ``call(arguments) -> text``.

A tool is any object with

    name:        str, the name the model writes in a call ([A-Za-z_][A-Za-z0-9_.-]*)
    description: str, one line shown to the model (chat template ``tools=``, or the tagged
                 format's tool list)
    parameters:  dict, a JSON schema of the arguments object:
                 {"type": "object", "properties": {...}, "required": [...]}
    call(arguments: dict) -> str

``call`` returns the text the model reads back (a lone surrogate in it becomes U+FFFD). It may
raise: the environment turns the exception into an observation ("error: calculator:
ZeroDivisionError: division by zero"), never a crash; so is ``sys.exit`` (SystemExit) or
KeyboardInterrupt raised inside a tool, which runs in a thread of its own and can stop nothing
else. A tool that runs its work elsewhere raises :class:`ToolFailed` to give the result a status
of its own: a user's tool (``module:attribute``, ``file.py:attribute``) runs in a worker process
(:class:`glassrl.agents.registry.WorkerTool`), where ``os._exit``, a crash or a hang ends
that worker, and the call is an error or timeout observation. Arguments are checked against
``parameters`` before ``call`` (:func:`check_arguments`), so a tool receives only the properties it
declares, with the JSON types it declares.

A plain Python function becomes a tool with :class:`FunctionTool`: its name, its docstring's
first line as description, and its parameters from the type hints (str, int, float, bool,
list, dict; a parameter without a default is required).

:func:`run_call` runs one parsed call with a time limit and returns a :class:`ToolResult`
(ok / error / timeout) whose text says what was wrong. The limit is enforced on the waiting:
the call runs in a daemon thread, and a call past its limit is abandoned, not stopped (Python
cannot stop a thread). A tool whose work must be stopped runs it in a process of its own with
its own limit, as the ``python`` tool does (:mod:`glassrl.agents.sandbox`) and every user
tool built from a spec (:class:`glassrl.agents.registry.WorkerTool`).
"""

from __future__ import annotations

import inspect
import json
import re
import threading
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from glassrl.jsonl import as_text

TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
# JSON-schema type -> the Python types a JSON parser gives for it (bool is not an integer here).
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}
_PYTHON_TO_JSON = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


@runtime_checkable
class Tool(Protocol):
    """See the module docstring."""

    name: str
    description: str
    parameters: dict[str, Any]

    def call(self, arguments: dict[str, Any]) -> str: ...


@dataclass(frozen=True)
class ToolCall:
    """One call as parsed from the model's turn.

    name:      the tool's name as written ("" when none could be read)
    arguments: the JSON object of arguments, or None when there is none (see ``text``/``error``)
    text:      bare text after the name (the tagged format's short form), else None
    error:     why the call could not be parsed (malformed JSON, ...), else None
    raw:       the call as the model wrote it
    """

    name: str
    arguments: dict[str, Any] | None = None
    text: str | None = None
    error: str | None = None
    raw: str = ""


class ToolFailed(Exception):
    """A call that ended without an answer, with its status ("error", "timeout") and what happened."""

    def __init__(self, status: Literal["error", "timeout"], message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one call. ``text`` is what the model reads: the tool's answer, or what was wrong."""

    name: str
    status: Literal["ok", "error", "timeout"]
    text: str
    seconds: float = 0.0

    def as_dict(self, call: ToolCall) -> dict[str, Any]:
        """A plain record for the batch and the ledger (text: a lone surrogate the model wrote as a JSON
        escape, in a name or the arguments, becomes U+FFFD, which a UTF-8 file can hold)."""
        arguments = call.arguments if call.arguments is not None else call.text
        record = {"name": self.name, "arguments": arguments, "status": self.status, "seconds": round(self.seconds, 4)}
        return json.loads(as_text(json.dumps(record, ensure_ascii=False)))


def schema(tool: Tool) -> dict[str, Any]:
    """The tool in the function format chat templates take (``tools=[...]``, OpenAI's layout)."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def check_arguments(parameters: Mapping[str, Any], arguments: Any) -> str | None:
    """Why ``arguments`` does not fit ``parameters`` (a JSON schema of an object), or None when it does.

    Checked: the arguments are an object; every required property is there; no property the
    schema does not declare; each declared property has its declared "type" (and is one of
    "enum" when given). Nested schemas are not descended into.
    """
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    properties = parameters.get("properties", {})
    missing = [name for name in parameters.get("required", ()) if name not in arguments]
    if missing:
        return f"missing argument {missing[0]!r} (required: {', '.join(parameters['required'])})"
    for name, value in arguments.items():
        if name not in properties:
            return f"unknown argument {name!r} (valid: {', '.join(properties) or 'none'})"
        spec = properties[name]
        expected = spec.get("type")
        if expected in _JSON_TYPES and not _is_json_type(value, expected):
            return f"argument {name!r} must be a {expected}, got {type(value).__name__} {value!r}"
        if "enum" in spec and value not in spec["enum"]:
            return f"argument {name!r} must be one of {spec['enum']}, got {value!r}"
    return None


def _is_json_type(value: Any, expected: str) -> bool:
    if isinstance(value, bool):
        return expected == "boolean"
    return isinstance(value, _JSON_TYPES[expected])


def text_argument(parameters: Mapping[str, Any]) -> str | None:
    """The one required string property that bare text in a call stands for, or None if there is not exactly one."""
    required = list(parameters.get("required", ()))
    properties = parameters.get("properties", {})
    if len(required) == 1 and properties.get(required[0], {}).get("type") == "string":
        return required[0]
    return None


def run_call(tools: Mapping[str, Tool], call: ToolCall, timeout_s: float) -> ToolResult:
    """Check and run one call within ``timeout_s``; every failure is a result that says what was wrong."""
    if call.error is not None:
        return ToolResult(call.name, "error", f"error: {call.error}")
    if call.name not in tools:
        valid = ", ".join(sorted(tools)) or "none"
        return ToolResult(call.name, "error", f"error: unknown tool {call.name!r} (available: {valid})")
    tool = tools[call.name]
    arguments = call.arguments
    if arguments is None:
        key = text_argument(tool.parameters)
        if key is None:
            wanted = ", ".join(tool.parameters.get("properties", {})) or "no arguments"
            return ToolResult(tool.name, "error", f"error: {tool.name} takes a JSON object of arguments ({wanted})")
        arguments = {key: call.text or ""}
    problem = check_arguments(tool.parameters, arguments)
    if problem is not None:
        return ToolResult(tool.name, "error", f"error: {tool.name}: {problem}")
    return _call_with_deadline(tool, arguments, timeout_s)


def _call_with_deadline(tool: Tool, arguments: dict[str, Any], timeout_s: float) -> ToolResult:
    box: dict[str, Any] = {}

    def target() -> None:  # a lone surrogate (a tool's, or one the model wrote in its call) is not text to tokenize
        try:
            box["text"] = as_text(str(tool.call(arguments)))
        except ToolFailed as err:
            box["status"], box["error"] = err.status, as_text(err.message)
        except BaseException as err:  # noqa: BLE001 - a tool's failure, sys.exit included, is the model's observation
            box["error"] = as_text(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)

    start = time.monotonic()
    thread = threading.Thread(target=target, name=f"tool-{tool.name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    seconds = time.monotonic() - start
    if thread.is_alive():
        return ToolResult(tool.name, "timeout", f"error: {tool.name}: no answer within {timeout_s:g} s", seconds)
    if "error" in box:
        return ToolResult(tool.name, box.get("status", "error"), f"error: {tool.name}: {box['error']}", seconds)
    return ToolResult(tool.name, "ok", box["text"], seconds)


class FunctionTool:
    """A Python function as a tool (module docstring): ``FunctionTool(fn)`` or ``FunctionTool(fn, name=...)``."""

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        doc = inspect.getdoc(fn) or ""
        self.description = description if description is not None else (doc.splitlines()[0] if doc else self.name)
        hints = typing.get_type_hints(fn)
        properties: dict[str, Any] = {}
        required = []
        for param in inspect.signature(fn).parameters.values():
            if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
                raise TypeError(f"tool {self.name}: parameter {param.name!r} must be a plain or keyword parameter")
            json_type = _PYTHON_TO_JSON.get(typing.get_origin(hints.get(param.name)) or hints.get(param.name))
            properties[param.name] = {"type": json_type} if json_type else {}
            if param.default is param.empty:
                required.append(param.name)
        self.parameters = {"type": "object", "properties": properties, "required": required}

    def call(self, arguments: dict[str, Any]) -> str:
        return str(self.fn(**arguments))


def tool_map(tools: Sequence[Tool]) -> dict[str, Tool]:
    """name -> tool; a ValueError for a bad or repeated name."""
    out: dict[str, Tool] = {}
    for tool in tools:
        if not TOOL_NAME.fullmatch(tool.name):
            raise ValueError(f"tool name {tool.name!r} must match {TOOL_NAME.pattern}")
        if tool.name in out:
            raise ValueError(f"tool name {tool.name!r} is used twice")
        out[tool.name] = tool
    return out
