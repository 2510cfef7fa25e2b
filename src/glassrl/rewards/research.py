"""The research task's rubric as a reward source: the task's rules through :class:`RubricSource`.

The rules and weights live with the task (:mod:`glassrl.data.tasks.research`: accuracy 1.0,
temporal 1.0, citation 0.5, at most 2.5, the reference dialogue's rubric); each scores the
request's ``response``, which for an agentic rollout is the final answer (the last turn, not
the tool calls or their results). ``judges`` replaces the rule of a criterion by a reward source
scoring in [0, 1], e.g. a :class:`~glassrl.rewards.judge.JudgeSource` asking a model the
criterion's question.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from glassrl.data.tasks import research
from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardRequest, RewardSource
from glassrl.rewards.rubric import Criterion, RubricSource


def _on_response(rule: Callable[[str], float]) -> Callable[[RewardRequest], float]:
    def judge(request: RewardRequest) -> float:
        return rule(request.response)

    judge.__name__ = rule.__name__
    return judge


def research_rubric(judges: Mapping[str, RewardSource] | None = None) -> RubricSource:
    """Σ w_i·s_i over the research task's criteria; ``judges`` maps a criterion name to a source."""
    judges = dict(judges or {})
    names = [name for name, _, _ in research.CRITERIA]
    unknown = sorted(set(judges) - set(names))
    if unknown:
        raise GlassrlError(f"research_rubric: unknown criterion {unknown[0]!r}; criteria: {', '.join(names)}")
    return RubricSource(
        [Criterion(name, weight, judges.get(name, _on_response(rule))) for name, weight, rule in research.CRITERIA]
    )
