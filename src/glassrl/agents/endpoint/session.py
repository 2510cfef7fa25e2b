"""One rollout's endpoint session: its episodes, and the answer to one chat-completions request.

A request is answered in four steps:
1. its messages become ids (:class:`~.render.Renderer`; a conversation that continues a reply this
   session returned reuses that reply's sampled ids);
2. the episode's :class:`~.capture.Capture` places the call: it extends a sample, starts one, or is
   refused (a rewrite under ``on_rewrite: refuse``); its budget is what the sample has left;
3. it waits for the engine to sample it with the batch (:class:`~.batcher.Lockstep`);
4. each choice's calls are parsed with the run's call format (glassrl.agents.formats) and returned
   as OpenAI ``tool_calls``; the choice is recorded.

The response carries OpenAI's fields, and the ids (``prompt_token_ids``; per choice ``token_ids``),
as vLLM returns them with ``return_token_ids``.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from glassrl.agents.endpoint.batcher import Lockstep, Pending
from glassrl.agents.endpoint.capture import Capture, Choice
from glassrl.agents.endpoint.render import (
    BadRequest,
    Renderer,
    message_key,
    openai_calls,
    reply_content,
    request_tools,
)
from glassrl.agents.endpoint.server import MODEL, wait
from glassrl.agents.loop import SampledTurn

MAX_N = 64
MAX_TOP_LOGPROBS = 20
TOOL_CHOICES = ("auto", "none")


@dataclass
class EpisodeState:
    index: int
    capture: Capture


class Session:
    """The episodes of one ``generate`` (``captures[i]``: episode i's), answering the server's requests."""

    def __init__(self, renderer: Renderer, captures: list[Capture], lockstep: Lockstep, tag: str) -> None:
        self.renderer = renderer
        self.format = renderer.format
        self.decode = renderer.tokenizer.decode
        self.lockstep = lockstep
        key = secrets.token_hex(8)  # in every episode's URL: no one else's call reaches an episode
        self.episodes = {f"{tag}-{i}-{key}": EpisodeState(i, c) for i, c in enumerate(captures)}
        self.count = 0
        self.top_logprobs = True  # the engine can compute top_logprobs (its sampler exposes a model)

    def names(self) -> list[str]:
        return list(self.episodes)

    async def complete(self, episode: str, body: dict[str, Any]) -> dict[str, Any]:
        state = self.episodes.get(episode)
        if state is None:
            raise BadRequest(f"episode {episode!r} is not one of this rollout's (the rollout it belonged to is over?)")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("messages: expected a non-empty list of message objects")
        tools = request_tools(body.get("tools"))
        choice = body.get("tool_choice") or "auto"
        if choice not in TOOL_CHOICES:
            raise BadRequest(
                f"tool_choice {choice!r}: only auto and none (the policy samples freely; forcing a call would "
                "change the distribution it trains on)"
            )
        n = _int("n", body.get("n"), 1, 1, MAX_N)
        top = _int("top_logprobs", body.get("top_logprobs"), 0, 0, MAX_TOP_LOGPROBS)
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        limit = None if body.get(key) is None else _int(key, body[key], None, 1, None)
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        if not all(isinstance(s, str) and s for s in stop):
            raise BadRequest("stop: expected a string or a list of non-empty strings")
        with_logprobs = bool(body.get("logprobs"))
        if top and not with_logprobs:
            raise BadRequest("top_logprobs needs logprobs: true")
        if top and not self.top_logprobs:
            raise BadRequest("top_logprobs: this engine's sampler does not expose its model's logits")

        ids = self._ids(state.capture, messages, tools)
        call, left = state.capture.place(ids, messages, tools)
        self.count += 1
        number = self.count
        head = {"id": f"chatcmpl-{episode}-{number}", "object": "chat.completion", "created": int(time.time())}
        head |= {"model": MODEL, "prompt_token_ids": ids}
        if left <= 0:  # the sample's budget is spent: it ends ("length"), nothing is sampled
            empty = {"role": "assistant", "content": ""}
            choices = [_choice(k, empty, "length", [], None) for k in range(n)]
            return head | {"choices": choices, "usage": _usage(ids, [])}
        budget = left if limit is None else min(limit, left)
        pending = Pending(state.index, ids, n, budget, self.format.stop_strings + stop, top if with_logprobs else 0)
        sampled: list[tuple[SampledTurn, Any]] = await wait(self.lockstep.submit(pending))
        choices = []
        for k, (turn, tops) in enumerate(sampled):
            text = self.decode(turn.tokens[:-1] if turn.ended == "eos" else turn.tokens)
            calls = self.format.parse(text) if turn.ended != "length" and choice != "none" else []
            message: dict[str, Any] = {"role": "assistant", "content": reply_content(text, calls)}
            if calls:
                message["tool_calls"] = openai_calls(calls, tools, f"call_{number}_{k}")
            with state.capture.lock:
                call.choices.append(Choice(turn, text, calls, message))
            finish = "length" if turn.ended == "length" else "tool_calls" if calls else "stop"
            logprobs = self._logprobs(turn, tops) if with_logprobs else None
            choices.append(_choice(k, message, finish, turn.tokens, logprobs))
        return head | {"choices": choices, "usage": _usage(ids, [t.tokens for t, _ in sampled])}

    def _ids(self, capture: Capture, messages: list[dict], tools) -> list[int]:
        """The request's context ids (module docstring, step 1)."""
        keys = [message_key(m) for m in messages]
        best = None
        with capture.lock:
            for call in capture.calls:
                m = len(call.messages)
                if len(keys) <= m or [message_key(x) for x in call.messages] != keys[:m]:
                    continue
                for k, choice in enumerate(call.choices):
                    if message_key(choice.message) == keys[m] and (best is None or m >= best[0]):
                        best = (m, call, k)
        if best is not None:
            m, call, k = best
            observation = self.renderer.observation_ids(messages[m + 1 :])
            if observation is not None:
                return call.full(k) + observation
        if not any(m.get("role") == "assistant" for m in messages):
            return self.renderer.prompt_ids(messages, tools)
        return self.renderer.whole_ids(messages, tools)

    def _logprobs(self, turn: SampledTurn, tops) -> dict[str, Any]:
        def entry(token: int, logprob: float) -> dict[str, Any]:
            text = self.decode([token])
            # a token that top-k / top-p cut has log-prob -inf in vLLM's processed log-probs, which JSON cannot
            # write: -9999.0, as vLLM's own server writes it (vllm/entrypoints/openai/chat_completion/serving.py)
            return {"token": text, "logprob": max(logprob, -9999.0), "bytes": list(text.encode())}

        lps = turn.logprobs or [0.0] * len(turn.tokens)
        content = []
        for i, (token, logprob) in enumerate(zip(turn.tokens, lps)):
            top = [entry(t, v) for t, v in tops[i]] if tops is not None else []
            content.append(entry(token, logprob) | {"top_logprobs": top})
        return {"content": content, "refusal": None}


def _choice(index: int, message: dict, finish: str, tokens: list[int], logprobs) -> dict[str, Any]:
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish, "token_ids": tokens}


def _usage(prompt: list[int], completions: list[list[int]]) -> dict[str, int]:
    done = sum(len(c) for c in completions)
    return {"prompt_tokens": len(prompt), "completion_tokens": done, "total_tokens": len(prompt) + done}


def _int(key: str, value: Any, default: int | None, low: int, high: int | None) -> int:
    """The request's integer ``key`` (``default`` when absent or null), checked against [low, high]."""
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise BadRequest(f"{key}: expected an integer {bound}, got {value!r}")
    return value
