"""Ledgers computed, and the one sequence of phases 4–5 that computes their credit columns.

    from_experience(exp, tokenizer, ...)   the trainer's ledger samples, ``glassrl explain --model``
    from_given(responses, ...)             ``glassrl explain`` with given scores, KL, values, …
    token_rewards(token_scores, kl, ...)   phase 4: r_i = score_i − β·kl_i
    credit(estimator, token_rewards, ...)  phase 5: A, R, δ, whitened A

The ledger sits just above glassrl.algos (DESIGN §2), so this module imports no trainer,
data or command: it reads an Experience (glassrl.rl.experience) and explain's given
responses (glassrl.commands.explain_input) by the attributes of the protocols below.
Shapes: ``B`` responses, ``T`` padded response length, ``S`` steps of a response.

Phases 4 and 5 live here, once, as functions over tensors: the trainer's step
(glassrl.rl.phases.token_rewards and .advantages, which fill an Experience) and
:func:`from_given` both call them, so the numbers ``glassrl explain`` prints for given
inputs are the trainer's by construction. Here, because this is the lowest layer both can
import (rl sits above the ledger); not in glassrl.algos, because the sequence decides on the
host what the formulas there leave to their caller (which rows train, which inputs the
estimator reads, whether there are 2 tokens to whiten), and algos holds the formulas only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import torch

from glassrl.algos.advantages import REQUIRED_INPUTS, AdvantageInputs, AdvantageParams, compute_advantages, td_errors
from glassrl.algos.kl import kl_penalty
from glassrl.algos.masked import masked_whiten
from glassrl.algos.token_rewards import assemble_token_rewards, place_outcome_scores, place_process_rewards
from glassrl.ledger.model import Ledger, LedgerTurn


class ExperienceLike(Protocol):
    """What :func:`from_experience` reads of a glassrl.rl.experience.Experience."""

    # RolloutBatch: prompt_ids (B, P), prompt_mask (B, P), response_ids (B, T), group_index (B,),
    # context_lengths, token_roles, turns, texts, select
    rollout: Any
    prompts: list[str]
    response_mask: torch.Tensor
    scores: torch.Tensor
    token_scores: torch.Tensor
    step_end_mask: torch.Tensor | None
    baseline_rewards: torch.Tensor | None
    logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    kl: torch.Tensor | None
    values: torch.Tensor | None
    token_rewards: torch.Tensor | None
    deltas: torch.Tensor | None
    advantages: torch.Tensor | None
    returns: torch.Tensor | None
    whitened_advantages: torch.Tensor | None

    @property
    def reward_beta(self) -> float: ...


def from_experience(
    exp: ExperienceLike,
    tokenizer,
    *,
    estimator: str,
    gamma: float,
    lam: float,
    kl_kind: str,
    step: int | None = None,
    samples: int | None = None,
) -> Ledger:
    """The first ``samples`` responses of ``exp`` (all when None), every token: a multi-turn
    response's generated and observation tokens of every turn, with their roles and turns; a
    token another policy sampled, its version, staleness, log μ and algo.off_policy's decision.
    Each response holds its prompt twice: ``prompt``, the text the rewards read (what ``glassrl
    explain --prompt`` takes), and ``prompt_as_seen``, s_0 exactly as the policy saw it: its ids
    decoded (the tokenizer's special tokens, an agentic run's tools described by its call format).

    ``estimator``, ``gamma``, ``lam``, ``kl_kind`` are the run's; the ledger records λ only
    when the step had values (λ belongs to GAE) and the KL estimator only when a KL was
    estimated. β is the one in the token rewards (0 unless the KL is in the reward).
    ``tokenizer.decode`` gives each token's text.
    """
    k = len(exp.rollout) if samples is None else min(samples, len(exp.rollout))
    rollout = exp.rollout.select(torch.arange(k))
    pick = lambda t: None if t is None else t[:k]  # noqa: E731
    correction = getattr(exp, "correction", None)  # algo.off_policy's weights and keep (glassrl.rl.phases.off_policy)
    return Ledger.from_tensors(
        prompts=list(exp.prompts[:k]),
        prompts_as_seen=[
            tokenizer.decode(ids[mask].tolist()) for ids, mask in zip(rollout.prompt_ids, rollout.prompt_mask)
        ],
        token_texts=[[tokenizer.decode([t]) for t in row.tolist()] for row in rollout.response_ids],
        response_mask=pick(exp.response_mask),
        estimator=estimator,
        gamma=gamma,
        lam=lam if exp.values is not None else None,
        beta=exp.reward_beta,
        kl_kind=kl_kind if exp.kl is not None else None,
        token_ids=rollout.response_ids,
        logprobs=pick(exp.logprobs),
        ref_logprobs=pick(exp.ref_logprobs),
        kl=pick(exp.kl),
        token_scores=pick(exp.token_scores),
        token_rewards=pick(exp.token_rewards),
        values=pick(exp.values),
        deltas=pick(exp.deltas),
        advantages=pick(exp.advantages),
        returns=pick(exp.returns),
        whitened_advantages=pick(exp.whitened_advantages),
        step_end_mask=pick(exp.step_end_mask),
        scores=pick(exp.scores),
        group_ids=rollout.group_index,
        baseline_rewards=pick(exp.baseline_rewards),
        lengths=rollout.context_lengths,  # every real token: a multi-turn response's observations and later turns too
        finish_reasons=rollout.finish_reasons,
        responses=rollout.texts,
        step=step,
        token_roles=rollout.token_roles,
        turns=rollout.turns,
        policy_versions=rollout.policy_versions,
        staleness=pick(getattr(exp, "staleness", None)),
        rollout_logprobs=rollout.rollout_logprobs,
        is_weights=None if correction is None else correction.weights[:k],
        is_keep=None if correction is None else correction.keep[:k],
    )


class GivenTurn(Protocol):
    """What :func:`from_given` reads of one turn of a given response (checked: every field set)."""

    start: int
    end: int
    observation_end: int
    finish_reason: str
    tool_calls: list[dict[str, Any]]
    reward_parts: dict[str, float]


class GivenResponse(Protocol):
    """What :func:`from_given` reads of one given response (glassrl.commands.explain_input.GivenResponse).

    Per-token lists have one entry per token; ``kl``, ``logprobs``/``ref_logprobs`` and
    ``values`` are given for every response or for none.
    """

    prompt: str
    tokens: list[str]
    token_ids: list[int] | None
    response: str | None
    score: float | None
    token_scores: list[float] | None
    step_ends: list[int] | None
    step_scores: list[float] | None
    kl: list[float] | None
    logprobs: list[float] | None
    ref_logprobs: list[float] | None
    values: list[float] | None
    mask: list[bool] | None
    group: int | None
    baseline_reward: float | None
    finish_reason: str | None
    turns: Sequence[GivenTurn] | None  # multi-turn


def from_given(
    resps: Sequence[GivenResponse],
    *,
    estimator: str,
    gamma: float,
    lam: float,
    beta: float,
    kl_kind: str,
    whiten: bool,
) -> Ledger:
    """Token rewards, advantages, returns (and δ, whitened A) of given responses, as the trainer
    computes them: its placement of scores (phase 2), then :func:`token_rewards` and
    :func:`credit` (phases 4 and 5). An input the estimator cannot use is a ValueError
    (glassrl.algos), for the caller to name."""
    dt = torch.float64  # the printed digits are the arithmetic's, not fp32 noise
    B, T = len(resps), max(len(r.tokens) for r in resps)

    def pad(key: str, fill: float = 0.0, dtype: torch.dtype = dt) -> torch.Tensor | None:
        rows = [getattr(r, key) for r in resps]
        if any(row is None for row in rows):  # explain_input made values, KL, log-probs all-or-none
            return None
        return torch.tensor([list(row) + [fill] * (T - len(row)) for row in rows], dtype=dtype)  # (B, T)

    lengths = torch.tensor([len(r.tokens) for r in resps])  # (B,)
    inside = torch.arange(T).expand(B, T) < lengths.unsqueeze(1)  # (B, T)
    given_mask = torch.tensor([(r.mask or [True] * len(r.tokens)) + [False] * (T - len(r.tokens)) for r in resps])
    mask = inside & given_mask  # (B, T)

    has_score = torch.tensor([r.score is not None for r in resps])  # (B,)
    scores = torch.tensor([r.score if r.score is not None else 0.0 for r in resps], dtype=dt)  # (B,)
    token_scores = torch.where(
        has_score.unsqueeze(1),
        place_outcome_scores(scores, mask),
        torch.tensor(
            [(r.token_scores or [0.0] * len(r.tokens)) + [0.0] * (T - len(r.tokens)) for r in resps], dtype=dt
        ),
    )  # (B, T)
    step_end_mask = None
    if resps[0].step_ends is not None:
        S = max(len(r.step_ends) for r in resps)
        ends = torch.tensor([r.step_ends + [0] * (S - len(r.step_ends)) for r in resps])  # (B, S)
        step_scores = torch.tensor([r.step_scores + [0.0] * (S - len(r.step_scores)) for r in resps], dtype=dt)
        step_valid = torch.arange(S).expand(B, S) < torch.tensor([[len(r.step_ends)] for r in resps])  # (B, S)
        token_scores = token_scores + place_process_rewards(step_scores, ends, step_valid, T)
        step_end_mask = place_process_rewards(torch.ones(B, S, dtype=dt), ends, step_valid, T) > 0  # (B, T)
    turns = [
        None
        if r.turns is None
        else [
            LedgerTurn(
                t.start,
                t.end,
                t.observation_end,
                t.finish_reason,
                tuple(t.tool_calls),
                dict(t.reward_parts),
                str(getattr(t, "error", "")),
            )
            for t in r.turns
        ]
        for r in resps
    ]
    turn_scores, turn_ends = turn_rewards(turns, T, dt)
    token_scores = token_scores + turn_scores  # a turn's environment rewards, as the trainer places them
    if step_end_mask is not None:
        step_end_mask = step_end_mask | turn_ends

    logprobs, ref_logprobs = pad("logprobs"), pad("ref_logprobs")
    kl = kl_penalty(logprobs, ref_logprobs, kl_kind) if logprobs is not None else pad("kl")
    rewards = token_rewards(token_scores, kl, beta, mask)
    values = pad("values")
    grouped = "group_index" in REQUIRED_INPUTS[estimator] or any(r.group is not None for r in resps)
    group_index = torch.tensor([r.group or 0 for r in resps]) if grouped else None  # (B,)
    baselines = [r.baseline_reward for r in resps]
    baseline_rewards = None if None in baselines else torch.tensor(baselines, dtype=dt)  # (B,)
    out = credit(
        estimator,
        rewards,
        mask,
        AdvantageParams(gamma=gamma, lam=lam),
        values=values,
        group_index=group_index,
        baseline_rewards=baseline_rewards,
        step_end_mask=step_end_mask,
        whiten=whiten,
    )
    uses_lam = "values" in REQUIRED_INPUTS[estimator]  # λ belongs to GAE, the critic's estimator
    return Ledger.from_tensors(
        prompts=[r.prompt for r in resps],
        token_texts=[r.tokens for r in resps],
        response_mask=mask,
        estimator=estimator,
        gamma=gamma,
        lam=lam if uses_lam else None,
        beta=beta,
        kl_kind=kl_kind if logprobs is not None else None,
        token_ids=pad("token_ids", 0, torch.long),
        logprobs=logprobs,
        ref_logprobs=ref_logprobs,
        kl=kl,
        token_scores=token_scores,
        token_rewards=rewards,
        values=values,
        deltas=out.deltas,
        advantages=out.advantages,
        returns=out.returns,
        whitened_advantages=out.whitened_advantages,
        step_end_mask=step_end_mask,
        scores=None if None in [r.score for r in resps] else scores,
        group_ids=group_index,
        baseline_rewards=baseline_rewards,
        lengths=lengths,
        finish_reasons=[r.finish_reason for r in resps],
        responses=[r.response if r.response is not None else "".join(r.tokens) for r in resps],
        turns=turns,
    )


def turn_rewards(
    turns: Sequence[Sequence[Any] | None], T: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards (B, T), where (B, T) bool): each turn's ``reward_parts``, summed, on the turn's last
    generated token ``end − 1`` (``turns[b]``: objects with start, end, reward_parts; None for a
    single-turn response). The trainer's placement of an environment's rewards
    (glassrl.rl.phases.turn_rewards), for given responses."""
    B = len(turns)
    S = max([len(t) for t in turns if t is not None] + [1])
    ends = torch.zeros((B, S), dtype=torch.long)
    rewards = torch.zeros((B, S), dtype=dtype)
    valid = torch.zeros((B, S), dtype=torch.bool)
    for b, response in enumerate(turns):
        for k, turn in enumerate(response or ()):
            if turn.reward_parts and turn.end > turn.start:
                ends[b, k], rewards[b, k], valid[b, k] = turn.end - 1, sum(turn.reward_parts.values()), True
    where = torch.zeros((B, T), dtype=torch.bool).scatter(1, ends, valid)  # (B, T)
    return place_process_rewards(rewards, ends, valid, T), where


# ---------------------------------------------------------------- phases 4 and 5


class Credit(NamedTuple):
    """Phase 5's outputs, (B, T) each and 0 off the training tokens."""

    advantages: torch.Tensor  # A_i, the estimator's raw output
    returns: torch.Tensor  # R_i (A_i + V(s_i) under GAE, raw A)
    deltas: torch.Tensor | None  # δ_i = r_i + γ·V(s_{i+1}) − V(s_i); None without values
    whitened_advantages: torch.Tensor | None  # what the policy loss sees; None when not whitened


def token_rewards(
    token_scores: torch.Tensor, kl: torch.Tensor | None, beta: float, response_mask: torch.Tensor
) -> torch.Tensor:
    """Phase 4: r_i = token_scores_i − β·kl_i on training tokens, 0 elsewhere (B, T); without a
    KL estimate (``kl`` None) r_i = token_scores_i (glassrl.algos.token_rewards)."""
    kl = torch.zeros_like(token_scores) if kl is None else kl
    return assemble_token_rewards(token_scores, kl, beta, response_mask)


def credit(
    estimator: str,
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    params: AdvantageParams,
    *,
    values: torch.Tensor | None = None,
    group_index: torch.Tensor | None = None,
    baseline_rewards: torch.Tensor | None = None,
    step_end_mask: torch.Tensor | None = None,
    whiten: bool,
) -> Credit:
    """Phase 5: advantages and returns of ``token_rewards`` (B, T) by ``estimator``; δ with
    ``values`` (B, T); whitened advantages when ``whiten`` and the batch has 2 training tokens.

    The estimator runs on the rows that train only (a row without a training token, e.g. a failed
    score, gets 0 and stays out of every group baseline and batch statistic) and reads the
    optional inputs it requires (glassrl.algos.advantages.REQUIRED_INPUTS; ``group_index`` (B,),
    ``baseline_rewards`` (B,), ``step_end_mask`` (B, T)); one it lacks is glassrl.algos'
    ValueError. Whitening is PPO's (verl masked_whiten: unbiased variance over every valid token).
    """
    optional = {
        "values": values,
        "group_index": group_index,
        "baseline_rewards": baseline_rewards,
        "step_end_mask": step_end_mask,
    }
    rows = response_mask.any(-1).nonzero().flatten()  # (K,)
    advantages = torch.zeros_like(token_rewards)
    returns = torch.zeros_like(token_rewards)
    if len(rows):
        needed = {name: optional[name] for name in REQUIRED_INPUTS.get(estimator, ())}
        inputs = AdvantageInputs(
            token_rewards=token_rewards[rows],
            response_mask=response_mask[rows],
            **{name: None if x is None else x[rows] for name, x in needed.items()},
        )
        out = compute_advantages(estimator, inputs, params)
        advantages = advantages.index_copy(0, rows, out.advantages)
        returns = returns.index_copy(0, rows, out.returns)
    deltas = td_errors(token_rewards, values, response_mask, params.gamma) if values is not None else None
    whitened = masked_whiten(advantages, response_mask) if whiten and int(response_mask.sum()) >= 2 else None
    return Credit(advantages, returns, deltas, whitened)
