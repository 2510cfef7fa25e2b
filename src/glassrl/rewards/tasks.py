"""The bundled tasks' verdicts: which verifier says a response to a task's prompt is correct."""

from __future__ import annotations

import math
from collections.abc import Sequence

from glassrl.data.tasks import research
from glassrl.rewards.base import RewardRequest, RewardResult, RewardSource
from glassrl.rewards.research import research_rubric
from glassrl.rewards.verifiers import ArithVerifyVerifier, NumericVerifier


class FullMarks:
    """1.0 when ``source`` (a rubric) gives its full ``total`` points, else 0.0: the verdict of a
    task judged by a weighted rubric (research: 1 + 1 + 0.5 = 2.5 points)."""

    def __init__(self, source: RewardSource, total: float) -> None:
        self.source, self.total = source, total

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        return [
            RewardResult.ok(float(math.isclose(r.score, self.total))) if r.is_ok else r
            for r in self.source.score(requests)
        ]


# Bundled task (PromptRecord.metadata["task"]) -> the verifier whose score 1.0 means correct.
TASK_VERIFIERS = {
    "arith-verify": ArithVerifyVerifier(),
    "add": NumericVerifier(),
    "tool-add": NumericVerifier(),  # the final answer's last number is a+b (metadata["sum"])
    "research": FullMarks(research_rubric(), sum(weight for _, weight, _ in research.CRITERIA)),
}
