"""The reward-source protocol: typed results, never a silent 0.

A reward source scores a batch of responses and returns one :class:`RewardResult`
per response. A result is

- ``ok``:      a score (the outcome reward, placed on the last response token) and,
               optionally, process rewards on step ends;
- ``timeout``: the source ran out of time for this response;
- ``error``:   the source could not score it (the message says why).

A failed response is never scored 0 in disguise: the trainer decides what to do
with failures (drop, or score with a configured value) and the metrics count them.
A source never raises for one bad response; it raises
:class:`~glassrl.errors.GlassrlError` only when it is misconfigured, at construction.

Process rewards are ``(end, reward)`` pairs where ``end`` is a character offset in
the response: the exclusive end of a step (``response[:end]`` is the text up to and
including the step's last character). The trainer maps it to the token that holds
character ``end - 1`` — the step-end token of DeepSeekMath's process supervision
(Shao et al. 2024, DeepSeekMath, §4.1.3) — since only it knows the tokenization.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from glassrl.data.records import PromptRecord

Status = Literal["ok", "timeout", "error"]


@dataclass
class RewardRequest:
    """One response to score.

    prompt:   the prompt as the policy saw it (text; chat prompts rendered)
    response: the generated text, without the prompt
    record:   the dataset row (reference answer, metadata) the prompt came from
    """

    prompt: str
    response: str
    record: PromptRecord


@dataclass(frozen=True)
class RewardResult:
    """The typed outcome of scoring one response.

    score:           the outcome reward; None unless status is "ok"
    process_rewards: ((end character offset, reward), ...), offsets increasing
    message:         why a timeout or error happened
    details:         what the score is made of (per-criterion scores, a judge's text,
                     each combined source's own result)
    traceback:       an error's Python traceback, when the user's code raised (the trainer writes
                     the first one to the run directory); kept out of ledgers and checkpoints
    at:              ``path:line`` of the user's innermost frame in it, "" when none
    """

    status: Status
    score: float | None
    process_rewards: tuple[tuple[int, float], ...] = ()
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    traceback: str = field(default="", repr=False, compare=False)
    at: str = field(default="", repr=False, compare=False)

    @classmethod
    def ok(
        cls,
        score: float,
        process_rewards: Sequence[tuple[int, float]] = (),
        details: dict[str, Any] | None = None,
    ) -> RewardResult:
        try:
            score = float(score)
            steps = tuple((int(end), float(reward)) for end, reward in process_rewards)
        except OverflowError:  # float(10**400)
            return cls.error("score is not a finite number: an integer beyond a float's range", details)
        # A NaN or inf score would poison every advantage of the batch.
        if not math.isfinite(score):
            return cls.error(f"score is not a finite number: {score}", details)
        bad = next((reward for _, reward in steps if not math.isfinite(reward)), None)
        if bad is not None:
            return cls.error(f"a process reward is not a finite number: {bad}", details)
        return cls("ok", score, steps, "", dict(details or {}))

    @classmethod
    def timeout(cls, message: str, details: dict[str, Any] | None = None) -> RewardResult:
        return cls("timeout", None, (), message, dict(details or {}))

    @classmethod
    def error(
        cls, message: str, details: dict[str, Any] | None = None, traceback: str = "", at: str = ""
    ) -> RewardResult:
        return cls("error", None, (), message, dict(details or {}), traceback, at)

    @property
    def is_ok(self) -> bool:
        return self.status == "ok"


@runtime_checkable
class RewardSource(Protocol):
    """Anything that scores a batch of responses.

    ``score`` takes the whole batch because some sources need it: majority vote
    looks at a prompt's whole group, a reward model scores in mini-batches.
    Returns one result per request, in order.
    """

    name: str

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]: ...
