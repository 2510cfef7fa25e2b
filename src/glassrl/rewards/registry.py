"""Reward sources by name, for configs: ``build_reward_source("numeric")``.

``REWARD_SOURCES`` maps a name to a constructor taking keyword arguments only.
A rubric in a config lists its criteria as mappings::

    criteria:
      - {name: accuracy, weight: 1.0, source: {name: user_function, spec: "my_rules:has_number"}}
      - {name: helpful,  weight: 0.5, source: {name: judge, model_path: ..., question_template: ...}}

and a combination of sources as ``[{name: ..., weight: ..., <arguments>}, ...]``
(:func:`build_combined`).

Arguments are checked against the constructor's signature before it runs: an unknown or
missing argument, or one of the wrong type (``timeout_s: fast``), is one GlassrlError naming the
source and the argument. ``base_dir`` (the directory of the config, which the trainer passes to
:func:`build_combined`) reaches every source that reads files named relative to it.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union

from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardSource
from glassrl.rewards.combine import CombinedReward
from glassrl.rewards.judge import JudgeSource
from glassrl.rewards.majority import MajorityVoteSource
from glassrl.rewards.math_answer import MathVerifier
from glassrl.rewards.research import research_rubric
from glassrl.rewards.reward_model import RewardModelSource
from glassrl.rewards.rubric import Criterion, RubricSource
from glassrl.rewards.teacher import TeacherSource
from glassrl.rewards.user_function import UserFunctionSource
from glassrl.rewards.verifiers import ArithVerifyVerifier, ExactMatchVerifier, NumericVerifier


def _rubric(criteria: Sequence[Mapping[str, Any]], base_dir: str = ".") -> RubricSource:
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
        judge = build_source(source["name"], arguments, base_dir)
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
    "math": MathVerifier,
    "rubric": _rubric,
    "research_rubric": research_rubric,
    "reward_model": RewardModelSource,
    "teacher": TeacherSource,
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
    hints = typing.get_type_hints(constructor.__init__ if inspect.isclass(constructor) else constructor)
    for key, value in kwargs.items():
        if key in hints and not _has_type(value, hints[key]):
            shown = f"{value!r}" if len(repr(value)) <= 60 else f"{repr(value)[:57]}..."
            raise GlassrlError(
                f"reward source {name!r}: argument {key!r} must be {_describe(hints[key])}, "
                f"got {type(value).__name__} {shown}"
            )
    return constructor(**kwargs)


def build_source(name: Any, arguments: dict[str, Any], base_dir: str | Path) -> RewardSource:
    """``build_reward_source`` with ``base_dir`` passed to a source that takes it (unless set)."""
    constructor = REWARD_SOURCES.get(name)
    if constructor is not None and "base_dir" in inspect.signature(constructor).parameters:
        arguments = {"base_dir": str(base_dir), **arguments}
    return build_reward_source(name, **arguments)


def build_combined(specs: Sequence[Mapping[str, Any]], base_dir: str | Path = ".") -> CombinedReward:
    """``[{name, weight, label, ...arguments}, ...]`` -> :class:`CombinedReward` (weight defaults to
    1.0; label, the metrics' name of the source, to its name); relative file paths in the arguments
    are read from ``base_dir`` (the config's directory)."""
    sources = []
    for i, spec in enumerate(specs):
        if not isinstance(spec, Mapping) or "name" not in spec:
            raise GlassrlError(f"rewards[{i}]: expected a mapping with a 'name', got {spec!r}")
        arguments = {k: v for k, v in spec.items() if k not in ("name", "weight", "label")}
        weight = _weight(spec.get("weight", 1.0), f"rewards[{i}].weight")
        sources.append((build_source(spec["name"], arguments, base_dir), weight))
    return CombinedReward(sources, [spec.get("label") for spec in specs])


# ---------------------------------------------------------------- argument types from the signature


def _has_type(value: Any, hint: Any) -> bool:
    """Whether a config value fits a constructor's annotation; what YAML cannot express (a
    callable, a reward source object) is left to the constructor."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_has_type(value, arg) for arg in args)
    if origin is Literal:
        return value in args
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is Path:
        return isinstance(value, (str, Path))
    if origin in (list, tuple, Sequence):
        return isinstance(value, (list, tuple))
    if origin in (dict, Mapping):
        return isinstance(value, Mapping)
    if origin is Callable:
        return callable(value)
    return True


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(dict.fromkeys(_describe(arg) for arg in args))
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    names = {type(None): "null", bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if hint in names:
        return names[hint]
    if origin in (list, tuple, Sequence):
        return "a list"
    if origin in (dict, Mapping):
        return "a mapping"
    if origin is Callable:
        return "a function"
    return getattr(hint, "__name__", str(hint))
