"""Tier 2: each policy loss against a slow reference written token by token
from the paper's formula (scalar ops, explicit branches), values and
gradients; GSPO against its sequence-level objective (eq. 5)."""

import pytest
import torch

from glassrl.algos.aggregation import aggregate
from glassrl.algos.losses import PolicyLossParams, get_policy_loss

P = PolicyLossParams(clip_low=0.2, clip_high=0.28, dual_clip_c=3.0, clip_cov_r=0.1)


def ref_token(name, lp, old, a, p):
    """Loss of one token (0-d tensors; lp requires grad), straight from the papers."""
    r = torch.exp(lp - old)
    lo, hi, c = 1 - p.clip_low, 1 + p.clip_high, p.dual_clip_c
    zero_grad = 0 * lp  # a constant with a (zero) gradient path
    if name in ("ppo_clip", "dual_clip", "clip_cov"):
        loss = -torch.min(r * a, torch.clamp(r, lo, hi) * a)  # PPO eq. 7
        if name == "dual_clip" and a < 0:
            loss = torch.min(loss, -c * a)  # Ye et al. eq. 5: max(·, c·A) negated
        return loss
    if name == "cispo":
        w = torch.clamp(r, 1 - p.cispo_eps_is_low, 1 + p.cispo_eps_is_high).detach()
        return -w * a * lp
    if name == "reinforce":
        return -a * lp
    if name == "aspo":
        if a > 0:
            if r < 1 / c:
                return -a * c * lp
            if r > hi:
                return -a / hi + zero_grad
            pi, pi_old = torch.exp(lp), torch.exp(old)
            return -a * pi_old * pi / pi.detach() ** 2  # r̂ = π_old π_θ / sg(π_θ²)
        if a < 0:
            if r > c:
                return -a * c * lp
            if r < lo:
                return -a * lo + zero_grad
            return -a * r
        return zero_grad
    raise AssertionError(name)


def clip_cov_detached(lp, adv, mask, flags, p):
    """Flat indices Clip-Cov detaches: top-k eligible by covariance (ties: lower index)."""
    valid = [i for i in range(lp.numel()) if mask.flatten()[i]]
    n = len(valid)
    mean_lp = sum(lp.flatten()[i].item() for i in valid) / n
    mean_a = sum(adv.flatten()[i].item() for i in valid) / n
    cov = {i: (lp.flatten()[i].item() - mean_lp) * (adv.flatten()[i].item() - mean_a) for i in valid}
    eligible = [i for i in valid if not flags.flatten()[i] and p.clip_cov_omega_low < cov[i] < p.clip_cov_omega_high]
    k = max(int(p.clip_cov_r * n), 1)
    return set(sorted(eligible, key=lambda i: (-cov[i], i))[:k])


def batch(seed, b=4, t=6):
    g = torch.Generator().manual_seed(seed)
    lp = -4 * torch.rand(b, t, generator=g, dtype=torch.float64)
    old = lp - (3 * torch.rand(b, t, generator=g, dtype=torch.float64) - 1.5)  # log r in [−1.5, 1.5]
    adv = 4 * torch.rand(b, t, generator=g, dtype=torch.float64) - 2
    adv[0, 0] = 0.0
    mask = torch.rand(b, t, generator=g) < 0.8
    mask[:, 0] = True
    return lp, old, adv, mask


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", ["ppo_clip", "dual_clip", "cispo", "aspo", "reinforce", "clip_cov"])
def test_token_losses_match_reference(name, seed):
    lp0, old, adv, mask = batch(seed)
    lp = lp0.clone().requires_grad_(True)
    out = get_policy_loss(name)(lp, old, adv, mask, P)
    out.loss.sum().backward()

    detached = set()
    if name == "clip_cov":
        ppo_clipped = out.diagnostics["clipped_low"] | out.diagnostics["clipped_high"]
        detached = clip_cov_detached(lp0, adv, mask, ppo_clipped, P)
        flat = out.diagnostics["cov_clipped"].flatten()
        assert {i for i in range(flat.numel()) if flat[i]} == detached
    ref_loss = torch.zeros_like(lp0)
    ref_grad = torch.zeros_like(lp0)
    for b in range(lp0.shape[0]):
        for t in range(lp0.shape[1]):
            if not mask[b, t]:
                continue
            x = lp0[b, t].clone().requires_grad_(True)
            loss = ref_token(name, x, old[b, t], adv[b, t], P)
            (g,) = torch.autograd.grad(loss, x, allow_unused=True)
            ref_loss[b, t] = loss.detach()
            if b * lp0.shape[1] + t not in detached:
                ref_grad[b, t] = 0.0 if g is None else g
    torch.testing.assert_close(out.loss.detach(), ref_loss)
    torch.testing.assert_close(lp.grad, ref_grad)


def gspo_sequence_reference(lp, old, seq_adv, mask, p):
    """GSPO eq. 5 (negated) with s_i from eq. 7, one term per sequence: (1/G) Σ_i ℓ_i."""
    terms = []
    for i in range(lp.shape[0]):
        valid = mask[i]
        s = torch.exp((lp[i][valid] - old[i][valid]).mean())  # eq. 7
        a = seq_adv[i]
        terms.append(-torch.min(s * a, torch.clamp(s, 1 - p.clip_low, 1 + p.clip_high) * a))
    return torch.stack(terms)


@pytest.mark.parametrize("seed", range(6))
def test_gspo_matches_sequence_level_objective(seed):
    lp0, old, _, mask = batch(seed)
    old = lp0 - 0.3 * (old - lp0)  # smaller ratios so both clipped and unclipped rows occur
    g = torch.Generator().manual_seed(100 + seed)
    seq_adv = 4 * torch.rand(lp0.shape[0], generator=g, dtype=torch.float64) - 2
    adv = seq_adv[:, None].expand_as(lp0)  # one advantage per response, as in GSPO
    p = PolicyLossParams(clip_low=0.05, clip_high=0.05)

    lp_ref = lp0.clone().requires_grad_(True)
    terms = gspo_sequence_reference(lp_ref, old, seq_adv, mask, p)
    terms.mean().backward()

    lp = lp0.clone().requires_grad_(True)
    out = get_policy_loss("gspo")(lp, old, adv, mask, p)
    aggregate(out.loss, mask, "seq-mean-token-mean").backward()
    torch.testing.assert_close(aggregate(out.loss.detach(), mask, "seq-mean-token-mean"), terms.mean().detach())
    torch.testing.assert_close(lp.grad, lp_ref.grad)

    # Under token-mean, GSPO-token equals the sequence terms weighted by their lengths.
    lengths = mask.sum(-1).to(torch.float64)
    torch.testing.assert_close(
        aggregate(out.loss.detach(), mask, "token-mean"), (terms.detach() * lengths).sum() / lengths.sum()
    )
