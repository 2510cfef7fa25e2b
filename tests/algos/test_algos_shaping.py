"""Reward shaping and group filters: hand-computed (tier 1), references
(tier 2), invariants (tier 3)."""

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.algos.shaping import (
    RunningRewardNormalizer,
    dynamic_sampling_keep,
    majority_vote,
    overlong_penalty,
)

SETTINGS = settings(max_examples=50, deadline=None)


# ---- overlong penalty (DAPO eq. 13) -------------------------------------------------


def test_overlong_penalty_hand_checked():
    # L_max = 20, L_cache = 4: free up to 16, then (16 − |y|)/4, −1 beyond 20.
    lengths = torch.tensor([10, 16, 17, 18, 20, 21, 100])
    expected = [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]
    assert overlong_penalty(lengths, 20, 4).tolist() == expected


def test_overlong_penalty_rejects_bad_cache_length():
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(torch.tensor([1]), 20, 0)
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(torch.tensor([1]), 20, 21)


@SETTINGS
@given(st.integers(1, 64), st.integers(1, 64), st.lists(st.integers(0, 200), min_size=1, max_size=20))
def test_overlong_penalty_is_in_range_and_non_increasing(l_cache, extra, lengths):
    l_max = l_cache + extra - 1
    lengths = torch.tensor(sorted(lengths))
    p = overlong_penalty(lengths, l_max, l_cache)
    assert ((p <= 0) & (p >= -1)).all()
    assert (p[1:] <= p[:-1]).all()
    assert (p[lengths <= l_max - l_cache] == 0).all()


# ---- running reward normalisation -----------------------------------------------------


def test_normalizer_hand_checked():
    norm = RunningRewardNormalizer(eps=0.0)
    assert norm.normalize(torch.tensor([3.0])).tolist() == [3.0]  # nothing seen: identity
    norm.update(torch.tensor([1.0, 2.0, 3.0]))  # mean 2, unbiased var 1
    assert norm.normalize(torch.tensor([2.0, 4.0])).tolist() == [0.0, 2.0]
    norm.update(torch.tensor([6.0]))  # 1, 2, 3, 6: mean 3, var (4 + 1 + 0 + 9)/3 = 14/3
    assert norm.mean.item() == pytest.approx(3.0)
    assert norm.variance().item() == pytest.approx(14 / 3)


def test_normalizer_with_one_score_keeps_scale_one():
    norm = RunningRewardNormalizer(eps=0.0)
    norm.update(torch.tensor([5.0]))
    assert norm.normalize(torch.tensor([7.0])).tolist() == [2.0]


@SETTINGS
@given(st.lists(st.lists(st.floats(-1e3, 1e3), min_size=0, max_size=6), min_size=1, max_size=6))
def test_normalizer_batches_equal_one_pass(batches):
    norm = RunningRewardNormalizer()
    for b in batches:
        norm.update(torch.tensor(b, dtype=torch.float64))
    everything = torch.tensor([x for b in batches for x in b], dtype=torch.float64)
    assert norm.count == len(everything)
    if len(everything) >= 1:
        assert norm.mean.item() == pytest.approx(everything.mean().item(), rel=1e-9, abs=1e-9)
    if len(everything) >= 2:
        assert norm.variance().item() == pytest.approx(everything.var().item(), rel=1e-7, abs=1e-7)


def test_normalizer_state_dict_round_trip():
    a = RunningRewardNormalizer()
    a.update(torch.tensor([1.0, 5.0, 2.0]))
    b = RunningRewardNormalizer()
    b.load_state_dict(a.state_dict())
    x = torch.tensor([0.0, 3.0])
    assert torch.equal(a.normalize(x), b.normalize(x))
    assert b.count == 3
    with pytest.raises(ValueError, match="m2"):
        b.load_state_dict({"count": 1, "mean": 0.0})


# ---- TTRL majority vote -----------------------------------------------------------------


def test_majority_vote_hand_checked():
    answers = ["4", "5", "4", None, "7", None, None, "x", "y", "y", "x"]
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2, 3, 3, 3, 3])
    labels, rewards = majority_vote(answers, groups)
    # group 0: "4" ×2 beats "5"; group 1: only "7"; group 2: no answer -> None, all 0;
    # group 3: "x" and "y" tie 2–2 -> "x", which occurs first.
    assert labels == ["4", "4", "4", "4", "7", "7", None, "x", "x", "x", "x"]
    assert rewards.tolist() == [1, 0, 1, 0, 1, 0, 0, 1, 0, 0, 1]
    assert rewards.dtype == torch.float32


def test_majority_vote_none_never_wins():
    labels, rewards = majority_vote([None, None, "a"], torch.tensor([3, 3, 3]))
    assert labels == ["a", "a", "a"]
    assert rewards.tolist() == [0, 0, 1]


def test_majority_vote_length_mismatch():
    with pytest.raises(ValueError, match="2 answers for 3 responses"):
        majority_vote(["a", "b"], torch.tensor([0, 0, 1]))


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 3), st.one_of(st.none(), st.sampled_from("abc"))), min_size=1, max_size=16))
def test_majority_vote_label_is_a_most_frequent_answer(rows):
    groups = torch.tensor([g for g, _ in rows])
    answers = [a for _, a in rows]
    labels, rewards = majority_vote(answers, groups)
    for g in set(groups.tolist()):
        members = [i for i, (gi, _) in enumerate(rows) if gi == g]
        counts = Counter(answers[i] for i in members if answers[i] is not None)
        label = labels[members[0]]
        assert all(labels[i] == label for i in members)
        if not counts:
            assert label is None
        else:
            assert counts[label] == max(counts.values())
            tied = {a for a, c in counts.items() if c == counts[label]}
            assert label == next(answers[i] for i in members if answers[i] in tied)  # first occurrence
    assert rewards.tolist() == [float(a is not None and a == lab) for a, lab in zip(answers, labels)]


# ---- DAPO dynamic sampling --------------------------------------------------------------


def test_dynamic_sampling_hand_checked():
    # group 5: {1, 0} mixed -> keep; group 7: {1, 1} all right -> drop;
    # group 9: single response -> drop; group 2: {0, 0, 0} all wrong -> drop; group 4: {0.5, 0.2}.
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5, 0.2])
    groups = torch.tensor([5, 5, 7, 7, 9, 2, 2, 2, 4, 4])
    keep = dynamic_sampling_keep(scores, groups)
    assert keep.tolist() == [True, True, False, False, False, False, False, False, True, True]


@SETTINGS
@given(st.lists(st.tuples(st.integers(-3, 3), st.sampled_from([0.0, 1.0, 0.5])), min_size=1, max_size=20))
def test_dynamic_sampling_matches_definition(rows):
    groups = torch.tensor([g for g, _ in rows])
    scores = torch.tensor([s for _, s in rows])
    keep = dynamic_sampling_keep(scores, groups).tolist()
    for i, (g, _) in enumerate(rows):
        group_scores = [s for gj, s in rows if gj == g]
        assert keep[i] == (len(set(group_scores)) > 1)  # DAPO eq. 11, 0 < correct < G
