"""Observation tokens in the trainer's phases: whatever numbers sit on them, nothing that trains or is
logged changes, and no gradient reaches them (DESIGN §1, docs/agentic.md "Credit across observations").

Each case is a step of multi-turn responses whose observation spans (tool results, mask False,
in the context) fall at random places between generated spans. The step runs phases 4–5 (token
rewards with the KL in the reward, every advantage estimator, whitening), the step's tensor
metrics, and every loss term of the actor (every policy loss, the KL and entropy terms, the
positive-example NLL) and of the critic, each aggregated by every mode — once with the numbers
a model would give on the observation tokens, once with junk there (NaN, ±inf, huge). The
algos tests prove the same per function (tests/algos); this proves the wiring: the masks the
phases pass are the ones that leave observations out.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.algos.advantages import ADVANTAGE_ESTIMATORS
from glassrl.algos.aggregation import AGGREGATIONS, aggregate
from glassrl.algos.kl import kl_penalty
from glassrl.algos.losses import POLICY_LOSSES, PolicyLossParams
from glassrl.algos.off_policy import OFF_POLICY
from glassrl.data.records import PromptRecord
from glassrl.rewards.base import RewardResult
from glassrl.rl import phases
from glassrl.rl.config import AlgoConfig
from glassrl.rl.experience import Experience
from glassrl.rl.loss import actor_terms, critic_terms
from glassrl.rl.metrics import tensor_metrics
from glassrl.rl.update import actor_batch, critic_batch
from glassrl.rollout.base import ROLE_GENERATED, ROLE_OBSERVATION, RolloutBatch, Turn

F64 = torch.float64
JUNK = (float("nan"), float("inf"), -float("inf"), 1e30, -7.0)


@st.composite
def steps(draw):
    """(roles (B, T) int8, a seed): B = 2 groups of 2 responses, each generated / observation /
    generated … with spans of random lengths, then padding."""
    rows = []
    for _ in range(4):
        spans = draw(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 3)), min_size=1, max_size=3))
        row = []
        for generated, observed in spans:
            row += [ROLE_GENERATED] * generated + [ROLE_OBSERVATION] * observed
        rows.append(row)
    T = max(len(r) for r in rows) + draw(st.integers(0, 2))
    roles = torch.tensor([r + [0] * (T - len(r)) for r in rows], dtype=torch.int8)
    return roles, draw(st.integers(0, 2**16))


def _turns(row: list[int]) -> tuple[Turn, ...]:
    """The turns of a row of roles: each generated span, then the observation after it."""
    turns, i = [], 0
    while i < len(row) and row[i] == ROLE_GENERATED:
        start = i
        while i < len(row) and row[i] == ROLE_GENERATED:
            i += 1
        end = i
        while i < len(row) and row[i] == ROLE_OBSERVATION:
            i += 1
        turns.append(Turn(start, end, i, "tool_call" if i > end else "stop", "", "", (), {"valid_call": 0.1}))
    return tuple(turns)


def _experience(roles: torch.Tensor, seed: int, junk: float | None) -> tuple[Experience, dict]:
    """A scored step of ``roles``; the model outputs (log-probs, entropy, values, and a forward
    pass's new log-probs) random, with ``junk`` on observation tokens when given."""
    g = torch.Generator().manual_seed(seed)
    B, T = roles.shape
    mask, context = roles == ROLE_GENERATED, roles != 0
    observation = context & ~mask
    rollout = RolloutBatch(
        prompt_ids=torch.ones(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.bool),
        response_ids=torch.randint(2, 50, (B, T), generator=g),
        response_mask=mask,
        group_index=torch.tensor([0, 0, 1, 1]),
        finish_reasons=["stop"] * B,
        texts=["x"] * B,
        response_context_mask=context,
        turns=[_turns(row) for row in roles.tolist()],
    )
    records = [PromptRecord("p", None, {}, "test")] * 2
    results = [RewardResult.ok(float(s)) for s in torch.randint(0, 2, (B,), generator=g).tolist()]
    exp = phases.score(
        phases.Sampled(rollout, records, [[1], [1]], results),
        None,
        estimator="grpo",
        shapers=[],
        rollout=None,
        reward=None,
        max_new_tokens=T,
    )

    def model(scale: float = 1.0, low: float = -3.0) -> torch.Tensor:
        x = low + scale * torch.rand(B, T, generator=g, dtype=F64)
        return x if junk is None else torch.where(observation, torch.full_like(x, junk), x)

    exp.logprobs, exp.ref_logprobs, exp.entropy = model(), model(), model(2.0, 0.0)
    exp.kl = kl_penalty(exp.logprobs, exp.ref_logprobs, "k3")
    exp.values = model(2.0, -1.0)
    exp.token_scores = exp.token_scores.to(F64)
    exp.baseline_rewards = torch.rand(B, generator=g, dtype=F64)
    exp.step_end_mask = torch.zeros(B, T, dtype=torch.bool).scatter(
        1, torch.where(mask, torch.arange(T), -1).amax(-1, keepdim=True), True
    )
    forward = {"logprobs": model(), "entropy": model(2.0, 0.0), "values": model(2.0, -1.0)}
    return exp, forward


def _same(a, b) -> bool:
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return torch.equal(a, b)


def _losses(exp: Experience, forward: dict, mode: str) -> dict:
    """Every actor and critic term aggregated by ``mode``, and the gradients of their sum with
    respect to the forward pass's log-probs, entropy and values."""
    T = exp.response_mask.shape[1]
    out = {k: v.clone().requires_grad_(True) for k, v in forward.items()}
    micro = actor_batch(exp)
    values = {}
    for name in POLICY_LOSSES:
        terms = actor_terms(
            policy_loss=name,
            params=PolicyLossParams(),
            loss_agg=mode,
            norm_length=T,
            kl_in_loss="k3",
            kl_coef=0.1,
            entropy_coef=0.01,
            positive_nll_coef=0.1,
        )
        for term in terms:
            per_token, _ = term.per_token(out, micro)
            values[f"{name}/{term.name}"] = aggregate(per_token, term.mask(micro), term.mode, term.norm_length)
    critic = critic_batch(exp)
    for term in critic_terms(value_clip=0.2, loss_agg=mode, norm_length=T):
        per_token, _ = term.per_token(out, critic)
        values[term.name] = aggregate(per_token, term.mask(critic), term.mode, term.norm_length)
    torch.stack(list(values.values())).sum().backward()
    return {k: v.detach() for k, v in values.items()}, {k: v.grad for k, v in out.items()}


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(case=steps(), junk=st.sampled_from(JUNK), mode=st.sampled_from(sorted(AGGREGATIONS)))
def test_observation_tokens_change_nothing_and_get_no_gradient(case, junk, mode):
    roles, seed = case
    mask = roles == ROLE_GENERATED
    observation = (roles != 0) & ~mask
    for estimator in ADVANTAGE_ESTIMATORS:
        runs = []
        for j in (None, junk):
            exp, forward = _experience(roles, seed, j)
            phases.token_rewards(exp, 0.05, kl_in_reward=True)
            phases.advantages(exp, AlgoConfig(advantage=estimator, gamma=0.9, lam=0.8, whiten_advantages=True))
            runs.append((exp, forward))
        (clean, forward), (dirty, dirty_forward) = runs
        for name in ("token_rewards", "advantages", "returns", "deltas", "whitened_advantages"):
            a, b = getattr(clean, name), getattr(dirty, name)
            assert (a is None) == (b is None), name
            if a is not None:
                assert torch.equal(a, b), (estimator, name)
                assert (b[observation] == 0).all(), (estimator, name)
        metrics, dirty_metrics = tensor_metrics(clean), tensor_metrics(dirty)
        assert metrics.keys() == dirty_metrics.keys()
        assert all(_same(metrics[k], dirty_metrics[k]) for k in metrics), estimator
        losses, grads = _losses(clean, forward, mode)
        dirty_losses, dirty_grads = _losses(dirty, dirty_forward, mode)
        for key, value in dirty_losses.items():
            assert torch.isfinite(value), (estimator, key)
            torch.testing.assert_close(value, losses[key], rtol=0, atol=0)
        for key, grad in dirty_grads.items():
            assert torch.isfinite(grad).all() and (grad[observation] == 0).all(), (estimator, key)
            torch.testing.assert_close(grad, grads[key], rtol=0, atol=0)


def test_environment_rewards_sit_on_their_turns_last_generated_token():
    # roles: turn 0 = tokens 0-1, observation 2-3; turn 1 = token 4; then padding. Each turn has
    # valid_call 0.1 (as _turns writes), the outcome score 1 sits on the last generated token, 4.
    roles = torch.tensor([[1, 1, 2, 2, 1, 0]] * 4, dtype=torch.int8)
    exp, _ = _experience(roles, 0, None)
    expected = torch.tensor([0.0, 0.1, 0.0, 0.0, 0.1, 0.0], dtype=F64)
    for b, result_score in enumerate(exp.raw_scores.tolist()):
        want = expected.clone()
        want[4] += result_score
        torch.testing.assert_close(exp.token_scores[b], want)


@pytest.mark.slow
@settings(max_examples=20, deadline=None)
@given(
    case=steps(),
    junk=st.sampled_from(JUNK),
    mode=st.sampled_from(sorted(AGGREGATIONS)),
    correction=st.sampled_from([None, *sorted(OFF_POLICY)]),
)
def test_observation_tokens_change_nothing_on_the_asynchronous_path(case, junk, mode, correction):
    """Asynchronous training's extra numbers per token (glassrl.rl.phases.off_policy): the version that
    sampled each token, log μ, each correction's weights and masks, and without one the clip anchored
    at μ. Junk on observation tokens in all of them changes nothing and reaches no gradient."""
    roles, seed = case
    mask = roles == ROLE_GENERATED
    observation = (roles != 0) & ~mask
    runs = []
    for j in (None, junk):
        exp, forward = _experience(roles, seed, j)
        g = torch.Generator().manual_seed(seed + 1)
        mu = exp.logprobs + 0.3 * (torch.rand(exp.logprobs.shape, generator=g, dtype=F64) - 0.5)
        versions = torch.randint(3, 6, roles.shape, generator=g)
        if j is not None:
            mu = torch.where(observation, torch.full_like(mu, j), mu)
            versions = torch.where(observation, 10**9, versions)
        exp.rollout.rollout_logprobs = torch.where(mask, mu, 0.0) if j is None else mu
        exp.rollout.policy_versions = torch.where(mask, versions, -1) if j is None else versions
        phases.off_policy(exp, 5, None if correction is None else (correction, {}))
        phases.token_rewards(exp, 0.05, kl_in_reward=True)
        phases.advantages(exp, AlgoConfig(advantage="grpo", whiten_advantages=True))
        runs.append((exp, forward))
    (clean, forward), (dirty, dirty_forward) = runs
    assert dirty.staleness is not None and int(dirty.staleness.max()) <= 2 and (dirty.staleness[observation] == 0).all()
    assert torch.equal(clean.staleness, dirty.staleness) and dirty.bypass == (correction is None)
    if correction is not None:
        assert torch.equal(clean.correction.weights, dirty.correction.weights)
        assert (
            torch.equal(clean.correction.keep, dirty.correction.keep) and not dirty.correction.keep[observation].any()
        )
    metrics, dirty_metrics = tensor_metrics(clean), tensor_metrics(dirty)
    assert metrics.keys() == dirty_metrics.keys() and "rollout/staleness_max" in metrics
    assert all(_same(float(metrics[k]), float(dirty_metrics[k])) for k in metrics)
    losses, grads = _losses(clean, forward, mode)
    dirty_losses, dirty_grads = _losses(dirty, dirty_forward, mode)
    for key, value in dirty_losses.items():
        assert torch.isfinite(value), key
        torch.testing.assert_close(value, losses[key], rtol=0, atol=0)
    for key, grad in dirty_grads.items():
        assert torch.isfinite(grad).all() and (grad[observation] == 0).all(), key
        torch.testing.assert_close(grad, grads[key], rtol=0, atol=0)
