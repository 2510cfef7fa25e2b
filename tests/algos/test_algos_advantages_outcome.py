"""Critic-free estimators and the registry: hand tables, errors, invariants."""

import dataclasses
import functools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    GROUP_ESTIMATORS,
    AdvantageInputs,
    AdvantageParams,
    compute_advantages,
)
from glassrl.algos.masked import masked_mean, masked_var

F64 = torch.float64
NAMES = [
    "gae",
    "grpo",
    "dr_grpo",
    "grpo_process",
    "rloo",
    "remax",
    "reinforce_pp",
    "reinforce_pp_baseline",
]


def _outcome(scores, lengths, T=3):
    """token_rewards with each score on the row's last valid token; right padding."""
    mask = torch.arange(T) < torch.tensor(lengths).unsqueeze(1)  # (B, T)
    rewards = torch.zeros(len(scores), T, dtype=F64)
    rewards[torch.arange(len(scores)), torch.tensor(lengths) - 1] = torch.tensor(scores, dtype=F64)
    return rewards, mask


def test_registry_names_and_groups():
    assert list(ADVANTAGE_ESTIMATORS) == NAMES
    assert GROUP_ESTIMATORS == {"grpo", "dr_grpo", "grpo_process", "rloo", "reinforce_pp_baseline"}
    grpo, dr = ADVANTAGE_ESTIMATORS["grpo"].fn, ADVANTAGE_ESTIMATORS["dr_grpo"].fn
    assert isinstance(dr, functools.partial) and dr.func is grpo.func


def test_each_entry_declares_inputs_and_knobs_that_exist():
    """An entry's inputs are optional AdvantageInputs fields, its knobs AdvantageParams fields."""
    optional = {f.name for f in dataclasses.fields(AdvantageInputs) if f.default is None}
    params = {f.name for f in dataclasses.fields(AdvantageParams)}
    for name, entry in ADVANTAGE_ESTIMATORS.items():
        assert set(entry.inputs) <= optional and set(entry.knobs) <= params, name
    assert [name for name, entry in ADVANTAGE_ESTIMATORS.items() if entry.critic] == ["gae"]


def test_unknown_name_and_missing_input():
    r, m = _outcome([1.0], [2])
    with pytest.raises(ValueError, match="valid: gae, grpo, dr_grpo"):
        compute_advantages("ppo", AdvantageInputs(r, m), AdvantageParams())
    with pytest.raises(ValueError, match="'gae' needs AdvantageInputs.values"):
        compute_advantages("gae", AdvantageInputs(r, m), AdvantageParams())
    with pytest.raises(ValueError, match="'grpo' needs AdvantageInputs.group_index"):
        compute_advantages("grpo", AdvantageInputs(r, m), AdvantageParams())
    with pytest.raises(ValueError, match=r"group_index: expected shape \(1,\)"):
        compute_advantages("grpo", AdvantageInputs(r, m, group_index=torch.zeros(2)), AdvantageParams())
    with pytest.raises(ValueError, match="lam must be in"):
        AdvantageParams(lam=1.5)


def test_grpo_and_dr_grpo_hand_table():
    # Group 7: scores [1, 0, 0, 1], mean 0.5, unbiased std sqrt(4·0.25/3) = sqrt(1/3):
    #   GRPO ±0.5/(sqrt(1/3) + 1e-6) ≈ ±0.866024; Dr.GRPO ±0.5.
    # Group 3: scores [0.5, 0.5], std 0 -> both give exactly 0.
    r, m = _outcome([1.0, 0.0, 0.0, 1.0, 0.5, 0.5], [3, 2, 1, 3, 2, 3])
    idx = torch.tensor([7, 7, 7, 7, 3, 3])
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    grpo = compute_advantages("grpo", AdvantageInputs(r, m, group_index=idx), AdvantageParams())
    torch.testing.assert_close(
        grpo.advantages,
        torch.where(m, torch.tensor([[a], [-a], [-a], [a], [0], [0]], dtype=F64), 0.0),
    )
    assert (grpo.advantages[4:] == 0).all()
    dr = compute_advantages("dr_grpo", AdvantageInputs(r, m, group_index=idx), AdvantageParams())
    torch.testing.assert_close(
        dr.advantages,
        torch.where(m, torch.tensor([[0.5], [-0.5], [-0.5], [0.5], [0], [0]], dtype=F64), 0.0),
    )


def test_rloo_hand_table_and_group_of_one():
    # Scores [1, 0, 0, 1]: A_0 = 1 − (0 + 0 + 1)/3 = 2/3, A_1 = 0 − 2/3.
    r, m = _outcome([1.0, 0.0, 0.0, 1.0], [1, 2, 3, 3])
    out = compute_advantages(
        "rloo",
        AdvantageInputs(r, m, group_index=torch.zeros(4, dtype=torch.long)),
        AdvantageParams(),
    )
    expected = torch.tensor([[2 / 3], [-2 / 3], [-2 / 3], [2 / 3]], dtype=F64)
    torch.testing.assert_close(out.advantages, torch.where(m, expected, 0.0))
    lone = AdvantageInputs(r, m, group_index=torch.tensor([0, 0, 0, 5]))
    for name in ("rloo", "grpo", "dr_grpo", "reinforce_pp_baseline"):
        with pytest.raises(ValueError, match=f"{name}: group 5 has 1 responses"):
            compute_advantages(name, lone, AdvantageParams())


def test_remax_hand_table():
    # Outcome scores only: A = r(response) − r(greedy) = [1 − 0.5, 0.2 − 0.5] = [0.5, −0.3] on valid
    # tokens; R = the reward-to-go, here the score on every valid token (verl's ReMax returns).
    r, m = _outcome([1.0, 0.2], [2, 3])
    inputs = AdvantageInputs(r, m, baseline_rewards=torch.tensor([0.5, 0.5], dtype=F64))
    out = compute_advantages("remax", inputs, AdvantageParams())
    torch.testing.assert_close(out.advantages, torch.tensor([[0.5, 0.5, 0], [-0.3, -0.3, -0.3]], dtype=F64))
    torch.testing.assert_close(out.returns, torch.tensor([[1.0, 1.0, 0], [0.2, 0.2, 0.2]], dtype=F64))


def test_remax_returns_are_the_reward_to_go():
    # Token rewards with a KL cost on every token, baseline 0.5 for each row.
    #   row 0: r = [−0.1, 0.2, 1.0]; S = 1.1, A = 0.6 on every token;
    #          R_i = Σ_{j≥i} r_j = [1.1, 1.2, 1.0].
    #   row 1: r = [0.3, −0.2, pad]; S = 0.1, A = −0.4; R = [0.1, −0.2, 0].
    #   row 2: r = [0.5, observation (mask False), 0.25]; S = 0.75, A = 0.25; R = [0.75, 0, 0.25].
    # γ = 0.5 changes nothing: ReMax's reward-to-go is undiscounted (as verl).
    r = torch.tensor([[-0.1, 0.2, 1.0], [0.3, -0.2, 7.0], [0.5, 9.0, 0.25]], dtype=F64)
    m = torch.tensor([[True, True, True], [True, True, False], [True, False, True]])
    inputs = AdvantageInputs(r, m, baseline_rewards=torch.tensor([0.5, 0.5, 0.5], dtype=F64))
    out = compute_advantages("remax", inputs, AdvantageParams(gamma=0.5))
    torch.testing.assert_close(
        out.advantages, torch.tensor([[0.6, 0.6, 0.6], [-0.4, -0.4, 0.0], [0.25, 0.0, 0.25]], dtype=F64)
    )
    torch.testing.assert_close(
        out.returns, torch.tensor([[1.1, 1.2, 1.0], [0.1, -0.2, 0.0], [0.75, 0.0, 0.25]], dtype=F64)
    )


def test_reinforce_pp_hand_table():
    # r = [[0, 0, 1], [0, 1, pad]], γ = 0.5: returns [[.25, .5, 1], [.5, 1, 0]].
    # Valid returns .25 .5 1 .5 1: mean .65, deviations −.4 −.15 .35 −.15 .35,
    # unbiased var .45/4 = .1125 -> whitened = deviation / sqrt(.1125 + 1e-8).
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]], dtype=F64)
    m = torch.tensor([[True, True, True], [True, True, False]])
    out = compute_advantages("reinforce_pp", AdvantageInputs(r, m), AdvantageParams(gamma=0.5))
    torch.testing.assert_close(out.returns, torch.tensor([[0.25, 0.5, 1.0], [0.5, 1.0, 0.0]], dtype=F64))
    s = math.sqrt(0.1125 + 1e-8)
    expected = torch.tensor([[-0.4 / s, -0.15 / s, 0.35 / s], [-0.15 / s, 0.35 / s, 0.0]], dtype=F64)
    torch.testing.assert_close(out.advantages, expected)


def test_reinforce_pp_baseline_hand_table():
    # Scores [1, 0] in one group, mean .5 -> [.5, −.5] on masks of 2 and 1 tokens.
    # Valid values .5 .5 −.5: mean 1/6, deviations 1/3 1/3 −2/3, unbiased var (2/3)/2 = 1/3.
    r, m = _outcome([1.0, 0.0], [2, 1], T=2)
    inputs = AdvantageInputs(r, m, group_index=torch.tensor([4, 4]))
    out = compute_advantages("reinforce_pp_baseline", inputs, AdvantageParams())
    s = math.sqrt(1 / 3 + 1e-8)
    torch.testing.assert_close(out.advantages, torch.tensor([[1 / 3 / s, 1 / 3 / s], [-2 / 3 / s, 0]], dtype=F64))
    torch.testing.assert_close(out.returns, torch.tensor([[0.5, 0.5], [-0.5, 0.0]], dtype=F64))


def test_grpo_process_hand_table():
    # Group of 2 responses, T = 4. Response 0: steps end at 1 (reward 1.0) and 3 (0.0);
    # response 1 (3 valid tokens): one step at 2 (reward 0.2).
    # All step rewards [1, 0, 0.2]: mean 0.4, deviations [.6, −.4, −.2],
    # unbiased var (.36 + .16 + .04)/2 = .28 -> r̃ = deviation / (sqrt(.28) + 1e-6).
    # A_t = Σ r̃ of steps ending at or after t:
    #   response 0: [.6 − .4, .6 − .4, −.4, −.4]/s; response 1: [−.2, −.2, −.2, masked 0]/s.
    r = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.2, 0.0]], dtype=F64)
    m = torch.tensor([[True, True, True, True], [True, True, True, False]])
    ends = torch.tensor([[False, True, False, True], [False, False, True, False]])
    inputs = AdvantageInputs(r, m, group_index=torch.tensor([0, 0]), step_end_mask=ends)
    out = compute_advantages("grpo_process", inputs, AdvantageParams())
    s = math.sqrt(0.28) + 1e-6
    expected = torch.tensor([[0.2, 0.2, -0.4, -0.4], [-0.2, -0.2, -0.2, 0.0]], dtype=F64) / s
    torch.testing.assert_close(out.advantages, expected)
    bad = AdvantageInputs(r, m, group_index=torch.tensor([0, 0]), step_end_mask=ends | ~m)
    with pytest.raises(ValueError, match=r"step_end_mask\[1, 3\]"):
        compute_advantages("grpo_process", bad, AdvantageParams())


@st.composite
def grouped(draw):
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    sizes = draw(st.lists(st.integers(2, 5), min_size=1, max_size=4))
    B, T = sum(sizes), draw(st.integers(1, 12))
    group_index = torch.repeat_interleave(torch.arange(len(sizes)) * 10, torch.tensor(sizes))
    group_index = group_index[torch.randperm(B, generator=g)]  # groups need not be contiguous
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    m = torch.arange(T) < lengths.unsqueeze(1)
    m &= ~(torch.rand(B, T, generator=g) < 0.2) | (torch.arange(T) == 0)  # holes; token 0 valid
    # Scores from a small set so that ties and zero-std groups occur.
    r = torch.randint(0, 3, (B, T), generator=g).to(F64) / 2
    steps = m & (torch.rand(B, T, generator=g) < 0.5)
    steps[:, 0] = True
    inputs = AdvantageInputs(
        r,
        m,
        values=torch.randn(B, T, generator=g, dtype=F64),
        group_index=group_index,
        baseline_rewards=torch.randn(B, generator=g, dtype=F64),
        step_end_mask=steps,
    )
    return inputs, g


def _first(adv, m):
    """The broadcast advantage of each row (B,): its value on a valid token."""
    return adv.gather(1, m.long().argmax(-1, keepdim=True)).squeeze(1)


@settings(max_examples=50, deadline=None)
@given(grouped())
def test_group_advantages_sum_to_zero_and_rloo_is_leave_one_out(case):
    inputs, _ = case
    scores = torch.where(inputs.response_mask, inputs.token_rewards, 0.0).sum(-1)
    idx = inputs.group_index
    for name in ("grpo", "dr_grpo", "rloo"):
        seq = _first(compute_advantages(name, inputs, AdvantageParams()).advantages, inputs.response_mask)
        for g in idx.unique():
            assert abs(seq[idx == g].sum().item()) < 1e-9, name
    rloo = _first(compute_advantages("rloo", inputs, AdvantageParams()).advantages, inputs.response_mask)
    for i in range(len(scores)):
        others = [scores[j].item() for j in range(len(scores)) if j != i and idx[j] == idx[i]]
        assert rloo[i].item() == pytest.approx(scores[i].item() - sum(others) / len(others), abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(grouped())
def test_whitened_estimators_have_mean_zero_variance_one(case):
    inputs, _ = case
    m = inputs.response_mask
    for name in ("reinforce_pp", "reinforce_pp_baseline"):
        out = compute_advantages(name, inputs, AdvantageParams(gamma=0.9))
        if m.sum() < 2 or masked_var(out.returns, m) < 1e-3:
            continue
        assert abs(masked_mean(out.advantages, m).item()) < 1e-9
        assert masked_var(out.advantages, m).item() == pytest.approx(1.0, rel=1e-5)


@settings(max_examples=50, deadline=None)
@given(grouped())
def test_masked_positions_never_change_valid_outputs(case):
    inputs, g = case
    m = inputs.response_mask
    noise = torch.randn(m.shape, generator=g, dtype=F64) * 1e3
    noisy = AdvantageInputs(
        torch.where(m, inputs.token_rewards, noise),
        m,
        torch.where(m, inputs.values, noise),
        inputs.group_index,
        inputs.baseline_rewards,
        inputs.step_end_mask,
    )
    for name in NAMES:
        a = compute_advantages(name, inputs, AdvantageParams(gamma=0.9, lam=0.8))
        b = compute_advantages(name, noisy, AdvantageParams(gamma=0.9, lam=0.8))
        assert torch.equal(a.advantages, b.advantages) and torch.equal(a.returns, b.returns), name
        assert (a.advantages[~m] == 0).all() and (a.returns[~m] == 0).all(), name
