"""Reward sources by name, for configs: ``build_reward_source("numeric")``.

``REWARD_SOURCES`` maps a name to a constructor taking keyword arguments only.
A rubric in a config lists its criteria as mappings::

    criteria:
      - {name: accuracy, weight: 1.0, source: {name: user_function, spec: "my_rules:has_number"}}
      - {name: helpful,  weight: 0.5, source: {name: judge, model_path: ..., question_template: ...}}

and a combination of sources as ``[{name: ..., weight: ..., <arguments>}, ...]``
(:func:`build_combined`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardSource
from glassrl.rewards.combine import CombinedReward
from glassrl.rewards.judge import JudgeSource
from glassrl.rewards.majority import MajorityVoteSource
from glassrl.rewards.research import research_rubric
from glassrl.rewards.reward_model import RewardModelSource
from glassrl.rewards.rubric import Criterion, RubricSource
from glassrl.rewards.user_function import UserFunctionSource
from glassrl.rewards.verifiers import ArithVerifyVerifier, ExactMatchVerifier, NumericVerifier


def _rubric(criteria: Sequence[Mapping[str, Any]]) -> RubricSource:
    """A rubric from config mappings ``{name, weight, source: {name, ...arguments}}``."""
    built = []
    for i, item in enumerate(criteria):
        where = f"rubric criteria[{i}]"
        if not isinstance(item, Mapping) or set(item) != {"name", "weight", "source"}:
            raise GlassrlError(f"{where}: expected keys name, weight, source; got {item!r}")
        source = item["source"]
        if not isinstance(source, Mapping) or "name" not in source:
            raise GlassrlError(f"{where}.source: expected a mapping with a 'name', got {source!r}")
        arguments = {k: v for k, v in source.items() if k != "name"}
        judge = build_reward_source(source["name"], **arguments)
        built.append(Criterion(str(item["name"]), _weight(item["weight"], f"{where}.weight"), judge))
    return RubricSource(built)


def _weight(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GlassrlError(f"{where}: expected a number, got {value!r}")
    return float(value)


REWARD_SOURCES: dict[str, Callable[..., RewardSource]] = {
    "exact_match": ExactMatchVerifier,
    "numeric": NumericVerifier,
    "arith_verify": ArithVerifyVerifier,
    "rubric": _rubric,
    "research_rubric": research_rubric,
    "reward_model": RewardModelSource,
    "judge": JudgeSource,
    "majority_vote": MajorityVoteSource,
    "user_function": UserFunctionSource,
}


def build_reward_source(name: str, **kwargs: Any) -> RewardSource:
    """The source registered as ``name``, built from ``kwargs``; GlassrlError naming a bad name or argument."""
    if name not in REWARD_SOURCES:
        raise GlassrlError(f"unknown reward source {name!r}; valid: {', '.join(REWARD_SOURCES)}")
    constructor = REWARD_SOURCES[name]
    parameters = inspect.signature(constructor).parameters
    for key in kwargs:
        if key not in parameters:
            valid = ", ".join(parameters) or "none"
            raise GlassrlError(f"reward source {name!r}: unknown argument {key!r}; valid: {valid}")
    for key, parameter in parameters.items():
        if parameter.default is inspect.Parameter.empty and key not in kwargs:
            raise GlassrlError(f"reward source {name!r}: missing argument {key!r}")
    return constructor(**kwargs)


def build_combined(specs: Sequence[Mapping[str, Any]]) -> CombinedReward:
    """``[{name, weight, ...arguments}, ...]`` -> :class:`CombinedReward` (weight defaults to 1.0)."""
    sources = []
    for i, spec in enumerate(specs):
        if not isinstance(spec, Mapping) or "name" not in spec:
            raise GlassrlError(f"rewards[{i}]: expected a mapping with a 'name', got {spec!r}")
        arguments = {k: v for k, v in spec.items() if k not in ("name", "weight")}
        weight = _weight(spec.get("weight", 1.0), f"rewards[{i}].weight")
        sources.append((build_reward_source(spec["name"], **arguments), weight))
    return CombinedReward(sources)
