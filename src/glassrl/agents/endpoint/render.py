"""OpenAI chat messages -> the token ids the policy reads, and a sampled turn -> an OpenAI message.

The endpoint renders a request's messages as the run renders its prompts, so that an agent's first
call sees exactly the ids the native loop would have given it:

- the messages before the first assistant message are the prompt: the call format's
  :meth:`~glassrl.agents.formats.CallFormat.prompt_ids` with the request's ``tools`` rendered in
  (hermes: the chat template with ``tools=``; tagged: described in words). When the run's
  prompts are plain text (``data.chat_template``, glassrl.models.chat_rendering: the default
  model answers plain-text prompts), the prompt is its one user message's text (a system
  message first is joined to it by a blank line);
- what follows is rendered **from what was sampled**, never re-tokenised: an assistant message
  that is one the endpoint returned (same content and calls) stands for the exact ids that were
  sampled, and the tool messages after it are the call format's observation
  (:meth:`~glassrl.agents.formats.CallFormat.observation`), as the native loop appends them.

Any other conversation (an assistant message the agent wrote or edited, a user message after an
assistant message) is rendered whole by the chat template (hermes), or refused when prompts are
plain text (there is no template to write it). The capture (:mod:`.capture`) then compares ids,
not messages: a context extends the previous call when its ids start with that call's prompt
and completion.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from glassrl.agents.formats import CallFormat, HermesFormat
from glassrl.agents.tools import ToolCall, text_argument
from glassrl.data.formatting import chat_ids, plain_ids
from glassrl.errors import GlassrlError


class BadRequest(GlassrlError):
    """A request the endpoint cannot serve: answered with HTTP 400 and this message."""


@dataclass(frozen=True)
class RequestTool:
    """A tool as a request's ``tools`` names it (OpenAI's function layout): what a call format renders."""

    name: str
    description: str
    parameters: dict[str, Any]


def request_tools(tools: Sequence[dict] | None) -> list[RequestTool]:
    """The request's ``tools`` (``[{"type": "function", "function": {name, description, parameters}}]``)."""
    out = []
    for k, tool in enumerate(tools or ()):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f"tools[{k}]: expected {{'type': 'function', 'function': {{'name': ...}}}}")
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        out.append(RequestTool(function["name"], str(function.get("description", "")), parameters))
    return out


def content_text(message: dict) -> str:
    """A message's text: its ``content`` string, or its text parts joined; None is ""."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise BadRequest(f"a {message.get('role')} message's content is {type(content).__name__}, not text")


def message_key(message: dict) -> tuple:
    """What makes two messages the same for the conversation: role, text, and calls (name, arguments)."""
    calls = tuple(
        (c.get("function", {}).get("name"), c.get("function", {}).get("arguments"))
        for c in message.get("tool_calls") or ()
    )
    return (message.get("role"), content_text(message), calls)


def openai_calls(calls: Sequence[ToolCall], tools: Sequence[RequestTool], prefix: str) -> list[dict]:
    """The parsed calls as OpenAI ``tool_calls``. ``arguments`` is a JSON string: the call's object;
    a tagged short form's bare text as the tool's one required string argument when it has one;
    else the text as written (an unparsable call: not JSON, as OpenAI warns arguments may be). A call
    that could not be parsed also carries ``error``, the call format's reason (a glassrl field, which
    OpenAI clients keep as an extra: ``call.model_extra["error"]``), so that an agent can answer it as
    the native environment does."""
    by_name = {t.name: t for t in tools}
    out = []
    for k, call in enumerate(calls):
        if call.arguments is not None:
            arguments = json.dumps(call.arguments, ensure_ascii=False)
        elif call.text is not None and call.name in by_name and (key := text_argument(by_name[call.name].parameters)):
            arguments = json.dumps({key: call.text}, ensure_ascii=False)
        else:
            arguments = call.text if call.text is not None else call.raw
        entry = {"id": f"{prefix}_{k}", "type": "function", "function": {"name": call.name, "arguments": arguments}}
        out.append(entry if call.error is None else entry | {"error": call.error})
    return out


def reply_content(text: str, calls: Sequence[ToolCall]) -> str | None:
    """The message's ``content``: the turn's text before its first call (None when that is empty and
    it calls), as OpenAI-compatible servers return a call (vLLM's tool parsers)."""
    if not calls:
        return text
    before = text[: text.find(calls[0].raw)] if calls[0].raw and calls[0].raw in text else ""
    return before.strip() or None


class Renderer:
    """Messages -> ids for one run (module docstring). ``chat``: the run's prompts go through the chat
    template (glassrl.models.chat_rendering.applies_template)."""

    def __init__(self, tokenizer, call_format: CallFormat, *, chat: bool) -> None:
        self.tokenizer = tokenizer
        self.format = call_format
        self.chat = chat

    def prompt_ids(self, messages: Sequence[dict], tools: Sequence[RequestTool]) -> list[int]:
        """The ids of a conversation's opening messages (no assistant message among them)."""
        for k, m in enumerate(messages):
            if m.get("role") not in ("system", "developer", "user"):
                raise BadRequest(f"messages[{k}]: a {m.get('role')!r} message before any assistant message")
        if self.chat:
            return self.format.prompt_ids([_plain(m) for m in messages], tools)
        roles = [m["role"] for m in messages]
        if roles not in (["user"], ["system", "user"], ["developer", "user"]):
            raise BadRequest(
                "the run's prompts are plain text (data.chat_template; the default model answers plain text): "
                f"the conversation opens with one user message, a system message before it at most; got {roles}"
            )
        return self.format.prompt_ids("\n\n".join(content_text(m) for m in messages), tools)

    def observation_ids(self, messages: Sequence[dict]) -> list[int] | None:
        """The ids of the messages after a returned assistant message: the call format's observation
        when they are tool results, else None (rendered whole instead)."""
        if not messages or any(m.get("role") != "tool" for m in messages):
            return None
        return self.format.observation([content_text(m) for m in messages])[1]

    def whole_ids(self, messages: Sequence[dict], tools: Sequence[RequestTool]) -> list[int]:
        """A conversation no returned message explains, rendered whole by the chat template (hermes)."""
        if not isinstance(self.format, HermesFormat) or not self.chat:
            raise BadRequest(
                f"the {self.format.name} call format renders only the assistant messages this endpoint returned "
                "and the tool results after them; this conversation has other assistant or user turns"
            )
        schemas = [{"type": "function", "function": vars(t)} for t in tools] or None
        return chat_ids(self.tokenizer, [_template_message(m) for m in messages], tools=schemas)

    def text_ids(self, text: str) -> list[int]:
        return plain_ids(self.tokenizer, text)


def _plain(message: dict) -> dict:
    role = "system" if message["role"] == "developer" else message["role"]
    return {"role": role, "content": content_text(message)}


def _template_message(message: dict) -> dict:
    """A message as chat templates read it: text content; calls with their arguments as objects."""
    out: dict[str, Any] = {"role": message.get("role"), "content": content_text(message)}
    calls = []
    for c in message.get("tool_calls") or ():
        function = dict(c.get("function", {}))
        try:
            function["arguments"] = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError:
            pass  # arguments the model wrote unparsable stay as written
        calls.append({"type": "function", "function": function})
    if calls:
        out["tool_calls"] = calls
    return out
