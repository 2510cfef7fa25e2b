"""Inputs of ``glassrl explain``: command-line flags or a JSON/YAML file, checked.

Every problem is a :class:`GlassrlError` whose message names the flag
(``--values: expected 6 numbers (one per token), got 5``) or the file and
field (``x.json: responses[1].score: missing``). The checked result is an
:class:`ExplainSpec`; glassrl.commands.explain turns it into tensors.

File layout (JSON or YAML)::

    {"prompt": "...", "gamma": 1.0, "lam": 0.95, "beta": 0.1, "estimator": "gae",
     "kl_kind": "k1", "whiten": true, "tokenizer": "path/relative/to/the/file",
     "responses": [{"tokens": [...], "score": 1.0, "kl": [...], "values": [...], "group": 0}, ...]}

A multi-turn response marks its observation tokens with ``"mask"`` 0 (each run of 1s is then
a turn), or gives ``"turns"``: ``[{"start", "end", "observation_end", "finish_reason",
"tool_calls", "reward_parts"}, ...]`` (start and end required; token indices, generated tokens
[start, end), the observation [end, observation_end)). A turn's ``reward_parts`` are placed on
its last generated token, as the trainer places an environment's rewards.

Parameter flags (--gamma, --lam, --beta, --estimator, --kl-kind, --whiten,
--tokenizer) override the file; response flags (--tokens, --score, …) cannot
be combined with it.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from glassrl.config import safe_load
from glassrl.errors import GlassrlError
from glassrl.jsonl import read_utf8

PARAM_KEYS = ("gamma", "lam", "beta", "estimator", "kl_kind", "whiten")
LIST_KEYS = ("token_scores", "step_scores", "kl", "logprobs", "ref_logprobs", "values")  # floats, one per token
RESPONSE_KEYS = (
    "prompt",
    "tokens",
    "response",
    "score",
    "token_scores",
    "step_ends",
    "step_scores",
    "kl",
    "logprobs",
    "ref_logprobs",
    "values",
    "mask",
    "group",
    "baseline_reward",
    "finish_reason",
    "turns",
)
# A turn of a multi-turn response (file only): generated tokens [start, end), then its observation
# [end, observation_end); the rest as glassrl.rollout.base.Turn records it.
TURN_KEYS = ("start", "end", "observation_end", "finish_reason", "tool_calls", "reward_parts")
FILE_KEYS = PARAM_KEYS + ("prompt", "tokenizer", "responses")
DEFAULTS = {"gamma": 1.0, "lam": 1.0, "beta": 0.0, "estimator": "gae", "kl_kind": "k1"}


@dataclass
class ResponseSpec:
    """One response, as given: per-token lists have one entry per token (checked)."""

    label: Callable[[str], str]  # field name -> how the user wrote it ("--values", "x.json: responses[0].values")
    prompt: str = ""
    tokens: list[str] = field(default_factory=list)
    token_ids: list[int] | None = None
    response: str | None = None
    score: float | None = None
    token_scores: list[float] | None = None
    step_ends: list[int] | None = None
    step_scores: list[float] | None = None
    kl: list[float] | None = None
    logprobs: list[float] | None = None
    ref_logprobs: list[float] | None = None
    values: list[float] | None = None
    mask: list[bool] | None = None
    group: int | None = None
    baseline_reward: float | None = None
    finish_reason: str | None = None
    turns: list[dict[str, Any]] | None = None  # multi-turn: TURN_KEYS per turn (derived from a mask with 0s)


@dataclass
class ExplainSpec:
    """Checked inputs of one explain call."""

    responses: list[ResponseSpec]
    gamma: float
    lam: float
    beta: float
    estimator: str
    kl_kind: str
    whiten: bool
    source: str  # the input file, or "explain" for flags: prefixes errors from the math


def from_args(args: argparse.Namespace) -> ExplainSpec:
    """Read flags (and the --input file), tokenise, check; raise GlassrlError naming the culprit."""
    params: dict[str, Any] = {}
    labels: dict[str, str] = {}
    tokenizer: str | None = None
    if args.input is not None:
        given = [f"--{k.replace('_', '-')}" for k in RESPONSE_KEYS if getattr(args, k, None) is not None]
        if given:
            raise GlassrlError(f"{given[0]}: cannot be combined with --input (put it in the file)")
        path = Path(args.input)
        data = _load(path)
        params = {k: data[k] for k in PARAM_KEYS if k in data}
        labels = {k: f"{path}: {k}" for k in params}
        if "tokenizer" in data:
            tokenizer = str(path.parent / _typed(data["tokenizer"], str, f"{path}: tokenizer"))
        responses = _responses_from_file(path, data)
        source = str(path)
    else:
        responses = [_response_from_flags(args)]
        source = "explain"
    for key in PARAM_KEYS:
        if getattr(args, key) is not None:
            params[key], labels[key] = getattr(args, key), f"--{key.replace('_', '-')}"
    if args.tokenizer is not None:
        tokenizer = args.tokenizer
    spec = check_params(params, labels, responses, source)
    texts = [resp for resp in responses if resp.response is not None]
    if texts:
        tok = _load_tokenizer(texts[0], tokenizer)
        for resp in texts:
            _tokenize(resp, tok)
    check(spec)
    return spec


def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise GlassrlError(f"--input: file not found: {path}")
    text = read_utf8(path)
    try:
        data = json.loads(text) if path.suffix == ".json" else safe_load(text)
    except json.JSONDecodeError as err:
        raise GlassrlError(f"{path}:{err.lineno}: not valid JSON: {err.msg}") from None
    except yaml.YAMLError as err:
        raise GlassrlError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise GlassrlError(f"{path}: the top level must be a mapping with a 'responses' list")
    unknown = sorted(set(data) - set(FILE_KEYS))
    if unknown:
        raise GlassrlError(f"{path}: unknown key {unknown[0]!r}; valid keys: {', '.join(FILE_KEYS)}")
    if not isinstance(data.get("responses"), list) or not data["responses"]:
        raise GlassrlError(f"{path}: responses: missing (a list with at least one response)")
    return data


def _responses_from_file(path: Path, data: dict[str, Any]) -> list[ResponseSpec]:
    prompt = _typed(data.get("prompt", ""), str, f"{path}: prompt")
    out = []
    for b, item in enumerate(data["responses"]):
        where = f"{path}: responses[{b}]"
        if not isinstance(item, dict):
            raise GlassrlError(f"{where}: expected a mapping")
        unknown = sorted(set(item) - set(RESPONSE_KEYS))
        if unknown:
            raise GlassrlError(f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(RESPONSE_KEYS)}")
        resp = ResponseSpec(label=lambda k, where=where: f"{where}.{k}", prompt=prompt)
        for key, value in item.items():
            setattr(resp, key, _convert(key, value, resp.label(key)))
        out.append(resp)
    return out


def _response_from_flags(args: argparse.Namespace) -> ResponseSpec:
    resp = ResponseSpec(label=lambda k: f"--{k.replace('_', '-')}")
    for key in RESPONSE_KEYS:
        value = getattr(args, key, None)
        if value is not None:
            setattr(resp, key, _convert(key, value, resp.label(key)))
    return resp


def _convert(key: str, value: Any, label: str) -> Any:
    """A flag's strings or a file's value as the field's type; errors name ``label``."""
    if key in ("prompt", "response", "finish_reason"):
        return _typed(value, str, label)
    if key in ("score", "baseline_reward"):
        return _number(value, label)
    if key == "group":
        return integer(value, label)
    if key == "turns":
        return _turns(value, label)
    items = _list(value, label)
    if key == "tokens":
        return [_typed(v, str, f"{label}[{i}]") for i, v in enumerate(items)]
    if key == "step_ends":
        return [integer(v, f"{label}[{i}]") for i, v in enumerate(items)]
    if key == "mask":
        bits = [integer(v, f"{label}[{i}]") if not isinstance(v, bool) else int(v) for i, v in enumerate(items)]
        bad = next((i for i, v in enumerate(bits) if v not in (0, 1)), None)
        if bad is not None:
            raise GlassrlError(f"{label}: expected 0 or 1 at position {bad}, got {bits[bad]}")
        return [bool(v) for v in bits]
    return [_number(v, f"{label}[{i}]") for i, v in enumerate(items)]


def _turns(value: Any, label: str) -> list[dict[str, Any]]:
    """A file's turns: mappings of TURN_KEYS (start and end required), typed."""
    turns = []
    for k, item in enumerate(_list(value, label)):
        where = f"{label}[{k}]"
        if not isinstance(item, dict):
            raise GlassrlError(f"{where}: expected a mapping with start and end")
        unknown = sorted(set(item) - set(TURN_KEYS))
        if unknown:
            raise GlassrlError(f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(TURN_KEYS)}")
        missing = [key for key in ("start", "end") if key not in item]
        if missing:
            raise GlassrlError(f"{where}.{missing[0]}: missing")
        turn: dict[str, Any] = {key: integer(item[key], f"{where}.{key}") for key in ("start", "end")}
        if "observation_end" in item:
            turn["observation_end"] = integer(item["observation_end"], f"{where}.observation_end")
        turn["finish_reason"] = _typed(item.get("finish_reason", ""), str, f"{where}.finish_reason") or None
        calls = _list(item.get("tool_calls", []), f"{where}.tool_calls")
        turn["tool_calls"] = [_typed(c, dict, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)]
        parts = _typed(item.get("reward_parts", {}), dict, f"{where}.reward_parts")
        turn["reward_parts"] = {str(name): _number(x, f"{where}.reward_parts.{name}") for name, x in parts.items()}
        turns.append(turn)
    return turns


def _list(value: Any, label: str) -> list[Any]:
    if not isinstance(value, list):
        raise GlassrlError(f"{label}: expected a list, got {value!r}")
    return value


def _typed(value: Any, kind: type, label: str) -> Any:
    if not isinstance(value, kind):
        raise GlassrlError(f"{label}: expected a {kind.__name__}, got {value!r}")
    return value


def _number(value: Any, label: str) -> float:
    """A finite float: NaN or ±inf would run through every formula and print as numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise GlassrlError(f"{label}: expected a number, got {value!r}")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise GlassrlError(f"{label}: expected a number, got {value!r:.40}") from None
    if not math.isfinite(number):
        raise GlassrlError(f"{label}: expected a finite number, got {value!r:.40}")
    return number


def integer(value: Any, label: str) -> int:
    """An int from a flag's string or a file's value; GlassrlError naming ``label`` otherwise."""
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int):
        raise GlassrlError(f"{label}: expected an integer, got {value!r}")
    return value


def check_params(
    params: dict[str, Any], labels: dict[str, str], responses: list[ResponseSpec], source: str
) -> ExplainSpec:
    """γ, λ, β, estimator, KL kind, whitening from ``params`` over DEFAULTS, checked; errors name
    ``labels[key]`` (or the flag)."""
    from glassrl.algos.advantages import ADVANTAGE_ESTIMATORS
    from glassrl.algos.kl import KL_ESTIMATORS

    def label(key: str) -> str:
        return labels.get(key, f"--{key.replace('_', '-')}")

    values = {**DEFAULTS, **params}
    for key in ("gamma", "lam"):
        x = values[key] = _number(values[key], label(key))
        if not 0.0 <= x <= 1.0:
            raise GlassrlError(f"{label(key)}: must be in [0, 1], got {x:g}")
    values["beta"] = _number(values["beta"], label("beta"))
    if values["beta"] < 0:
        raise GlassrlError(f"{label('beta')}: must be ≥ 0, got {values['beta']:g}")
    for key, valid in (("estimator", ADVANTAGE_ESTIMATORS), ("kl_kind", KL_ESTIMATORS)):
        if values[key] not in valid:
            raise GlassrlError(f"{label(key)}: unknown {values[key]!r}; valid: {', '.join(valid)}")
    whiten = values.get("whiten")
    if whiten is None:
        # PPO implementations whiten GAE advantages (OpenAI baselines ppo2; verl
        # compute_gae_advantage_return + masked_whiten); the critic-free estimators
        # normalise by their group or whiten inside the estimator (REINFORCE++).
        whiten = ADVANTAGE_ESTIMATORS[values["estimator"]].critic
    whiten = _typed(whiten, bool, label("whiten"))
    return ExplainSpec(
        responses,
        values["gamma"],
        values["lam"],
        values["beta"],
        values["estimator"],
        values["kl_kind"],
        whiten,
        source,
    )


def _load_tokenizer(resp: ResponseSpec, path: str | None) -> Any:
    if path is None:
        raise GlassrlError(f"{resp.label('response')}: needs --tokenizer PATH (a local Hugging Face tokenizer)")
    if not Path(path).is_dir():
        raise GlassrlError(f"--tokenizer: not a directory: {path}")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise GlassrlError(f"--tokenizer: cannot load a tokenizer from {path}: {str(err).splitlines()[0]}") from None


def _tokenize(resp: ResponseSpec, tok: Any) -> None:
    """Split the response text into tokens; each token's text is its own decode."""
    if resp.tokens:
        raise GlassrlError(f"{resp.label('response')}: give the response text or its tokens, not both")
    resp.token_ids = tok(resp.response, add_special_tokens=False)["input_ids"]
    resp.tokens = [tok.decode([i]) for i in resp.token_ids]


def check(spec: ExplainSpec) -> None:
    """Lengths, missing values, what the estimator needs; raise GlassrlError naming the field."""
    from glassrl.algos.advantages import GROUP_ESTIMATORS, REQUIRED_INPUTS

    needed = REQUIRED_INPUTS[spec.estimator]
    for resp in spec.responses:
        n, lab = len(resp.tokens), resp.label
        if n == 0:
            raise GlassrlError(f"{lab('tokens')}: missing (give tokens, or response text with a tokenizer)")
        for key in LIST_KEYS + ("mask",):
            got = getattr(resp, key)
            if key != "step_scores" and got is not None and len(got) != n:
                raise GlassrlError(
                    f"{lab(key)}: expected {n} {'0/1 flags' if key == 'mask' else 'numbers'} "
                    f"(one per token), got {len(got)}"
                )
        _check_turns(resp, n)
        if resp.mask is not None and not any(resp.mask):
            raise GlassrlError(f"{lab('mask')}: no token is generated (all 0)")
        sources = [k for k in ("score", "token_scores", "step_scores") if getattr(resp, k) is not None]
        if not sources:
            raise GlassrlError(f"{lab('score')}: missing (or give token_scores, or step_ends with step_scores)")
        if len(sources) > 1:
            raise GlassrlError(f"{lab(sources[1])}: give only one of score, token_scores, step_scores")
        _check_steps(resp, n)
        if (resp.logprobs is None) != (resp.ref_logprobs is None):
            missing = "ref_logprobs" if resp.ref_logprobs is None else "logprobs"
            raise GlassrlError(f"{lab(missing)}: missing (log-prob pairs need both logprobs and ref_logprobs)")
        if resp.kl is not None and resp.logprobs is not None:
            raise GlassrlError(f"{lab('kl')}: give kl or the logprobs/ref_logprobs pair, not both")
        if resp.kl is None and resp.logprobs is None and spec.beta != 0:
            raise GlassrlError(f"{lab('kl')}: missing (β = {spec.beta:g} needs kl, or logprobs and ref_logprobs)")
        if "values" in needed and resp.values is None:
            raise GlassrlError(f"{lab('values')} is required by estimator {spec.estimator}")
        if "values" not in needed and resp.values is not None:
            raise GlassrlError(f"{lab('values')}: estimator {spec.estimator} has no critic; leave values out")
        if "baseline_rewards" in needed and resp.baseline_reward is None:
            raise GlassrlError(f"{lab('baseline_reward')} is required by estimator {spec.estimator}")
        if "step_end_mask" in needed and resp.step_ends is None:
            raise GlassrlError(f"{lab('step_ends')} is required by estimator {spec.estimator}")
    first = spec.responses[0]
    for key in ("kl", "logprobs", "values", "step_ends"):
        for resp in spec.responses[1:]:
            if (getattr(resp, key) is None) != (getattr(first, key) is None):
                holder = first if getattr(first, key) is not None else resp
                lacking = resp if holder is first else first
                raise GlassrlError(
                    f"{lacking.label(key)}: missing ({holder.label(key).split(': ')[-1]} has it; "
                    f"give {key} for every response or for none)"
                )
    if spec.estimator in GROUP_ESTIMATORS:
        _check_groups(spec)
    if spec.whiten:
        valid = sum(sum(r.mask) if r.mask is not None else len(r.tokens) for r in spec.responses)
        if valid < 2:
            raise GlassrlError(
                f"--whiten: whitening needs at least 2 generated tokens, the input has {valid} (use --no-whiten)"
            )


def _check_turns(resp: ResponseSpec, n: int) -> None:
    """Given turns: in order, inside the response, agreeing with the mask (which they give when it is
    missing); their observation defaults to the tokens up to the next turn. Without turns, a mask
    with 0s gives them: each run of generated tokens is a turn, the 0s after it its observation
    (finish reason tool_call, the last turn's the response's finish reason, else stop)."""
    if resp.turns is None:
        if resp.mask is None or all(resp.mask):
            return
        starts = [i for i in range(n) if resp.mask[i] and (i == 0 or not resp.mask[i - 1])]
        ends = [i + 1 for i in range(n) if resp.mask[i] and (i == n - 1 or not resp.mask[i + 1])]
        bounds = [*starts[1:], n]
        resp.turns = [
            {"start": s, "end": e, "observation_end": o, "tool_calls": [], "reward_parts": {}}
            | {"finish_reason": "tool_call" if o > e else resp.finish_reason or "stop"}
            for s, e, o in zip(starts, ends, bounds)
        ]
        return
    lab = resp.label("turns")
    if not resp.turns:
        raise GlassrlError(f"{lab}: empty (leave it out for a single-turn response)")
    previous = 0
    for k, turn in enumerate(resp.turns):
        following = resp.turns[k + 1]["start"] if k + 1 < len(resp.turns) else n
        turn.setdefault("observation_end", following)
        start, end, stop = turn["start"], turn["end"], turn["observation_end"]
        if not previous <= start < end <= stop <= following:
            raise GlassrlError(
                f"{lab}[{k}]: needs {previous} <= start < end <= observation_end <= {following} "
                f"(the next turn's start, or the {n} tokens), got start {start}, end {end}, observation_end {stop}"
            )
        previous = stop
        if turn["finish_reason"] is None:
            turn["finish_reason"] = "tool_call" if stop > end else resp.finish_reason or "stop"
    generated = [any(t["start"] <= i < t["end"] for t in resp.turns) for i in range(n)]
    if resp.mask is None:
        resp.mask = generated
    elif resp.mask != generated:
        i = next(i for i in range(n) if resp.mask[i] != generated[i])
        raise GlassrlError(
            f"{resp.label('mask')}: token {i} is {int(resp.mask[i])} but the turns make it "
            f"{'generated (1)' if generated[i] else 'an observation or outside every turn (0)'}"
        )


def _check_steps(resp: ResponseSpec, n: int) -> None:
    lab = resp.label
    if (resp.step_ends is None) != (resp.step_scores is None):
        missing = "step_scores" if resp.step_scores is None else "step_ends"
        raise GlassrlError(f"{lab(missing)}: missing (process rewards need step_ends and step_scores)")
    if resp.step_ends is None:
        return
    if len(resp.step_scores) != len(resp.step_ends):
        raise GlassrlError(
            f"{lab('step_scores')}: expected {len(resp.step_ends)} numbers (one per step end), "
            f"got {len(resp.step_scores)}"
        )
    for k, end in enumerate(resp.step_ends):
        if not 0 <= end < n:
            raise GlassrlError(f"{lab('step_ends')}[{k}]: token index {end} is outside the response [0, {n})")
        if resp.mask is not None and not resp.mask[end]:
            raise GlassrlError(f"{lab('step_ends')}[{k}]: token {end} is an observation token (mask 0)")
    if len(set(resp.step_ends)) != len(resp.step_ends):
        raise GlassrlError(f"{lab('step_ends')}: a token index appears twice")


def _check_groups(spec: ExplainSpec) -> None:
    counts: dict[int, int] = {}
    for resp in spec.responses:
        counts[resp.group or 0] = counts.get(resp.group or 0, 0) + 1
    for gid, count in counts.items():
        if count < 2:
            where = "--estimator" if spec.source == "explain" else f"{spec.source}: responses"
            raise GlassrlError(
                f"{where}: estimator {spec.estimator} compares the responses of a group, and group "
                f"{gid} has {count} response (give at least 2 per group in --input FILE)"
            )
