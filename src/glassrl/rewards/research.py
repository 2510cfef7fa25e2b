"""The research task's rubric as a reward source: the task's rules through :class:`RubricSource`,
any criterion switchable to a model judge.

The rules and weights live with the task (:mod:`glassrl.data.tasks.research`: accuracy 1.0,
temporal 1.0, citation 0.5, at most 2.5, the reference dialogue's rubric); each scores the
request's ``response`` against the record's episode. For an agentic rollout the response is the
final answer (the last turn, not the tool calls or their results).

A criterion is judged by a model instead of its rule when it is listed in ``judged``: the
causal LM at ``judge_model`` (a local Hugging Face checkpoint, :class:`~glassrl.rewards.judge.JudgeSource`)
is given the criterion's question (``QUESTIONS``), the reference report (``{answer}``: the
official figure, period and source of the episode) and the report, and answers a verdict, 1 or
0, then its reason. The rubric's result keeps each judged criterion's verdict and reason
(``details["judges"][name]``: ``verdict``, ``reason``), and with ``judge_log`` every judgement
is appended to that JSON-lines file (criterion, prompt, report, status, verdict, reason; a
relative path is read from ``base_dir``, the config's directory). ``judges`` (Python only) maps
a criterion to any reward source scoring in [0, 1].
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from glassrl.data.tasks import research
from glassrl.errors import GlassrlError
from glassrl.files import open_append
from glassrl.rewards.base import RewardRequest, RewardResult, RewardSource
from glassrl.rewards.judge import JudgeSource
from glassrl.rewards.rubric import Criterion, RubricSource

_ASK = (
    "Reference report (correct): {answer}\nReport to judge: {response}\n"
    "Answer 1 if the report meets the criterion, 0 if not, then give your reason.\nVerdict:"
)
# criterion -> the question the judge model is asked (the dialogue's rubric, part 2)
QUESTIONS = {
    "accuracy": "Criterion (accuracy): does the report state the revenue figure of the reference report?\n" + _ASK,
    "temporal": (
        "Criterion (temporal correctness): does the report name the period its figure covers, as the reference "
        "report does, and avoid stating a rumour, a forecast or an unreported full year as fact?\n" + _ASK
    ),
    "citation": "Criterion (citation): does the report cite the reference report's source as \\cite{{url}}?\n" + _ASK,
}
VERDICT = r"^\s*([01])"  # the answer starts with the verdict (the question ends "Verdict:")


def _on_response(rule: Callable[[str, research.Episode], float]) -> Callable[[RewardRequest], float]:
    def judge(request: RewardRequest) -> float:
        return rule(request.response, research.episode_of(request.record))

    judge.__name__ = rule.__name__
    return judge


class CriterionJudge:
    """A model's verdict on one criterion (module docstring): the score is the verdict (1 or 0),
    ``details`` its ``verdict`` and ``reason`` (the judge's text); each judgement appended to ``log``."""

    name = "judge"

    def __init__(self, criterion: str, source: RewardSource, log: Path | None = None) -> None:
        self.criterion, self.source, self.log = criterion, source, log
        self.lock = threading.Lock()
        if log is not None:  # a link at the log is refused when the reward is built (glassrl.files), not mid-run
            open_append(log).close()

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        results = [self._verdict(r) for r in self.source.score(requests)]
        if self.log is not None:
            rows = [
                {
                    "criterion": self.criterion,
                    "prompt": request.prompt,
                    "report": request.response,
                    "status": result.status,
                    "verdict": result.score,
                    "reason": result.details.get("reason", result.message),
                }
                for request, result in zip(requests, results)
            ]
            with self.lock, open_append(self.log) as out:  # never through a link put there since
                out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        return results

    @staticmethod
    def _verdict(result: RewardResult) -> RewardResult:
        reason = str(result.details.get("judge_text", "")).strip()
        if not result.is_ok:
            return result
        return RewardResult.ok(result.score, details={"verdict": result.score, "reason": reason})


def research_rubric(
    judges: Mapping[str, RewardSource] | None = None,
    judge_model: str | None = None,
    judged: Sequence[str] = (),
    judge_log: str | None = None,
    judge_device: str = "auto",
    base_dir: str = ".",
) -> RubricSource:
    """Σ w_i·s_i over the research task's criteria, each by its rule unless ``judged`` by
    ``judge_model`` or given a source in ``judges`` (module docstring)."""
    names = [name for name, _, _ in research.CRITERIA]
    judges = dict(judges or {})
    unknown = sorted((set(judges) | set(judged)) - set(names))
    if unknown:
        raise GlassrlError(f"research_rubric: unknown criterion {unknown[0]!r}; criteria: {', '.join(names)}")
    if judged and judge_model is None:
        raise GlassrlError("research_rubric: judged names criteria but judge_model is not set")
    log = None if judge_log is None else Path(base_dir) / judge_log
    for name in judged:
        source = JudgeSource(
            judge_model, QUESTIONS[name], parse=VERDICT, max_score=1.0, max_new_tokens=48, device=judge_device
        )
        judges[name] = CriterionJudge(name, source, log)
    return RubricSource(
        [Criterion(name, weight, judges.get(name, _on_response(rule))) for name, weight, rule in research.CRITERIA]
    )
