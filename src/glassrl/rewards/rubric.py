"""Rubric rewards: named criteria with weights, total = Σ_i w_i · s_i.

Each criterion is scored in [0, 1] by its judge, which is either

- a rule: a Python callable ``rule(request) -> float``, run in-process (code you
  wrote; for untrusted code use a ``user_function`` source, which has a timeout), or
- a reward source whose scores lie in [0, 1]: a :class:`~glassrl.rewards.judge.JudgeSource`
  asking a local model the criterion's question (RLAIF), or a user function.

The weighted sum is the rubric reward of the agentic-RL reference
(dialogue-agentic-rl-rubric-reward.md, part 2: accuracy w=1.0, temporal
correctness w=1.0, citation format w=0.5, each fully satisfied:
R = 1.0·1.0 + 1.0·1.0 + 0.5·1.0 = 2.5). A criterion judged by a source that explains its
score (a judge's verdict and reason) keeps that explanation in ``details["judges"][name]``. If
any criterion fails (its judge timed out or errored, or a rule raised or left [0, 1]), the
response's result is that failure, naming the criterion — a missing criterion is not scored 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardRequest, RewardResult, RewardSource

Rule = Callable[[RewardRequest], float]


@dataclass(frozen=True)
class Criterion:
    """One rubric line: its name, its weight w_i, and what scores it in [0, 1]."""

    name: str
    weight: float
    judge: Rule | RewardSource


class RubricSource:
    """Σ_i w_i · s_i over the criteria; ``details["criteria"]`` holds each s_i."""

    name = "rubric"

    def __init__(self, criteria: Sequence[Criterion]) -> None:
        if not criteria:
            raise GlassrlError("rubric: criteria is empty")
        names = [c.name for c in criteria]
        for c in criteria:
            if names.count(c.name) > 1:
                raise GlassrlError(f"rubric: criterion name {c.name!r} is used twice")
            if not math.isfinite(c.weight):
                raise GlassrlError(f"rubric: criterion {c.name!r} has weight {c.weight!r}, expected a finite number")
            if not (callable(c.judge) or isinstance(c.judge, RewardSource)):
                raise GlassrlError(f"rubric: criterion {c.name!r}: judge must be a rule (callable) or a reward source")
        self.criteria = tuple(criteria)

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        # per_criterion[c][j]: criterion c's result for request j (sources score the batch at once)
        per_criterion = [self._judge(c, requests) for c in self.criteria]
        results = []
        for j in range(len(requests)):
            scores = {c.name: per_criterion[k][j] for k, c in enumerate(self.criteria)}
            failed = next((c.name for c in self.criteria if not scores[c.name].is_ok), None)
            details = {"criteria": {name: r.score for name, r in scores.items()}}
            explained = {name: r.details for name, r in scores.items() if r.details}
            if explained:
                details["judges"] = explained
            if failed is not None:
                bad = scores[failed]
                status = RewardResult.timeout if bad.status == "timeout" else RewardResult.error
                results.append(status(f"criterion {failed!r}: {bad.message}", details))
                continue
            total = sum(c.weight * scores[c.name].score for c in self.criteria)  # Σ_i w_i · s_i
            details["weights"] = {c.name: c.weight for c in self.criteria}
            results.append(RewardResult.ok(total, details=details))
        return results

    def _judge(self, criterion: Criterion, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        if isinstance(criterion.judge, RewardSource):
            raw = criterion.judge.score(requests)
        else:
            raw = [_run_rule(criterion.judge, request) for request in requests]
        return [_in_unit_interval(result) for result in raw]


def _run_rule(rule: Rule, request: RewardRequest) -> RewardResult:
    try:
        return RewardResult.ok(float(rule(request)))
    except Exception as err:  # noqa: BLE001 - one response's failure is its error result
        return RewardResult.error(f"rule raised {type(err).__name__}: {err}")


def _in_unit_interval(result: RewardResult) -> RewardResult:
    if result.is_ok and not 0.0 <= result.score <= 1.0:
        return RewardResult.error(f"score {result.score:g} is outside [0, 1]")
    return result
