"""A reward written by the user as a Python function, named ``"module:function"``.

The function is called as ``fn(prompt, response, answer, metadata)`` and returns
either a number (the score) or a dict with ``"score"``, an optional
``"process_rewards"`` (a list of ``[end character offset, reward]`` pairs, see
:mod:`glassrl.rewards.base`) and any other keys, which are kept as details.

Each call runs in a worker process with a timeout (:mod:`glassrl.rewards.timeout`),
so a hung or crashing function costs one ``timeout`` or ``error`` result, not the run.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardRequest, RewardResult
from glassrl.rewards.timeout import default_pool


def import_spec(spec: str, what: str = "user function") -> Callable[..., Any]:
    """The callable named by ``"package.module:function"``; GlassrlError naming the spec otherwise."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise GlassrlError(f"{what} {spec!r}: expected 'module:function'")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any import failure is the user's to fix
        reason = f"{type(err).__name__}: {err}"
        raise GlassrlError(f"{what} {spec!r}: cannot import module {module_name!r}: {reason}") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise GlassrlError(f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise GlassrlError(f"{what} {spec!r}: {attr!r} is not callable")
    return target


def _call_user_function(spec: str, prompt: str, response: str, answer: str | None, metadata: dict) -> Any:
    """Runs in the worker: import by name there (nothing to pickle but the spec) and call."""
    return import_spec(spec)(prompt, response, answer, metadata)


class UserFunctionSource:
    """Scores with the user's ``fn(prompt, response, answer, metadata)``, ``timeout_s`` per call."""

    name = "user_function"

    def __init__(self, spec: str, timeout_s: float = 10.0) -> None:
        if not timeout_s > 0:
            raise GlassrlError(f"user_function: timeout_s must be > 0, got {timeout_s!r}")
        import_spec(spec)  # fail at construction, in the caller's process, with a clear message
        self.spec = spec
        self.timeout_s = float(timeout_s)

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        pool = default_pool()
        with ThreadPoolExecutor(max_workers=pool.size) as threads:
            return list(threads.map(lambda request: self._one(pool, request), requests))

    def _one(self, pool: Any, request: RewardRequest) -> RewardResult:
        record = request.record
        args = (self.spec, request.prompt, request.response, record.answer, record.metadata)
        outcome = pool.call(_call_user_function, args, self.timeout_s)
        if outcome.status == "timeout":
            return RewardResult.timeout(f"{self.spec}: {outcome.message}")
        if outcome.status == "error":
            return RewardResult.error(f"{self.spec}: {outcome.message}")
        return _to_result(self.spec, outcome.value, len(request.response))


def _to_result(spec: str, value: Any, response_chars: int) -> RewardResult:
    """The function's return value as a result; a malformed value is an error result."""
    if isinstance(value, dict):
        if "score" not in value:
            return RewardResult.error(f"{spec}: returned a dict without 'score' (keys: {sorted(value)})")
        details = {k: v for k, v in value.items() if k not in ("score", "process_rewards")}
        score, steps = value["score"], value.get("process_rewards", ())
    else:
        details, score, steps = {}, value, ()
    if not _is_number(score):
        return RewardResult.error(f"{spec}: score must be a number, got {score!r}")
    try:
        steps = [(end, reward) for end, reward in steps]
    except (TypeError, ValueError):
        return RewardResult.error(f"{spec}: process_rewards must be [end, reward] pairs, got {steps!r}")
    previous = 0
    for end, reward in steps:
        if isinstance(end, bool) or not isinstance(end, int) or not previous < end <= response_chars:
            return RewardResult.error(
                f"{spec}: process reward end {end!r} must be an increasing character offset in 1..{response_chars}"
            )
        if not _is_number(reward):
            return RewardResult.error(f"{spec}: process reward at {end} must be a number, got {reward!r}")
        previous = end
    return RewardResult.ok(float(score), steps, details)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(float(value))
