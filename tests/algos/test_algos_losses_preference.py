"""The preference losses (algos/losses/preference.py) in the three tiers: hand-computed pairs,
a slow reference written pair by pair from the papers' formulas, and invariants (hypothesis)."""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.algos.losses import (
    PAIR_LOSSES,
    PREFERENCE_LOSSES,
    UNPAIRED_LOSSES,
    PreferenceLossParams,
    Side,
    get_preference_loss,
    kto_reference_point,
    pair_loss,
    sequence_rewards,
    side_rewards,
    token_rewards,
)
from glassrl.algos.losses.preference import kto

F64 = torch.float64
SETTINGS = settings(max_examples=50, deadline=None)


def close(actual, expected, atol=1e-9):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-7)


def side(logprobs, ref, mask=None):
    """One side of a batch from nested lists (rows padded with anything; ``mask`` marks the tokens)."""
    lp = torch.tensor(logprobs, dtype=F64, requires_grad=True)
    m = torch.ones_like(lp, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return Side(lp, None if ref is None else torch.tensor(ref, dtype=F64), m)


# ---------------------------------------------------------------- tier 1: by hand


def hand_pair():
    """Chosen: two tokens, log π = (−1, −2), log π_ref = (−1.5, −2.5): log-ratio 1.0 in all.
    Rejected: one token, log π = −3, log π_ref = −2: log-ratio −1.0 (a padded second slot)."""
    chosen = side([[-1.0, -2.0]], [[-1.5, -2.5]])
    rejected = side([[-3.0, float("nan")]], [[-2.0, float("nan")]], [[True, False]])
    return chosen, rejected


def test_registries():
    assert list(PAIR_LOSSES) == ["dpo", "ipo", "simpo", "cpo", "orpo", "bco"]
    assert list(UNPAIRED_LOSSES) == ["kto"]
    reductions = [e.reduction for e in PREFERENCE_LOSSES.values()]
    assert reductions == ["token-sum", "token-sum", "token-mean", "token-sum", "token-mean", "token-sum", "token-sum"]
    assert [name for name, e in PREFERENCE_LOSSES.items() if not e.reference] == ["simpo", "cpo", "orpo"]
    assert {name: e.nll for name, e in PREFERENCE_LOSSES.items() if e.nll is not None} == {
        "dpo": "rpo_alpha",
        "cpo": "cpo_alpha",
        "orpo": "",
    }
    with pytest.raises(ValueError, match="valid: dpo, ipo, simpo, cpo, orpo, bco, kto"):
        get_preference_loss("sppo")
    with pytest.raises(ValueError, match="valid: token-sum, token-mean"):
        sequence_rewards(torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), "token-max")
    with pytest.raises(ValueError, match="label_smoothing = 0.5"):
        PreferenceLossParams(label_smoothing=0.5)


def test_token_rewards_and_their_sums_by_hand():
    chosen, rejected = hand_pair()
    entry = PAIR_LOSSES["dpo"]
    r_c, r_r = side_rewards(chosen, entry, 0.1), side_rewards(rejected, entry, 0.1)
    close(r_c.tokens, [[0.05, 0.05]])  # β·(log π − log π_ref) = 0.1·0.5 per token
    close(r_r.tokens, [[-0.1, 0.0]])  # the padded slot is 0, not NaN
    close(r_c.sequence, [0.1])
    close(r_r.sequence, [-0.1])


def test_dpo_by_hand():
    # h = r_c − r_r = 0.1 − (−0.1) = 0.2; loss = −log σ(0.2) = log(1 + e^−0.2) = 0.598138869
    chosen, rejected = hand_pair()
    loss, _, _ = pair_loss("dpo", chosen, rejected, PreferenceLossParams(beta=0.1))
    close(loss, [math.log1p(math.exp(-0.2))])
    assert abs(loss.item() - 0.598138869) < 1e-9
    loss.sum().backward()
    # dL/dh = −σ(−h) = −0.450166; dh/d log π(chosen token) = β, dh/d log π(rejected token) = −β
    s = 1 / (1 + math.exp(0.2))
    close(chosen.logprobs.grad, [[-0.1 * s, -0.1 * s]])
    close(rejected.logprobs.grad, [[0.1 * s, 0.0]])


def test_conservative_dpo_by_hand():
    # ε = 0.1: 0.9·(−log σ(0.2)) + 0.1·(−log σ(−0.2)) = 0.9·0.598139 + 0.1·0.798139 = 0.618139
    chosen, rejected = hand_pair()
    loss, _, _ = pair_loss("dpo", chosen, rejected, PreferenceLossParams(beta=0.1, label_smoothing=0.1))
    close(loss, [0.9 * math.log1p(math.exp(-0.2)) + 0.1 * math.log1p(math.exp(0.2))])
    assert abs(loss.item() - 0.6181389) < 1e-7


def test_ipo_by_hand():
    # h = Σ log-ratio(chosen) − Σ log-ratio(rejected) = 1 − (−1) = 2; target 1/(2τ) = 5 at τ = β = 0.1
    chosen, rejected = hand_pair()
    loss, _, _ = pair_loss("ipo", chosen, rejected, PreferenceLossParams(beta=0.1))
    close(loss, [9.0])  # (2 − 5)²
    loss.sum().backward()
    close(chosen.logprobs.grad, [[-6.0, -6.0]])  # 2·(h − 5)·dh/d log π = −6
    close(rejected.logprobs.grad, [[6.0, 0.0]])


def test_simpo_by_hand():
    # β = 2, γ = 0.5: r_c = 2·mean(−1, −2) = −3, r_r = 2·(−3) = −6 (no reference);
    # loss = −log σ(−3 + 6 − 0.5) = log(1 + e^−2.5) = 0.078889
    chosen, rejected = hand_pair()
    params = PreferenceLossParams(beta=2.0, simpo_gamma=0.5)
    loss, r_c, r_r = pair_loss("simpo", chosen, rejected, params)
    close(r_c.tokens, [[-2.0, -4.0]])
    close(r_c.sequence, [-3.0])
    close(r_r.sequence, [-6.0])
    close(loss, [math.log1p(math.exp(-2.5))])
    loss.sum().backward()
    s = 1 / (1 + math.exp(2.5))  # σ(−2.5) = 0.0758582
    close(chosen.logprobs.grad, [[-s * 2 / 2, -s * 2 / 2]])  # β/|y_c| = 1
    close(rejected.logprobs.grad, [[s * 2 / 1, 0.0]])  # β/|y_r| = 2


def test_rpo_by_hand():
    # DPO's 0.598139 plus α·(−mean log π of the chosen) = 1·1.5; ν_i = −α·log π_i/|y_w| = (0.5, 1.0)
    chosen, rejected = hand_pair()
    loss, r_c, r_r = pair_loss("dpo", chosen, rejected, PreferenceLossParams(beta=0.1, rpo_alpha=1.0))
    close(loss, [math.log1p(math.exp(-0.2)) + 1.5])
    close(r_c.nll, [[0.5, 1.0]])
    assert r_r.nll is None
    loss.sum().backward()
    s = 1 / (1 + math.exp(0.2))
    close(chosen.logprobs.grad, [[-0.1 * s - 0.5, -0.1 * s - 0.5]])  # the NLL term adds −α/|y_w| per token
    close(rejected.logprobs.grad, [[0.1 * s, 0.0]])
    dpo_only, *_ = pair_loss("dpo", *hand_pair(), PreferenceLossParams(beta=0.1))
    assert abs(dpo_only.item() - 0.598138869) < 1e-9  # rpo_alpha = 0 is DPO


def test_cpo_by_hand():
    # reference-free token sums: r_c = 0.1·(−1 − 2) = −0.3, r_r = 0.1·(−3) = −0.3: margin 0, −log σ(0) = log 2;
    # plus CPO's NLL (α = 1): 1.5
    chosen, rejected = hand_pair()
    loss, r_c, r_r = pair_loss("cpo", chosen, rejected, PreferenceLossParams(beta=0.1))
    close(r_c.sequence, [-0.3])
    close(r_r.sequence, [-0.3])
    close(loss, [math.log(2) + 1.5])
    assert abs(loss.item() - 2.1931472) < 1e-7


def test_orpo_by_hand():
    # mean log π: chosen −1.5, rejected −3; log odds = (−1.5 + 3) − (log(1 − e^−1.5) − log(1 − e^−3)) = 1.701413;
    # −β·log σ(1.701411) = 0.1·0.167568 = 0.0167568, plus the NLL 1.5
    chosen, rejected = hand_pair()
    loss, r_c, _ = pair_loss("orpo", chosen, rejected, PreferenceLossParams(beta=0.1))
    log_odds = 1.5 - (math.log(1 - math.exp(-1.5)) - math.log(1 - math.exp(-3)))
    assert abs(log_odds - 1.7014133) < 1e-7
    close(r_c.sequence, [-0.15])  # β·mean log π
    close(loss, [0.1 * math.log1p(math.exp(-log_odds)) + 1.5])
    assert abs(loss.item() - 1.5167568) < 1e-7


def test_orpo_stays_finite_at_probability_one():
    chosen = side([[0.0, 0.0]], None)  # every token at probability 1: odds ∞
    loss, *_ = pair_loss("orpo", chosen, side([[-1.0]], None), PreferenceLossParams(beta=0.1))
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(chosen.logprobs.grad).all()


def test_bco_by_hand():
    # r_c = 0.1, r_r = −0.1 (as DPO's); δ = 0.05: −log σ(0.05) − log σ(−(−0.15)) = 0.6684 + 0.6210
    chosen, rejected = hand_pair()
    loss, _, _ = pair_loss("bco", chosen, rejected, PreferenceLossParams(beta=0.1, bco_delta=0.05))
    close(loss, [math.log1p(math.exp(-0.05)) + math.log1p(math.exp(-0.15))])
    assert abs(loss.item() - 1.2894167) < 1e-7


def test_kto_by_hand():
    # β = 0.1; desirable r = 0.1, undesirable r = −0.1; z0 = 0.5 nats (β·z0 = 0.05):
    # desirable: 1 − σ(0.1 − 0.05) = 0.4875026; undesirable: 1 − σ(0.05 + 0.1) = 0.4625702
    rewards = torch.tensor([0.1, -0.1], dtype=F64)
    desirable = torch.tensor([True, False])
    loss = kto(rewards, desirable, torch.tensor(0.5, dtype=F64), PreferenceLossParams(beta=0.1))
    close(loss, [1 - 1 / (1 + math.exp(-0.05)), 1 - 1 / (1 + math.exp(-0.15))])
    assert abs(loss[0].item() - 0.4875026) < 1e-7 and abs(loss[1].item() - 0.4625702) < 1e-7
    weighted = kto(
        rewards,
        desirable,
        torch.tensor(0.5, dtype=F64),
        PreferenceLossParams(beta=0.1, kto_desirable_weight=2.0, kto_undesirable_weight=3.0),
    )
    close(weighted, loss * torch.tensor([2.0, 3.0], dtype=F64))


def test_kto_reference_point_by_hand():
    # mismatched pairs' log-ratio sums: (0.5 + 0.5) and (−0.25): mean 0.375; a negative mean clamps to 0
    lp = torch.tensor([[-1.0, -1.0], [-2.0, 9.0]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.5], [-1.75, 9.0]], dtype=F64)
    mask = torch.tensor([[True, True], [True, False]])
    z0 = kto_reference_point(lp, ref, mask)
    close(z0, 0.375)
    assert not z0.requires_grad  # not back-propagated (Ethayarajh et al. 2024)
    close(kto_reference_point(ref, lp.detach(), mask), 0.0)


# ---------------------------------------------------------------- tier 2: slow reference


def reference_pair(name, lp_c, ref_c, lp_r, ref_r, p):
    """One pair's loss from the papers, token by token (lists of 0-d tensors; lp with grad)."""
    nll = -sum(lp_c) / len(lp_c)  # −log π_θ(y_w|x)/|y_w|: the NLL term of RPO (eq. 1), CPO (eq. 4), ORPO (eq. 6)
    eps = p.label_smoothing
    if name == "simpo":  # Meng et al. 2024, eq. 4 and 6
        r_c = p.beta * sum(lp_c) / len(lp_c)
        r_r = p.beta * sum(lp_r) / len(lp_r)
        return -torch.log(torch.sigmoid(r_c - r_r - p.simpo_gamma))
    if name == "cpo":  # Xu et al. 2024, eq. 3 (π_ref uniform in DPO's loss) and eq. 4
        h = p.beta * sum(lp_c) - p.beta * sum(lp_r)
        return -(1 - eps) * torch.log(torch.sigmoid(h)) - eps * torch.log(torch.sigmoid(-h)) + p.cpo_alpha * nll
    if name == "orpo":  # Hong et al. 2024, eq. 4 (P), 6 (L_SFT + λ·L_OR), 7 (odds ratio)
        prob_c, prob_r = torch.exp(sum(lp_c) / len(lp_c)), torch.exp(sum(lp_r) / len(lp_r))
        odds_ratio = (prob_c / (1 - prob_c)) / (prob_r / (1 - prob_r))
        return nll - p.beta * torch.log(torch.sigmoid(torch.log(odds_ratio)))
    ratio_c = sum(a - b for a, b in zip(lp_c, ref_c))  # log π(y_w|x)/π_ref(y_w|x)
    ratio_r = sum(a - b for a, b in zip(lp_r, ref_r))
    if name == "dpo":  # Rafailov et al. 2023, eq. 7; Mitchell 2023 for ε; Pang et al. 2024, eq. 1 for α
        h = p.beta * ratio_c - p.beta * ratio_r
        return -(1 - eps) * torch.log(torch.sigmoid(h)) - eps * torch.log(torch.sigmoid(-h)) + p.rpo_alpha * nll
    if name == "ipo":  # Azar et al. 2023, eq. 17, τ = β
        return (ratio_c - ratio_r - 1 / (2 * p.beta)) ** 2
    if name == "bco":  # Jung et al. 2024, eq. 7: each response classified against δ
        d = p.bco_delta
        return -torch.log(torch.sigmoid(p.beta * ratio_c - d)) - torch.log(torch.sigmoid(-(p.beta * ratio_r - d)))
    raise AssertionError(name)


def random_pairs(seed, b=3, t_c=4, t_r=5):
    g = torch.Generator().manual_seed(seed)
    lp_c, lp_r = -3 * torch.rand(b, t_c, generator=g, dtype=F64), -3 * torch.rand(b, t_r, generator=g, dtype=F64)
    ref_c = lp_c + 0.5 * torch.randn(b, t_c, generator=g, dtype=F64)
    ref_r = lp_r + 0.5 * torch.randn(b, t_r, generator=g, dtype=F64)
    m_c = torch.arange(t_c).expand(b, t_c) < torch.randint(1, t_c + 1, (b, 1), generator=g)
    m_r = torch.arange(t_r).expand(b, t_r) < torch.randint(1, t_r + 1, (b, 1), generator=g)
    return lp_c, ref_c, m_c, lp_r, ref_r, m_r


@pytest.mark.parametrize("name", list(PAIR_LOSSES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pair_losses_match_the_slow_reference(name, seed):
    lp_c, ref_c, m_c, lp_r, ref_r, m_r = random_pairs(seed)
    p = PreferenceLossParams(
        beta=0.3, label_smoothing=0.2, simpo_gamma=0.7, rpo_alpha=0.5, cpo_alpha=0.8, bco_delta=0.1
    )
    chosen = Side(lp_c.clone().requires_grad_(True), ref_c, m_c)
    rejected = Side(lp_r.clone().requires_grad_(True), ref_r, m_r)
    loss, _, _ = pair_loss(name, chosen, rejected, p)
    loss.sum().backward()
    for b in range(lp_c.shape[0]):
        c = [lp_c[b, i].clone().requires_grad_(True) for i in range(int(m_c[b].sum()))]
        r = [lp_r[b, i].clone().requires_grad_(True) for i in range(int(m_r[b].sum()))]
        expected = reference_pair(name, c, list(ref_c[b]), r, list(ref_r[b]), p)
        expected.backward()
        close(loss[b], expected.item())
        close(chosen.logprobs.grad[b, : len(c)], [x.grad.item() for x in c])
        close(rejected.logprobs.grad[b, : len(r)], [x.grad.item() for x in r])
        assert (chosen.logprobs.grad[b, len(c) :] == 0).all() and (rejected.logprobs.grad[b, len(r) :] == 0).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_kto_matches_the_slow_reference(seed):
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 4
    lp = -3 * torch.rand(b, t, generator=g, dtype=F64)
    ref = lp + 0.5 * torch.randn(b, t, generator=g, dtype=F64)
    mask = torch.arange(t).expand(b, t) < torch.randint(1, t + 1, (b, 1), generator=g)
    desirable = torch.tensor([True, False, True, True, False, False])
    z0 = torch.tensor(0.3, dtype=F64)
    p = PreferenceLossParams(beta=0.5, kto_desirable_weight=1.5, kto_undesirable_weight=0.7)
    lp_grad = lp.clone().requires_grad_(True)
    entry = UNPAIRED_LOSSES["kto"]
    rewards = side_rewards(Side(lp_grad, ref, mask), entry, p.beta).sequence
    loss = entry.fn(rewards, desirable, z0, p)
    loss.sum().backward()
    for i in range(b):
        n = int(mask[i].sum())
        x = [lp[i, j].clone().requires_grad_(True) for j in range(n)]
        r = p.beta * sum(a - ref[i, j] for j, a in enumerate(x))
        if desirable[i]:  # λ_D − λ_D·σ(β(log-ratio − z0))
            expected = p.kto_desirable_weight * (1 - torch.sigmoid(r - p.beta * z0))
        else:  # λ_U − λ_U·σ(β(z0 − log-ratio))
            expected = p.kto_undesirable_weight * (1 - torch.sigmoid(p.beta * z0 - r))
        expected.backward()
        close(loss[i], expected.item())
        close(lp_grad.grad[i, :n], [v.grad.item() for v in x])


# ---------------------------------------------------------------- tier 2: TRL's code
# TRL's losses written again from its source, huggingface/trl at tag v0.27.2 (the last release with
# DPOConfig.rpo_alpha; CPO, ORPO and BCO are in trl/experimental/ there), on a batch: each returns
# the scalar TRL differentiates. TRL takes the NLL term's mean over every chosen token of the batch
# (nn.CrossEntropyLoss / F.cross_entropy over the flattened batch), glassrl over each response's
# tokens: the two agree when the batch's chosen responses have one length, which these batches do.


def trl_sums(lp, m, average=False):
    """get_batch_logps / concatenated_forward: Σ (or mean) of the masked per-token log-probs (B,)."""
    total = torch.where(m, lp, 0.0).sum(-1)
    return total / m.sum(-1) if average else total


def trl_nll(lp_c, m_c):
    """The chosen completion's cross-entropy, a mean over the batch's tokens (loss_fct(logits, labels))."""
    return -lp_c[m_c].sum() / m_c.sum()


def trl_dpo_rpo(lp_c, ref_c, m_c, lp_r, ref_r, m_r, beta, eps, rpo_alpha):
    """trl/trainer/dpo_trainer.py: DPOTrainer.dpo_loss, loss_type "sigmoid", then get_batch_loss_metrics:
    losses + rpo_alpha * model_output["nll_loss"], .mean()."""
    logits = (trl_sums(lp_c, m_c) - trl_sums(lp_r, m_r)) - (trl_sums(ref_c, m_c) - trl_sums(ref_r, m_r))
    losses = -F.logsigmoid(beta * logits) * (1 - eps) - F.logsigmoid(-beta * logits) * eps
    return (losses + rpo_alpha * trl_nll(lp_c, m_c)).mean()


def trl_cpo(lp_c, m_c, lp_r, m_r, beta, eps, cpo_alpha):
    """trl/experimental/cpo/cpo_trainer.py: CPOTrainer.cpo_loss, loss_type "sigmoid" (alpha 0), then
    get_batch_loss_metrics: losses.mean() + cpo_alpha * policy_nll_loss."""
    logits = trl_sums(lp_c, m_c) - trl_sums(lp_r, m_r)
    losses = -F.logsigmoid(beta * logits) * (1 - eps) - F.logsigmoid(-beta * logits) * eps
    return losses.mean() + cpo_alpha * trl_nll(lp_c, m_c)


def trl_orpo(lp_c, m_c, lp_r, m_r, beta):
    """trl/experimental/orpo/orpo_trainer.py: ORPOTrainer.odds_ratio_loss on average_log_prob=True
    log-probs, log1mexp as there, then get_batch_loss_metrics: policy_nll_loss - losses.mean() (its NLL
    covers the prompt's tokens too; here the chosen's response tokens, as glassrl's)."""

    def log1mexp(x):
        return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))

    chosen, rejected = trl_sums(lp_c, m_c, average=True), trl_sums(lp_r, m_r, average=True)
    log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))
    return trl_nll(lp_c, m_c) - (beta * F.logsigmoid(log_odds)).mean()


def trl_bco_pair(lp_c, ref_c, m_c, lp_r, ref_r, m_r, beta, running):
    """trl/trainer/dpo_trainer.py: DPOTrainer.dpo_loss, loss_type "bco_pair": δ = RunningMoments.mean
    (trl/trainer/utils.py) after updating it with the batch's mean reward, a 0-d tensor (count 1)."""
    chosen = beta * (trl_sums(lp_c, m_c) - trl_sums(ref_c, m_c))
    rejected = beta * (trl_sums(lp_r, m_r) - trl_sums(ref_r, m_r))
    rewards = torch.cat((chosen, rejected), 0).mean().detach()
    delta = rewards - running["mean"]  # RunningMoments.update with xs_count = 1
    running["count"] += 1
    running["mean"] += (delta / running["count"]).item()
    delta = running["mean"]
    return (-F.logsigmoid(chosen - delta) - F.logsigmoid(-(rejected - delta))).mean()


def equal_length_pairs(seed, b=4, t=5):
    """A batch whose chosen responses share one length (the rejected ones vary), float64."""
    lp_c, ref_c, _, lp_r, ref_r, m_r = random_pairs(seed, b, t, t)
    return lp_c, ref_c, torch.ones_like(lp_c, dtype=torch.bool), lp_r, ref_r, m_r


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rpo_cpo_orpo_match_trl_s_code(seed):
    lp_c, ref_c, m_c, lp_r, ref_r, m_r = equal_length_pairs(seed)
    p = PreferenceLossParams(beta=0.3, label_smoothing=0.1, rpo_alpha=0.7, cpo_alpha=0.4)
    cases = {
        "dpo": trl_dpo_rpo(lp_c, ref_c, m_c, lp_r, ref_r, m_r, p.beta, p.label_smoothing, p.rpo_alpha),
        "cpo": trl_cpo(lp_c, m_c, lp_r, m_r, p.beta, p.label_smoothing, p.cpo_alpha),
        "orpo": trl_orpo(lp_c, m_c, lp_r, m_r, p.beta),
    }
    for name, theirs in cases.items():
        ours, _, _ = pair_loss(name, Side(lp_c, ref_c, m_c), Side(lp_r, ref_r, m_r), p)
        close(ours.mean(), theirs.item(), atol=1e-12)


def test_bco_matches_trl_s_code_with_the_trainer_s_running_mean():
    """Three batches: glassrl's δ (the trainer's RunningMean) against TRL's RunningMoments."""
    from glassrl.supervised.checkpoints import RunningMean

    running, mean = {"mean": 0.0, "count": 1e-24}, RunningMean()
    p = PreferenceLossParams(beta=0.3)
    for seed in range(3):
        lp_c, ref_c, m_c, lp_r, ref_r, m_r = random_pairs(seed)
        theirs = trl_bco_pair(lp_c, ref_c, m_c, lp_r, ref_r, m_r, p.beta, running)
        c, r = Side(lp_c, ref_c, m_c), Side(lp_r, ref_r, m_r)
        entry = PAIR_LOSSES["bco"]
        rewards = torch.cat([side_rewards(c, entry, p.beta).sequence, side_rewards(r, entry, p.beta).sequence])
        delta = mean.update(rewards)
        ours, _, _ = pair_loss("bco", c, r, replace(p, bco_delta=delta))
        close(ours.mean(), theirs.item(), atol=1e-12)


# ---------------------------------------------------------------- tier 3: invariants


@st.composite
def sides(draw, max_b=3, max_t=5):
    """(logprobs, ref_logprobs, mask) float64 (B, T), every row with at least one valid token."""
    b, t = draw(st.integers(1, max_b)), draw(st.integers(1, max_t))
    n = b * t
    lp = draw(st.lists(st.floats(-8, 0, allow_subnormal=False), min_size=n, max_size=n))
    ratio = draw(st.lists(st.floats(-3, 3, allow_subnormal=False), min_size=n, max_size=n))
    lengths = draw(st.lists(st.integers(1, t), min_size=b, max_size=b))
    lp_t = torch.tensor(lp, dtype=F64).view(b, t)
    mask = torch.arange(t).expand(b, t) < torch.tensor(lengths).unsqueeze(1)
    return lp_t, lp_t - torch.tensor(ratio, dtype=F64).view(b, t), mask


def run_pair(name, c, r, p):
    chosen = Side(c[0].clone().requires_grad_(True), c[1], c[2])
    rejected = Side(r[0][: c[0].shape[0]].clone().requires_grad_(True), r[1][: c[0].shape[0]], r[2][: c[0].shape[0]])
    loss, r_c, r_r = pair_loss(name, chosen, rejected, p)
    loss.sum().backward()
    return loss, r_c, r_r, chosen.logprobs.grad, rejected.logprobs.grad


def same_batch(c, r):
    """r cut or tiled to c's batch size."""
    b = c[0].shape[0]
    reps = -(-b // r[0].shape[0])
    return tuple(x.repeat(reps, 1)[:b] for x in r)


@pytest.mark.parametrize("name", list(PAIR_LOSSES))
@SETTINGS
@given(c=sides(), r=sides(), junk=st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e30]))
def test_masked_positions_never_change_losses_rewards_or_gradients(name, c, r, junk):
    r = same_batch(c, r)
    p = PreferenceLossParams(beta=0.2, label_smoothing=0.1)
    clean = run_pair(name, c, r, p)
    dirty_c = tuple(torch.where(c[2], x, torch.full_like(x, junk)) for x in c[:2]) + (c[2],)
    dirty_r = tuple(torch.where(r[2], x, torch.full_like(x, junk)) for x in r[:2]) + (r[2],)
    dirty = run_pair(name, dirty_c, dirty_r, p)
    for a, b in zip(clean, dirty):
        if isinstance(a, tuple):
            torch.testing.assert_close(a.tokens, b.tokens)
            torch.testing.assert_close(a.sequence, b.sequence)
        else:
            assert torch.isfinite(b).all()
            torch.testing.assert_close(a, b)


@SETTINGS
@given(s=sides(), beta=st.floats(0.01, 5))
def test_token_rewards_sum_to_the_sequence_reward(s, beta):
    lp, ref, mask = s
    for entry in PREFERENCE_LOSSES.values():
        rewards = side_rewards(Side(lp, ref, mask), entry, beta)
        total = torch.where(mask, rewards.tokens, 0.0).sum(-1)
        expected = total if entry.reduction == "token-sum" else total / mask.sum(-1)
        torch.testing.assert_close(rewards.sequence, expected)
        assert (rewards.tokens[~mask] == 0).all()


@SETTINGS
@given(s=sides(), beta=st.floats(0.01, 2), eps=st.floats(0, 0.49))
def test_at_the_reference_dpo_is_log_2_and_ipo_its_target_squared(s, beta, eps):
    lp, _, mask = s
    at_ref = (lp, lp, mask)  # π_θ = π_ref: every implicit reward is 0
    p = PreferenceLossParams(beta=beta, label_smoothing=eps)
    dpo, *_ = run_pair("dpo", at_ref, at_ref, p)
    torch.testing.assert_close(dpo, torch.full_like(dpo, math.log(2)))
    ipo, *_ = run_pair("ipo", at_ref, at_ref, p)
    torch.testing.assert_close(ipo, torch.full_like(ipo, 1 / (4 * beta**2)))


@SETTINGS
@given(c=sides(), r=sides(), shift=st.floats(-3, 3))
def test_a_shift_of_every_log_prob_leaves_simpo_and_the_reference_losses_unchanged(c, r, shift):
    """SimPO's rewards are token means of β·log π: the same shift of every token's log-prob moves
    both by β·shift. DPO and IPO read log π − log π_ref: a shift of both cancels."""
    r = same_batch(c, r)
    p = PreferenceLossParams(beta=0.5, simpo_gamma=0.3)
    moved_c = (c[0] + shift, c[1], c[2])
    moved_r = (r[0] + shift, r[1], r[2])
    torch.testing.assert_close(run_pair("simpo", c, r, p)[0], run_pair("simpo", moved_c, moved_r, p)[0])
    both_c, both_r = (c[0] + shift, c[1] + shift, c[2]), (r[0] + shift, r[1] + shift, r[2])
    for name in ("dpo", "ipo"):
        torch.testing.assert_close(run_pair(name, c, r, p)[0], run_pair(name, both_c, both_r, p)[0])


@SETTINGS
@given(c=sides(), r=sides())
def test_dpo_raises_the_chosen_and_lowers_the_rejected(c, r):
    r = same_batch(c, r)
    _, _, _, grad_c, grad_r = run_pair("dpo", c, r, PreferenceLossParams(beta=0.5))
    assert (grad_c[c[2]] <= 0).all() and (grad_r[r[2]] >= 0).all()


@SETTINGS
@given(s=sides(), z0=st.floats(0, 20), labels=st.lists(st.booleans(), min_size=3, max_size=3))
def test_kto_loss_lies_between_0_and_its_weight(s, z0, labels):
    lp, ref, mask = s
    b = lp.shape[0]
    desirable = torch.tensor(labels[:b])
    p = PreferenceLossParams(beta=0.3, kto_desirable_weight=2.0, kto_undesirable_weight=0.5)
    rewards = token_rewards(lp, ref, mask, p.beta).sum(-1)
    loss = kto(rewards, desirable, torch.tensor(z0, dtype=F64), p)
    weight = torch.where(desirable, 2.0, 0.5).to(F64)
    assert ((loss >= 0) & (loss <= weight)).all()
    assert kto_reference_point(lp, ref, mask) >= 0
