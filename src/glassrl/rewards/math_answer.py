"""Math answers checked by a maintained library: Hugging Face's math-verify, not our regexes.

The ``math`` source scores 1.0 when the response's final answer equals the reference
mathematically (``1/2``, ``0.5`` and ``\\frac{1}{2}`` agree; ``1,234`` is 1234), else 0.0.

- The reference is the record's ``reward_model.ground_truth`` (verl's data layout) or else its
  answer. A GSM8K answer (``"… #### 72"``, Cobbe et al. 2021) is read after its last ``####``;
  a MATH solution's ``\\boxed{}`` is found by math-verify. A record without a reference, or one
  math-verify cannot read, is an ``error`` result (a data problem), never a 0.
- The response's answer is the text after its last ``####`` when it has one (GSM8K's format);
  otherwise math-verify extracts it (the ``\\boxed{}`` answer, else the last expression). A
  response that states no answer is a wrong answer: 0.

math-verify (sympy underneath) can take unbounded time on a pathological expression, and its own
timeouts use ``signal.alarm`` (main thread only), so each check runs in a reward worker
(:mod:`glassrl.worker_pool`) with math-verify's timeouts off and ``timeout_s`` enforced by
killing the worker: such a response is a ``timeout`` result.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardRequest, RewardResult
from glassrl.rewards.styles import ground_truth
from glassrl.worker_pool import default_pool

_IMPORT_TIMEOUT_S = 120.0  # sympy's import is slow on a loaded machine


def final_answer_text(text: str) -> str:
    """The text after the last ``####`` (GSM8K's answer marker), or all of it."""
    head, marker, tail = text.rpartition("####")
    return tail.strip() if marker else text


def _import_math_verify() -> None:
    """Setup in the worker: import math-verify once, quietly (its 'timeout disabled' warning is ours to own)."""
    import math_verify  # noqa: F401 - heavy optional import, in the worker only

    logging.getLogger("math_verify").setLevel(logging.ERROR)


def _check(reference: str, response: str) -> dict[str, Any]:
    """Runs in the worker: {"reference": parsed or None, "answer": parsed or None, "correct": bool}."""
    from math_verify import parse, verify

    gold = parse(final_answer_text(reference), parsing_timeout=None)
    if not gold:
        return {"reference": None, "answer": None, "correct": False}
    answer = parse(final_answer_text(response), parsing_timeout=None)
    correct = bool(answer) and verify(gold, answer, timeout_seconds=None)
    return {"reference": str(gold[-1]), "answer": str(answer[-1]) if answer else None, "correct": correct}


class MathVerifier:
    """1.0 when the response's final answer equals the reference (math-verify), else 0.0."""

    name = "math"

    def __init__(self, timeout_s: float = 10.0) -> None:
        if not timeout_s > 0:
            raise GlassrlError(f"math: timeout_s must be > 0, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        pool = default_pool()
        with ThreadPoolExecutor(max_workers=pool.size) as threads:
            return list(threads.map(self._one, requests))

    def _one(self, request: RewardRequest) -> RewardResult:
        reference = ground_truth(request.record)
        if reference is None:
            return RewardResult.error(
                f"{request.record.source}: no reference answer (answer or reward_model.ground_truth)"
            )
        outcome = default_pool().call(
            _check,
            (reference, request.response),
            self.timeout_s,
            setup=(_import_math_verify, ()),
            setup_timeout_s=_IMPORT_TIMEOUT_S,
        )
        if outcome.status == "timeout":
            return RewardResult.timeout(f"math: {outcome.message}")
        if outcome.status == "error":
            return RewardResult.error(f"math: {outcome.message}")
        checked = outcome.value
        if checked["reference"] is None:
            return RewardResult.error(
                f"{request.record.source}: math-verify finds no answer in the reference {reference!r:.80}"
            )
        return RewardResult.ok(float(checked["correct"]), details=checked)
