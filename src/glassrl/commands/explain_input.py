"""Inputs of ``glassrl explain``: command-line flags or a JSON/YAML file, checked.

The file's layout is the dataclasses below (:class:`ExplainInput`, its :class:`GivenResponse`
list, their :class:`GivenTurn`); the flags of one response fill the same, and both are typed
by the config loader (glassrl.config.build). Every problem is a :class:`GlassrlError` whose
message names the flag (``--values: expected 6 numbers (one per token), got 5``) or the file
and field (``x.json: responses[1].score: missing``). The checked :class:`ExplainInput` goes
to glassrl.ledger.compute.from_given (glassrl.commands.explain.build_ledger).

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
import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from glassrl.config import Origin, build, coerce, safe_load, yaml_error
from glassrl.errors import GlassrlError
from glassrl.jsonl import TooDeep, load_json, read_utf8

PARAM_KEYS = ("gamma", "lam", "beta", "estimator", "kl_kind", "whiten")  # the parameter flags
LIST_KEYS = ("token_scores", "step_scores", "kl", "logprobs", "ref_logprobs", "values")  # floats, one per token


@dataclass
class GivenTurn:
    """A turn of a multi-turn response (file only): generated tokens [start, end), then its
    observation [end, observation_end); the rest as glassrl.rollout.base.Turn records it."""

    start: int
    end: int
    observation_end: int | None = None  # default: the next turn's start (the response's end for the last)
    finish_reason: str | None = None  # default: tool_call when an observation follows, else the response's
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reward_parts: dict[str, float] = field(default_factory=dict)  # on the turn's last generated token


@dataclass
class GivenResponse:
    """One response, as given: per-token lists have one entry per token (checked)."""

    prompt: str | None = None  # default: the file's prompt
    tokens: list[str] = field(default_factory=list)
    response: str | None = None  # the text instead of tokens: split by the tokenizer
    score: float | None = None  # outcome score, on the last generated token
    token_scores: list[float] | None = None
    step_ends: list[int] | None = None  # process rewards: token index of each step end
    step_scores: list[float] | None = None
    kl: list[float] | None = None
    logprobs: list[float] | None = None
    ref_logprobs: list[float] | None = None
    values: list[float] | None = None
    mask: list[int | bool] | None = None  # 1 = generated, 0 = tool/observation token; bools once checked
    group: int | None = None
    baseline_reward: float | None = None
    finish_reason: str | None = None
    turns: list[GivenTurn] | None = None  # multi-turn (derived from a mask with 0s when not given)
    token_ids: list[int] | None = field(default=None, init=False)  # the tokenizer's, for response text


@dataclass
class ExplainInput:
    """Checked inputs of one explain call: an input file's layout (its keys in this order)."""

    gamma: float = 1.0
    lam: float = 1.0
    beta: float = 0.0
    estimator: str = "gae"
    kl_kind: str = "k1"
    whiten: bool | None = None  # default: on for gae (as PPO)
    prompt: str = ""
    tokenizer: str | None = None  # relative to the file
    responses: list[GivenResponse] = field(default_factory=list)
    # the input file, or "explain" (flags): prefixes the errors of the math (glassrl.commands.explain)
    source: str = field(default="explain", init=False)


class _Given(Origin):
    """Where each input came from, in its errors' words: ``labels`` names a top-level key's source
    ("--gamma", "RUN/config.yaml: algo.gamma"); other keys are the file's ("x.json: responses[0].kl"),
    or without a file one response's flags ("--kl")."""

    def __init__(self, file: Path | None, labels: dict[str, str]) -> None:
        super().__init__(str(file) if file is not None else "explain")
        self.path, self.labels = file, labels

    def label(self, key: str) -> str:
        top = re.match(r"[^.\[]*", key)[0]  # type: ignore[index]
        if top in self.labels:
            return self.labels[top] + key[len(top) :]
        if self.path is None:
            return _flag(key.removeprefix("responses[0]."))
        return f"{self.path}: {key}"

    def invalid(self, key: str, expected: str, value: Any) -> GlassrlError:
        return GlassrlError(f"{self.label(key)}: expected {expected}, got {value!r}")

    def not_finite(self, key: str, value: Any, number: float | int) -> GlassrlError:
        # NaN or ±inf would run through every formula and print as numbers
        return GlassrlError(f"{self.label(key)}: expected a finite number, got {value!r:.40}")

    def unknown(self, prefix: str, key: Any, fields: list[str], hint: str | None) -> GlassrlError:
        where = self.label(prefix.removesuffix(".")) if prefix else str(self.path)
        return GlassrlError(f"{where}: unknown key {key!r}; valid keys: {', '.join(fields)}")

    def missing(self, key: str) -> GlassrlError:
        return GlassrlError(f"{self.label(key)}: missing")


def _flag(key: str) -> str:
    return f"--{key.replace('_', '-')}"


# Flags of the two modes: a model computes the numbers (--model), or the user gives them.
MODEL_ONLY = ("sample", "seed", "reward", "answer", "reference")
NOT_WITH_MODEL = (
    "input",
    "tokenizer",
    "tokens",
    "score",
    "token_scores",
    "step_ends",
    "step_scores",
    "kl",
    "logprobs",
    "ref_logprobs",
    "values",
    "mask",
    "baseline_reward",
)


def check_model_flags(args: argparse.Namespace) -> None:
    """A flag of the other mode (model-computed vs given numbers): GlassrlError naming it."""
    if args.model is None:
        given = [k for k in MODEL_ONLY if getattr(args, k) is not None]
        if given:
            raise GlassrlError(f"{_flag(given[0])}: needs --model (a model that computes the numbers)")
        return
    given = [k for k in NOT_WITH_MODEL if getattr(args, k) is not None]
    if given:
        raise GlassrlError(
            f"{_flag(given[0])}: cannot be combined with --model (the model computes the numbers "
            "from --prompt and --response or --sample)"
        )


def from_args(args: argparse.Namespace) -> ExplainInput:
    """Read flags (and the --input file), tokenise, check; raise GlassrlError naming the culprit."""
    labels: dict[str, str] = {}
    path = None if args.input is None else Path(args.input)
    flags = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(GivenResponse) if f.init}
    flags = {key: value for key, value in flags.items() if value is not None}
    if path is not None:
        if flags:
            raise GlassrlError(f"{_flag(next(iter(flags)))}: cannot be combined with --input (put it in the file)")
        data = _read(path)
    else:
        for key in ("step_ends", "mask"):  # integers, which argparse gives as text
            if key in flags:
                flags[key] = [integer(v, f"{_flag(key)}[{i}]") for i, v in enumerate(flags[key])]
        data = {"responses": [flags]}
    for key in PARAM_KEYS:
        if getattr(args, key) is not None:
            data[key], labels[key] = getattr(args, key), _flag(key)
    given = _Given(path, labels)
    spec = build(ExplainInput, data, given)
    if not spec.responses:
        raise GlassrlError(f"{path}: responses: missing (a list with at least one response)")
    if path is not None:
        spec.source = str(path)
    tokenizer = args.tokenizer
    if tokenizer is None and spec.tokenizer is not None:
        tokenizer = str(path.parent / spec.tokenizer)  # type: ignore[union-attr]
    for resp in spec.responses:
        if resp.prompt is None:
            resp.prompt = spec.prompt
    check_params(spec, given.label)
    texts = [b for b, resp in enumerate(spec.responses) if resp.response is not None]
    if texts:
        tok = _load_tokenizer(given.label(f"responses[{texts[0]}].response"), tokenizer)
        for b in texts:
            _tokenize(spec.responses[b], tok, given.label(f"responses[{b}].response"))
    check(spec, given)
    return spec


def params(data: dict[str, Any], labels: dict[str, str]) -> ExplainInput:
    """γ, λ, β, estimator, KL kind, whitening from ``data`` (over the defaults), checked; errors
    name ``labels[key]`` (else the flag)."""
    given = _Given(None, labels)
    spec = build(ExplainInput, data, given)
    check_params(spec, given.label)
    return spec


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise GlassrlError(f"--input: file not found: {path}")
    text = read_utf8(path)
    try:
        data = load_json(text) if path.suffix == ".json" else safe_load(text)
    except json.JSONDecodeError as err:
        raise GlassrlError(f"{path}:{err.lineno}: not valid JSON: {err.msg}") from None
    except TooDeep as err:
        raise GlassrlError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        raise GlassrlError(f"{path}: not valid YAML: {yaml_error(err)}") from None
    if not isinstance(data, dict):
        raise GlassrlError(f"{path}: the top level must be a mapping with a 'responses' list")
    return data


def integer(value: Any, label: str) -> int:
    """An int from a flag's string; GlassrlError naming ``label`` otherwise."""
    try:
        return int(value)
    except ValueError:
        raise GlassrlError(f"{label}: expected an integer, got {value!r}") from None


def check_params(spec: ExplainInput, label) -> None:
    """γ, λ in [0, 1], β ≥ 0, a known estimator and KL estimator; whitening's default. Errors
    name ``label(key)``."""
    from glassrl.algos.advantages import ADVANTAGE_ESTIMATORS
    from glassrl.algos.kl import KL_ESTIMATORS

    for key in ("gamma", "lam"):
        x = getattr(spec, key)
        if not 0.0 <= x <= 1.0:
            raise GlassrlError(f"{label(key)}: must be in [0, 1], got {x:g}")
    if spec.beta < 0:
        raise GlassrlError(f"{label('beta')}: must be ≥ 0, got {spec.beta:g}")
    for key, valid in (("estimator", ADVANTAGE_ESTIMATORS), ("kl_kind", KL_ESTIMATORS)):
        if getattr(spec, key) not in valid:
            raise GlassrlError(f"{label(key)}: unknown {getattr(spec, key)!r}; valid: {', '.join(valid)}")
    if spec.whiten is None:
        # PPO implementations whiten GAE advantages (OpenAI baselines ppo2; verl
        # compute_gae_advantage_return + masked_whiten); the critic-free estimators
        # normalise by their group or whiten inside the estimator (REINFORCE++).
        spec.whiten = ADVANTAGE_ESTIMATORS[spec.estimator].critic


def _load_tokenizer(label: str, path: str | None) -> Any:
    if path is None:
        raise GlassrlError(f"{label}: needs --tokenizer PATH (a local Hugging Face tokenizer)")
    if not Path(path).is_dir():
        raise GlassrlError(f"--tokenizer: not a directory: {path}")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise GlassrlError(f"--tokenizer: cannot load a tokenizer from {path}: {str(err).splitlines()[0]}") from None


def _tokenize(resp: GivenResponse, tok: Any, label: str) -> None:
    """Split the response text into tokens; each token's text is its own decode."""
    if resp.tokens:
        raise GlassrlError(f"{label}: give the response text or its tokens, not both")
    resp.token_ids = tok(resp.response, add_special_tokens=False)["input_ids"]
    resp.tokens = [tok.decode([i]) for i in resp.token_ids]


def check(spec: ExplainInput, given: _Given) -> None:
    """Lengths, missing values, what the estimator needs; raise GlassrlError naming the field."""
    from glassrl.algos.advantages import GROUP_ESTIMATORS, REQUIRED_INPUTS

    needed = REQUIRED_INPUTS[spec.estimator]
    labels = []
    for b, resp in enumerate(spec.responses):
        n = len(resp.tokens)

        def lab(key: str, b: int = b) -> str:
            return given.label(f"responses[{b}].{key}")

        labels.append(lab)
        if n == 0:
            raise GlassrlError(f"{lab('tokens')}: missing (give tokens, or response text with a tokenizer)")
        if resp.mask is not None:
            bad = next((i for i, v in enumerate(resp.mask) if v not in (0, 1)), None)
            if bad is not None:
                raise GlassrlError(f"{lab('mask')}: expected 0 or 1 at position {bad}, got {resp.mask[bad]}")
            resp.mask = [bool(v) for v in resp.mask]
        for key in LIST_KEYS + ("mask",):
            got = getattr(resp, key)
            if key != "step_scores" and got is not None and len(got) != n:
                raise GlassrlError(
                    f"{lab(key)}: expected {n} {'0/1 flags' if key == 'mask' else 'numbers'} "
                    f"(one per token), got {len(got)}"
                )
        _check_turns(resp, n, f"responses[{b}]", given)
        if resp.mask is not None and not any(resp.mask):
            raise GlassrlError(f"{lab('mask')}: no token is generated (all 0)")
        sources = [k for k in ("score", "token_scores", "step_scores") if getattr(resp, k) is not None]
        if not sources:
            raise GlassrlError(f"{lab('score')}: missing (or give token_scores, or step_ends with step_scores)")
        if len(sources) > 1:
            raise GlassrlError(f"{lab(sources[1])}: give only one of score, token_scores, step_scores")
        _check_steps(resp, n, lab)
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
        for b, resp in enumerate(spec.responses[1:], start=1):
            if (getattr(resp, key) is None) != (getattr(first, key) is None):
                holder, lacking = (0, b) if getattr(first, key) is not None else (b, 0)
                raise GlassrlError(
                    f"{labels[lacking](key)}: missing ({labels[holder](key).split(': ')[-1]} has it; "
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


def _check_turns(resp: GivenResponse, n: int, where: str, given: _Given) -> None:
    """Given turns: in order, inside the response, agreeing with the mask (which they give when it is
    missing); their observation defaults to the tokens up to the next turn; their reward parts are
    numbers. Without turns, a mask with 0s gives them: each run of generated tokens is a turn, the
    0s after it its observation (finish reason tool_call, the last turn's the response's finish
    reason, else stop)."""
    if resp.turns is None:
        if resp.mask is None or all(resp.mask):
            return
        starts = [i for i in range(n) if resp.mask[i] and (i == 0 or not resp.mask[i - 1])]
        ends = [i + 1 for i in range(n) if resp.mask[i] and (i == n - 1 or not resp.mask[i + 1])]
        bounds = [*starts[1:], n]
        resp.turns = [
            GivenTurn(s, e, o, "tool_call" if o > e else resp.finish_reason or "stop")
            for s, e, o in zip(starts, ends, bounds)
        ]
        return
    lab = given.label
    if not resp.turns:
        raise GlassrlError(f"{lab(where + '.turns')}: empty (leave it out for a single-turn response)")
    previous = 0
    for k, turn in enumerate(resp.turns):
        following = resp.turns[k + 1].start if k + 1 < len(resp.turns) else n
        if turn.observation_end is None:
            turn.observation_end = following
        start, end, stop = turn.start, turn.end, turn.observation_end
        if not previous <= start < end <= stop <= following:
            raise GlassrlError(
                f"{lab(f'{where}.turns[{k}]')}: needs {previous} <= start < end <= observation_end <= {following} "
                f"(the next turn's start, or the {n} tokens), got start {start}, end {end}, observation_end {stop}"
            )
        previous = stop
        if not turn.finish_reason:
            turn.finish_reason = "tool_call" if stop > end else resp.finish_reason or "stop"
        parts = f"{where}.turns[{k}].reward_parts"
        turn.reward_parts = {
            str(name): coerce(float, x, f"{parts}.{name}", given) for name, x in turn.reward_parts.items()
        }
    generated = [any(t.start <= i < t.end for t in resp.turns) for i in range(n)]
    if resp.mask is None:
        resp.mask = generated
    elif resp.mask != generated:
        i = next(i for i in range(n) if resp.mask[i] != generated[i])
        raise GlassrlError(
            f"{lab(where + '.mask')}: token {i} is {int(resp.mask[i])} but the turns make it "
            f"{'generated (1)' if generated[i] else 'an observation or outside every turn (0)'}"
        )


def _check_steps(resp: GivenResponse, n: int, lab) -> None:
    if (resp.step_ends is None) != (resp.step_scores is None):
        missing = "step_scores" if resp.step_scores is None else "step_ends"
        raise GlassrlError(f"{lab(missing)}: missing (process rewards need step_ends and step_scores)")
    if resp.step_ends is None or resp.step_scores is None:
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


def _check_groups(spec: ExplainInput) -> None:
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
