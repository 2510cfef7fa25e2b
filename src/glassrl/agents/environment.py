"""The environment protocol, and the environment that answers tool calls.

An environment is one episode's world. The rollout loop makes a fresh one per response
(``make_environment()``), then::

    env.reset(record)                    # the prompt's PromptRecord (answer, metadata)
    for each turn the model writes:
        result = env.step(text, calls)   # the turn's text and the calls parsed from it
        # result.observations: texts the model reads next (tool results), () for none
        # result.done:         the episode is over (the turn was the final answer)
        # result.reward_parts: named rewards for this turn, e.g. {"valid_call": 0.1}
        # result.tool_calls:   one record per call made, for the batch and the ledger
        # result.error:        set by the loop's side only: the environment failed (ends the episode)

``env.tools`` are the tools offered to the model: the loop renders them into the prompt
(chat template ``tools=``, or the tagged format's description). The calls arrive parsed by the
call format (:mod:`glassrl.agents.formats`), so an environment does not depend on how
a model writes a call; one that has no tools can read ``text`` alone (a game, a simulated user).

``step`` runs in a worker thread, concurrently with the other responses' environments; an
environment must not share mutable state with another without a lock. An exception from an
in-process ``step`` (a bundled task's) is a bug in the environment and stops the rollout with an
error naming the record; a bad tool call is not: it is an observation. A user's environment
(``rollout.agent.environment: file.py:make``) runs in a worker process of its own per episode
(:mod:`glassrl.agents.isolated`): there an exception, ``sys.exit``, ``os._exit``, a crash or a hang
ends the episode with finish reason "env_error" and ``error`` saying what happened, never the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from glassrl.agents.tools import Tool, ToolCall, ToolResult, run_call, tool_map
from glassrl.data.records import PromptRecord


@dataclass(frozen=True)
class StepResult:
    """What an environment answers to one turn (module docstring)."""

    observations: tuple[str, ...] = ()
    done: bool = False
    reward_parts: dict[str, float] = field(default_factory=dict)
    tool_calls: tuple[dict[str, Any], ...] = ()
    error: str = ""


@runtime_checkable
class Environment(Protocol):
    """See the module docstring."""

    tools: Sequence[Tool]

    def reset(self, record: PromptRecord) -> None: ...

    def step(self, text: str, calls: Sequence[ToolCall]) -> StepResult: ...


class ToolEnvironment:
    """Runs the turn's tool calls and returns their results; a turn without a call is the final answer.

    tools:             the tools offered
    call_timeout_s:    time limit per call (see :func:`~glassrl.agents.tools.run_call`); above
                       the python tool's own wall limit (10 s), so that its message is the sandbox's
    max_calls:         calls run per turn; further ones are answered with an error
    max_result_chars:  a result longer than this is cut (and says so)
    valid_call_reward: reward part "valid_call", given once per episode, for the first call
                       that parsed, passed its argument check and ran without error (a format
                       reward: it pays for using the tool, not for the answer)
    """

    def __init__(
        self,
        tools: Sequence[Tool],
        *,
        call_timeout_s: float = 30.0,
        max_calls: int = 4,
        max_result_chars: int = 2000,
        valid_call_reward: float = 0.0,
    ) -> None:
        self.tools = tuple(tools)
        self.by_name = tool_map(self.tools)
        self.call_timeout_s = call_timeout_s
        self.max_calls = max_calls
        self.max_result_chars = max_result_chars
        self.valid_call_reward = valid_call_reward
        self.record: PromptRecord | None = None
        self.rewarded = False

    def reset(self, record: PromptRecord) -> None:
        self.record = record
        self.rewarded = False

    def step(self, text: str, calls: Sequence[ToolCall]) -> StepResult:
        if not calls:
            return StepResult(done=True)
        run, refused = list(calls[: self.max_calls]), list(calls[self.max_calls :])
        with ThreadPoolExecutor(max_workers=len(run)) as pool:
            results = list(pool.map(lambda c: run_call(self.by_name, c, self.call_timeout_s), run))
        for call in refused:
            results.append(ToolResult(call.name, "error", f"error: at most {self.max_calls} calls per turn"))
        parts: dict[str, float] = {}
        if self.valid_call_reward and not self.rewarded and any(r.status == "ok" for r in results):
            parts["valid_call"] = self.valid_call_reward
            self.rewarded = True
        return StepResult(
            observations=tuple(self._cap(r.text) for r in results),
            done=False,
            reward_parts=parts,
            tool_calls=tuple(r.as_dict(c) for r, c in zip(results, calls)),
        )

    def _cap(self, text: str) -> str:
        if len(text) <= self.max_result_chars:
            return text
        return text[: self.max_result_chars] + f"…[cut at {self.max_result_chars} characters]"
