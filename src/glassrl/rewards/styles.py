"""How a user's reward function is called: glassrl's, TRL's or verl's convention, unchanged.

======== ======================================================= ================== ==========================
style    signature                                               called             returns
======== ======================================================= ================== ==========================
glassrl  ``fn(prompt, response, answer, metadata)``              once per response  a number, or a dict with
                                                                                    ``"score"`` (and details)
trl      ``fn(prompts, completions, **kwargs)``                  once per batch     a list of numbers
verl     ``compute_score(data_source, solution_str,              once per response  a number, or a dict with
         ground_truth, extra_info=None)``                        (by keyword)       ``"score"``
======== ======================================================= ================== ==========================

**glassrl**: ``prompt`` is the prompt as the policy saw it (chat prompts rendered), ``answer``
the record's reference answer (or None), ``metadata`` the row's other fields.

**trl** (TRL's ``GRPOTrainer`` reward functions): ``prompts`` and ``completions`` by keyword,
and each dataset column as a keyword holding one value per completion: every metadata key of
the records, and the reference answer as ``answer``. A batch of chat prompts is TRL's
conversational format: each prompt a list of ``{"role", "content"}`` messages, each completion
``[{"role": "assistant", "content": text}]``. TRL's ``completion_ids`` and ``trainer_state`` are
not passed (a reward here sees text, not token ids). A ``None`` in the returned list (TRL's
"does not apply") is an error result: glassrl needs a score for every response.

**verl** (its ``NaiveRewardManager``, which passes the four by keyword): ``data_source`` is the
record's ``data_source`` field, ``solution_str`` the response text, ``ground_truth`` the
record's ``reward_model.ground_truth`` (verl's data layout) or else its reference answer,
``extra_info`` its ``extra_info`` field (``{}`` when the row has none).

A function without ``**kwargs`` receives only the keywords it names, so ``fn(completions,
**kwargs)`` and verl's ``compute_score(solution_str, ground_truth)`` both work.

**Detection** (``style: auto``) reads the signature: a ``completions`` parameter means trl; a
``solution_str`` or ``data_source`` parameter verl; otherwise a function taking four positional
arguments is glassrl's. The source logs the style it picked, once.

The ``call_*`` functions run in the reward worker; the others in the trainer.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from glassrl.data.records import PromptRecord
from glassrl.rewards.base import RewardRequest

STYLES = ("glassrl", "trl", "verl")
BATCHED = {"glassrl": False, "trl": True, "verl": False}
# (name, kind, has a default): a signature as plain data, read in the worker and judged here
Parameters = list[tuple[str, str, bool]]

_VERL_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")
_GLASSRL_ARGUMENTS = ("prompt", "response", "answer", "metadata")


def ground_truth(record: PromptRecord) -> str | None:
    """The reference a verifier compares with: verl's ``reward_model.ground_truth`` (the nested
    field, or a metadata key picked by that dotted path), else the answer."""
    reward_model = record.metadata.get("reward_model")
    if isinstance(reward_model, Mapping) and reward_model.get("ground_truth") is not None:
        return str(reward_model["ground_truth"])
    if record.metadata.get("reward_model.ground_truth") is not None:
        return str(record.metadata["reward_model.ground_truth"])
    return record.answer


def request_item(request: RewardRequest) -> dict[str, Any]:
    """What the worker needs of one request, as data that pickles without glassrl's classes."""
    record = request.record
    raw = record.prompt if isinstance(record.prompt, str) else [dict(m) for m in record.prompt]
    return {
        "prompt": request.prompt,
        "raw_prompt": raw,
        "response": request.response,
        "answer": record.answer,
        "metadata": dict(record.metadata),
        "ground_truth": ground_truth(record),
    }


# ---------------------------------------------------------------- judging a signature (trainer)


def describe(fn: Callable[..., Any]) -> Parameters | None:
    """``fn``'s parameters as plain data; None when Python cannot read its signature."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return [(p.name, p.kind.name, p.default is not inspect.Parameter.empty) for p in signature.parameters.values()]


def signature_text(parameters: Parameters) -> str:
    """``fn(a, b, *args, **kwargs)`` for messages."""
    stars = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}
    return f"fn({', '.join(stars.get(kind, '') + name for name, kind, _ in parameters)})"


def detect_style(parameters: Parameters) -> str | None:
    """The style a signature implies (module docstring), or None."""
    names = {name for name, _, _ in parameters}
    if "completions" in names:
        return "trl"
    if "solution_str" in names or "data_source" in names:
        return "verl"
    positional = [kind for _, kind, _ in parameters if kind in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    if len(positional) >= 4 or any(kind == "VAR_POSITIONAL" for _, kind, _ in parameters):
        return "glassrl"
    return None


def accepted(parameters: Parameters) -> list[str] | None:
    """The keywords ``fn`` takes; None when it takes any (``**kwargs``)."""
    if any(kind == "VAR_KEYWORD" for _, kind, _ in parameters):
        return None
    return [name for name, kind, _ in parameters if kind in ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")]


def mismatch(style: str, parameters: Parameters) -> str | None:
    """Why ``style`` cannot call a function with these parameters; None when it can.

    TRL's dataset columns are not known until a batch arrives, so a trl function is only
    checked for taking ``completions``.
    """
    if style == "glassrl":
        required_keywords = [n for n, kind, default in parameters if kind == "KEYWORD_ONLY" and not default]
        positional = [p for p in parameters if p[1] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
        takes_four = len(positional) >= 4 or any(kind == "VAR_POSITIONAL" for _, kind, _ in parameters)
        if required_keywords or not takes_four or any(not default for _, _, default in positional[4:]):
            return f"style 'glassrl' calls fn({', '.join(_GLASSRL_ARGUMENTS)})"
        return None
    names = accepted(parameters)
    provided = ("prompts", "completions") if style == "trl" else _VERL_ARGUMENTS
    required = [n for n, kind, default in parameters if not default and kind not in ("VAR_POSITIONAL", "VAR_KEYWORD")]
    if any(kind == "POSITIONAL_ONLY" for _, kind, _ in parameters):
        return f"style {style!r} passes arguments by keyword; the function has positional-only parameters"
    if style == "trl":
        if names is not None and "completions" not in names:
            return (
                "style 'trl' calls fn(prompts=..., completions=..., <dataset columns>=...); it takes no 'completions'"
            )
        return None
    missing = [n for n in required if n not in provided]
    if missing:
        return f"style 'verl' calls compute_score({', '.join(provided)}); the function also requires {missing[0]!r}"
    return None


# ---------------------------------------------------------------- calling (worker)


def _keep(kwargs: dict[str, Any], names: Sequence[str] | None) -> dict[str, Any]:
    return kwargs if names is None else {k: v for k, v in kwargs.items() if k in names}


def call_one(fn: Callable[..., Any], style: str, names: Sequence[str] | None, item: Mapping[str, Any]) -> Any:
    """One response's raw score in a per-response style."""
    if style == "glassrl":
        return fn(item["prompt"], item["response"], item["answer"], item["metadata"])
    metadata = item["metadata"]
    extra_info = metadata.get("extra_info")
    kwargs = {
        "data_source": metadata.get("data_source"),
        "solution_str": item["response"],
        "ground_truth": item["ground_truth"],
        "extra_info": {} if extra_info is None else extra_info,
    }
    return fn(**_keep(kwargs, names))


def trl_kwargs(items: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """TRL's keywords for a batch: prompts, completions, and one list per dataset column."""
    conversational = all(isinstance(item["raw_prompt"], list) for item in items) and bool(items)
    columns: dict[str, list[Any]] = {
        "prompts": [item["raw_prompt"] for item in items],
        "completions": [
            [{"role": "assistant", "content": item["response"]}] if conversational else item["response"]
            for item in items
        ],
        "answer": [item["answer"] for item in items],
    }
    keys = dict.fromkeys(key for item in items for key in item["metadata"])
    for key in keys:
        if key not in ("prompts", "completions"):
            columns[key] = [item["metadata"].get(key) for item in items]
    return columns


def call_batch(fn: Callable[..., Any], names: Sequence[str] | None, items: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The batch's raw scores in the trl style; ValueError when the function returns no list of the right length."""
    values = fn(**_keep(trl_kwargs(items), names))
    if callable(getattr(values, "tolist", None)):  # a numpy array or a tensor
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"returned {type(values).__name__}, expected a list of {len(items)} scores")
    if len(values) != len(items):
        raise ValueError(f"returned {len(values)} scores for {len(items)} completions")
    return list(values)
