"""The reward control: train on a reward that means nothing, evaluate on the real one.

    results = control_results(results, kind="random", p=0.5, seed=cfg.seed, step=step)

Why: Shao et al. 2025 ("Spurious Rewards: Rethinking Training Signals in RLVR", arXiv:2506.10947,
§2.1 and Table 1) raised Qwen2.5-Math-7B by 21 points on MATH500 with *random* rewards — a coin
flip per response, "1 with probability γ", γ = 0.5 — so a held-out gain means little until it is
shown beside what a meaningless reward gives on the same model, data and seeds. ``reward.control``
makes the same run that control: the trainer's step scores its responses with reward.sources as
always, then replaces each outcome score by

- ``random``: 1 with probability ``reward.control_p``, else 0 (the paper's random reward), drawn from
  a generator seeded by (seed, step, response index) — a pure function of the run, so a resumed run
  draws the same coins without saving a generator;
- ``shuffled``: the step's real scores permuted across its responses (the same mean and spread,
  no bond between a response and its score; a permutation seeded the same way).

What stays real: the held-out evaluation (eval/…, scored by reward.sources as in any run: the figure
compared), the per-source metrics ``reward/<source>/mean``, ``task/accuracy`` (the sources' own
verdicts), and reward.gold. ``reward/mean`` is what the policy was trained on; the real combined score
is ``reward/control/real_mean`` (a result keeps its own in ``details["control"]``; the ledger shows what was
paid, and the run's config.yaml says it was a control). Failed scores (timeout, error) stay failures:
the control changes what is paid, not what ran. Process rewards are dropped (a coin has no steps), and
so are an environment's turn rewards (tool-add's valid_call: glassrl.rl.phases.without_turn_rewards);
ReMax (a greedy baseline scored by the real reward) and a teacher source (real per-token rewards) are
refused with a control.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from glassrl.rewards.base import RewardResult

Control = Literal["none", "random", "shuffled"]
CONTROLS: tuple[str, ...] = ("none", "random", "shuffled")


def _generator(seed: int, step: int, what: str) -> random.Random:
    # A str seed is hashed with SHA-512 (random.seed, version 2): the same on every machine and Python.
    return random.Random(f"glassrl-control:{seed}:{step}:{what}")


def control_line(kind: Control, p: float) -> str:
    """The start-up line of a control run."""
    paid = f"1 with probability {p:g}, else 0" if kind == "random" else "the step's real scores, permuted"
    return (
        f"reward: control {kind} (reward.control): trained on {paid}, not on what the sources say; eval/… "
        "is still scored by reward.sources — the figure to set beside a real run's (Shao et al. 2025)"
    )


def control_scores(scores: Sequence[float], kind: Control, p: float, seed: int, step: int) -> list[float]:
    """The scores a control pays for ``scores`` (the step's real ones, in response order)."""
    if kind == "random":
        rng = _generator(seed, step, "random")
        return [1.0 if rng.random() < p else 0.0 for _ in scores]
    if kind == "shuffled":
        order = list(range(len(scores)))
        _generator(seed, step, "shuffled").shuffle(order)
        return [float(scores[j]) for j in order]
    return [float(s) for s in scores]


def control_results(
    results: Sequence[RewardResult], kind: Control, p: float, seed: int, step: int
) -> list[RewardResult]:
    """``results`` with each ``ok`` score replaced by the control's (see the module docstring); the real
    score kept in ``details["control"] = {"kind", "real"}``. ``none`` returns them unchanged."""
    if kind == "none":
        return list(results)
    ok = [i for i, r in enumerate(results) if r.is_ok]
    paid = control_scores([results[i].score for i in ok], kind, p, seed, step)
    out = list(results)
    for i, score in zip(ok, paid, strict=True):
        real = results[i]
        details = {**real.details, "control": {"kind": kind, "real": real.score}}
        out[i] = replace(real, score=score, process_rewards=(), details=details)
    return out


def real_results(results: Sequence[RewardResult]) -> list[RewardResult]:
    """``results`` with each controlled score put back to the real one (for verdicts such as task/accuracy)."""
    return [replace(r, score=r.details["control"]["real"]) if "control" in r.details else r for r in results]


def real_mean(results: Sequence[RewardResult]) -> float:
    """The mean real combined score of the ``ok`` results a control paid (NaN when none)."""
    real = [r.details["control"]["real"] for r in results if r.is_ok and "control" in r.details]
    return sum(real) / len(real) if real else float("nan")
