"""Every call of one agent episode, token-exact, and the samples they make.

A call is recorded as: the prompt ids (as rendered, :mod:`.render`), and per choice the sampled
ids, their log-probs (log π under softmax(logits / temperature), as sampled) and the policy version
of each token. Calls chain into samples by their ids alone:

- a call whose prompt ids **start with** an earlier choice's prompt + completion ids extends it:
  the ids between (the tool results, a user message, the template's turn markup) are observation
  tokens of the same sample (``ROLE_OBSERVATION``: in the context, out of every loss, DESIGN §1),
  exactly as the native loop (glassrl.agents.loop) lays an episode out;
- any other call (the agent summarised, trimmed or re-templated its context) starts a new sample
  (``on_rewrite: split``; the sample it left ends with finish reason ``rewritten``), or is refused
  (``on_rewrite: refuse``) with the first token where its prompt parts from the previous call's
  prompt + completion named.

The samples are the chains' ends: a choice no later call extends closes one (with ``n`` > 1 the
choices the agent did not continue are samples of their own, sharing the prompt and turns before
them). Each sample's response budget is ``max_new_tokens`` counted from its first prompt,
generated and observation tokens together (rollout.max_new_tokens, as in the native loop).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from glassrl.agents.endpoint.render import BadRequest, content_text
from glassrl.agents.loop import SampledTurn
from glassrl.agents.tools import ToolCall
from glassrl.rollout.base import ROLE_GENERATED, ROLE_OBSERVATION, Turn

REWRITES = ("split", "refuse")


@dataclass
class Choice:
    """One sampled completion of a call."""

    turn: SampledTurn
    text: str  # the turn's text (special tokens kept, its stop token left out), as the native loop keeps it
    calls: list[ToolCall]
    message: dict  # the assistant message returned for it
    extended: bool = False  # a later call's context starts with this choice's
    rewritten: bool = False  # the next call rewrote the context this choice ended
    cut: bool = False  # the next call's context left no room for one more token: the sample ends here


@dataclass
class Call:
    """One request: its prompt ids and its choices; ``parent`` the (call, choice) it extends, and
    ``root`` the first call of its sample (whose prompt is the sample's prompt)."""

    prompt: list[int]
    messages: list[dict]
    parent: tuple[int, int] | None
    root: int
    choices: list[Choice] = field(default_factory=list)
    tools: tuple = ()  # the request's tools (glassrl.agents.endpoint.render.RequestTool)

    def full(self, k: int) -> list[int]:
        return self.prompt + self.choices[k].turn.tokens


@dataclass
class Sample:
    """One training row: the prompt of its first call, then its turns' ids with their roles."""

    prompt: list[int]
    tokens: list[int]
    roles: list[int]
    logprobs: list[float]
    versions: list[int]
    turns: list[Turn]
    final_text: str
    steps: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # (turn text, the tool results after it)
    tools: tuple = ()  # the tools its first call offered
    messages: list[dict] = field(default_factory=list)  # its first call's messages


class Capture:
    """The calls of one episode (module docstring). ``budget``: rollout.max_new_tokens;
    ``on_rewrite``: split or refuse; ``decode``: ids -> text (for naming a token)."""

    def __init__(self, budget: int, on_rewrite: str, decode: Callable[[list[int]], str]) -> None:
        self.budget = budget
        self.on_rewrite = on_rewrite
        self.decode = decode
        self.calls: list[Call] = []
        self.lock = threading.Lock()

    def place(self, prompt: list[int], messages: list[dict], tools: tuple = ()) -> tuple[Call, int]:
        """The call a request with ``prompt`` ids becomes (not yet sampled) and its token budget; 0 when
        it extends a sample that has no room left for one more token (it ends that sample: "length")."""
        with self.lock:
            parent = self._parent(prompt)
            if parent is None and self.calls:
                self._rewrite(prompt)
            root = self.calls[parent[0]].root if parent is not None else len(self.calls)
            call = Call(prompt, messages, parent, root, tools=tuple(tools))
            used = len(prompt) - len(self.calls[root].prompt if parent is not None else prompt)
            left = self.budget - used
            if parent is not None and left <= 0:  # not recorded: the native loop drops an observation that does not fit
                self.calls[parent[0]].choices[parent[1]].cut = True
                return call, 0
            if parent is not None:
                self.calls[parent[0]].choices[parent[1]].extended = True
            self.calls.append(call)
            return call, left

    def _parent(self, prompt: list[int]) -> tuple[int, int] | None:
        """The latest, longest choice whose prompt + completion the new prompt starts with."""
        best, length = None, -1
        for i in range(len(self.calls) - 1, -1, -1):
            for k in range(len(self.calls[i].choices)):
                full = self.calls[i].full(k)
                if len(full) > length and len(full) <= len(prompt) and prompt[: len(full)] == full:
                    best, length = (i, k), len(full)
        return best

    def _rewrite(self, prompt: list[int]) -> None:
        last = self.calls[-1]
        if not last.choices:
            return  # the previous call was refused or is still sampling: nothing to extend
        full = last.full(0)
        at = next((i for i, (a, b) in enumerate(zip(prompt, full)) if a != b), min(len(prompt), len(full)))
        if self.on_rewrite == "refuse":
            raise BadRequest(f"rollout.agent.endpoint.on_rewrite is refuse and {self.describe(prompt, full, at)}")
        for choice in last.choices:
            choice.rewritten = not choice.extended

    def describe(self, prompt: list[int], full: list[int], at: int) -> str:
        """Where ``prompt`` parts from the previous call's prompt + completion ``full``, in words."""

        def token(ids: list[int]) -> str:
            return f"{ids[at]} ({self.decode([ids[at]])!r})" if at < len(ids) else "the end"

        return (
            f"this call's context is not the previous call's prompt + completion continued: at token {at} it has "
            f"{token(prompt)} where the previous had {token(full)}"
        )

    def samples(self, is_answer: Callable[[Choice], bool], final: Callable[[Choice], str]) -> list[Sample]:
        """The episode's samples, in the order their last calls were made."""
        out = []
        for i, call in enumerate(self.calls):
            for k, choice in enumerate(call.choices):
                if not choice.extended:
                    out.append(self._sample(i, k, is_answer, final))
        return out

    def _sample(self, i: int, k: int, is_answer, final) -> Sample:
        chain = [(i, k)]
        while (parent := self.calls[chain[-1][0]].parent) is not None:
            chain.append(parent)
        chain.reverse()
        prompt = self.calls[chain[0][0]].prompt
        s = Sample(list(prompt), [], [], [], [], [], "", tools=self.calls[chain[0][0]].tools)
        s.messages = self.calls[chain[0][0]].messages
        for n, (ci, ck) in enumerate(chain):
            call, choice = self.calls[ci], self.calls[ci].choices[ck]
            observation = call.prompt[len(prompt) + len(s.tokens) :]
            if n:
                s.tokens += observation
                s.roles += [ROLE_OBSERVATION] * len(observation)
                s.logprobs += [0.0] * len(observation)
                s.versions += [-1] * len(observation)
                last = s.turns[-1]
                s.turns[-1] = Turn(
                    last.start, last.end, len(s.tokens), last.finish_reason, last.text,
                    self.decode(observation), last.tool_calls, last.reward_parts,
                )  # fmt: skip
                previous = self.calls[chain[n - 1][0]]
                results = call.messages[len(previous.messages) + 1 :]
                s.steps[-1] = (last.text, tuple(content_text(m) for m in results if m.get("role") == "tool"))
            start, t = len(s.tokens), choice.turn
            s.tokens += t.tokens
            s.roles += [ROLE_GENERATED] * len(t.tokens)
            s.logprobs += t.logprobs if t.logprobs is not None else [0.0] * len(t.tokens)
            s.versions += t.versions if t.versions is not None else [-1] * len(t.tokens)
            end = len(s.tokens)
            s.turns.append(Turn(start, end, end, _reason(choice), choice.text, "", _records(choice)))
            s.steps.append((choice.text, ()))
        last_choice = self.calls[i].choices[k]
        s.final_text = final(last_choice) if is_answer(last_choice) else ""
        return s


def _reason(choice: Choice) -> str:
    """The turn's finish reason, in the native loop's words (glassrl.rollout.base.Turn)."""
    if choice.turn.ended == "length" or choice.cut:
        return "length"
    if choice.rewritten:
        return "rewritten"
    if choice.extended:
        return "tool_call" if choice.calls else "continue"
    return "turn_limit" if choice.calls else "stop"


def _records(choice: Choice) -> tuple[dict, ...]:
    """The turn's calls as the batch records them (name, arguments; their results are the agent's)."""
    return tuple(
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"], "status": "agent", "seconds": 0.0}
        for c in choice.message.get("tool_calls") or ()
    )
