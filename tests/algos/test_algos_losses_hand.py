"""Tier 1: policy losses on 2–7 tokens, every number checkable on paper.

Inputs are built from the ratio r and the current log-prob:
old_logprobs = logprobs − log r, so π/π_old = r. Expected gradients are
d loss_token / d logprobs_token.
"""

import math

import pytest
import torch

from glassrl.algos.aggregation import aggregate
from glassrl.algos.losses import POLICY_LOSSES, PolicyLossParams, get_policy_loss


def run(name, ratios, advantages, params, logprobs=None, mask=None):
    """One row (B = 1) of tokens; returns (output, grad of Σ loss w.r.t. logprobs)."""
    r = torch.tensor([ratios], dtype=torch.float64)
    lp0 = torch.full_like(r, -1.0) if logprobs is None else torch.tensor([logprobs], dtype=torch.float64)
    lp = lp0.clone().requires_grad_(True)
    old = lp0 - torch.log(r)
    adv = torch.tensor([advantages], dtype=torch.float64)
    m = torch.ones_like(r, dtype=torch.bool) if mask is None else torch.tensor([mask])
    out = get_policy_loss(name)(lp, old, adv, m, params)
    out.loss.sum().backward()
    return out, lp.grad[0]


def close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-9, rtol=1e-7)


def flags(out, key):
    return out.diagnostics[key][0].tolist()


def test_registry_names_and_unknown_name():
    assert list(POLICY_LOSSES) == ["ppo_clip", "dual_clip", "gspo", "cispo", "aspo", "clip_cov", "reinforce"]
    with pytest.raises(ValueError, match="valid: ppo_clip, dual_clip, gspo"):
        get_policy_loss("ppo")


def test_params_validation_names_the_field():
    with pytest.raises(ValueError, match="dual_clip_c"):
        PolicyLossParams(dual_clip_c=1.0)
    with pytest.raises(ValueError, match="clip_low"):
        PolicyLossParams(clip_low=1.5)
    with pytest.raises(ValueError, match="clip_cov_omega_high"):
        PolicyLossParams(clip_cov_omega_low=2.0, clip_cov_omega_high=1.0)


def test_ppo_clip_higher_table():
    # ε_low = 0.2, ε_high = 0.28 (DAPO's values)
    #  r    A  | r·A   clip(r)·A | loss = −min      | clipped | d/dlogπ
    #  1.5  +1 | 1.5   1.28      | −1.28            | high    | 0
    #  0.5  −2 | −1.0  −1.6      | 1.6              | low     | 0
    #  0.5  +1 | 0.5   0.8       | −0.5             | –       | −r·A = −0.5
    #  1.5  −1 | −1.5  −1.28     | 1.5              | –       | −r·A = 1.5
    out, grad = run("ppo_clip", [1.5, 0.5, 0.5, 1.5], [1, -2, 1, -1], PolicyLossParams(0.2, 0.28))
    close(out.loss[0], [-1.28, 1.6, -0.5, 1.5])
    close(grad, [0.0, 0.0, -0.5, 1.5])
    assert flags(out, "clipped_high") == [True, False, False, False]
    assert flags(out, "clipped_low") == [False, True, False, False]
    close(out.diagnostics["ratio"][0], [1.5, 0.5, 0.5, 1.5])


def test_ppo_clip_fraction_by_masked_mean():
    # 2 of the 3 valid tokens are clipped; the 4th (masked) would be clipped but does not count.
    out, _ = run("ppo_clip", [2.0, 0.1, 1.0, 2.0], [1, -1, 1, 1], PolicyLossParams(), mask=[True, True, True, False])
    clipped = out.diagnostics["clipped_low"] | out.diagnostics["clipped_high"]
    assert clipped[0].tolist() == [True, True, False, False]
    assert out.loss[0, 3].item() == 0.0


def test_dual_clip_table():
    # ε = 0.2, c = 3
    #  r    A  | PPO loss         | dual: min(PPO, −c·A) | d/dlogπ
    #  4    −1 | −min(−4, −1.2)=4 | min(4, 3) = 3        | 0 (dual-clipped)
    #  2    −1 | 2                | 2                    | −r·A = 2
    #  4    +1 | −1.2 (clip high) | −1.2                 | 0
    #  0.5  −1 | 0.8 (clip low)   | 0.8                  | 0
    out, grad = run("dual_clip", [4.0, 2.0, 4.0, 0.5], [-1, -1, 1, -1], PolicyLossParams())
    close(out.loss[0], [3.0, 2.0, -1.2, 0.8])
    close(grad, [0.0, 2.0, 0.0, 0.0])
    assert flags(out, "dual_clipped") == [True, False, False, False]
    assert flags(out, "clipped_high") == [False, False, True, False]
    assert flags(out, "clipped_low") == [False, False, False, True]


def test_gspo_table():
    # Row 0: token ratios 2 and 0.5 -> s = exp((ln 2 + ln 0.5)/2) = 1, A = 1:
    #        loss −1 on both tokens, gradient −A·s = −1 each.
    # Row 1: ratios 4 and 1 -> s = exp(ln 4 / 2) = 2 > 1.2, A = 1: clipped,
    #        loss −1.2 on both, gradient 0.
    # Row 2: one valid token, ratio 1.1, A = −1: s = 1.1, loss 1.1, grad −A·s = 1.1;
    #        the masked token has loss 0 and gradient 0.
    lp0 = torch.full((3, 2), -1.0, dtype=torch.float64)
    lp = lp0.clone().requires_grad_(True)
    r = torch.tensor([[2.0, 0.5], [4.0, 1.0], [1.1, 7.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0], [1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    out = get_policy_loss("gspo")(lp, lp0 - r.log(), adv, mask, PolicyLossParams())
    out.loss.sum().backward()
    close(out.loss, [[-1.0, -1.0], [-1.2, -1.2], [1.1, 0.0]])
    close(lp.grad, [[-1.0, -1.0], [0.0, 0.0], [1.1, 0.0]])
    close(out.diagnostics["ratio"][:, 0], [1.0, 2.0, 1.1])
    assert out.diagnostics["clipped_high"].tolist() == [[False, False], [True, True], [False, False]]


def test_gspo_is_eq5_under_seq_mean_token_mean_only():
    # Two responses of lengths 1 and 3, on-policy (s = 1, nothing clipped), A = +1 and −1.
    # Eq. 5 (negated): ℓ = [−1, +1], 1/G Σ ℓ = 0; dℓ_i/dlogπ_t = −A_i·s/|y_i|, times 1/G:
    #   response 0: −1/2; response 1: +1/6 on each of its 3 tokens.
    # token-mean: (1·(−1) + 3·(+1))/4 = 0.5 ≠ 0; gradient −A·s/N = −1/4 and +1/4 each.
    lp0 = torch.full((2, 3), -1.0, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[True, False, False], [True, True, True]])
    results = {}
    for mode in ("seq-mean-token-mean", "token-mean"):
        lp = lp0.clone().requires_grad_(True)
        out = get_policy_loss("gspo")(lp, lp0, adv, mask, PolicyLossParams())
        loss = aggregate(out.loss, mask, mode)
        loss.backward()
        results[mode] = (loss.detach(), lp.grad)
    loss, grad = results["seq-mean-token-mean"]
    close(loss, 0.0)
    close(grad, [[-1 / 2, 0, 0], [1 / 6, 1 / 6, 1 / 6]])
    loss, grad = results["token-mean"]
    close(loss, 0.5)
    close(grad, [[-1 / 4, 0, 0], [1 / 4, 1 / 4, 1 / 4]])


def test_cispo_table():
    # log π = −1 on every token, ε^IS_low = 1 (no lower bound), ε^IS_high = 0.28
    #  r    A  | r̂ = clip(r, 0, 1.28) | loss = −r̂·A·log π | d/dlogπ = −r̂·A
    #  2    +1 | 1.28                 | 1.28              | −1.28
    #  0.5  −2 | 0.5                  | −1.0              | 1.0
    #  1    +3 | 1                    | 3.0               | −3.0
    out, grad = run("cispo", [2.0, 0.5, 1.0], [1, -2, 3], PolicyLossParams())
    close(out.loss[0], [1.28, -1.0, 3.0])
    close(grad, [-1.28, 1.0, -3.0])
    assert flags(out, "clipped_high") == [True, False, False]
    assert flags(out, "clipped_low") == [False, False, False]


def test_aspo_table():
    # ε_low = ε_high = 0.2, c = 3, log π = −1 on every token
    #  r     A  | case                              | loss          | d/dlogπ
    #  0.8   +1 | flipped: value 1/r = 1.25         | −1.25         | −A/r = −1.25
    #  1.5   +1 | r > 1 + ε_high: hard mask         | −1/1.2        | 0
    #  0.25  +1 | 1/r = 4 > c: soft dual clip       | −A·c·logπ = 3 | −A·c = −3
    #  0.5   −1 | r < 1 − ε_low: hard mask          | −A·0.8 = 0.8  | 0
    #  2     −1 | PPO region                        | 2             | −A·r = 2
    #  4     −1 | r > c: soft dual clip             | −A·c·logπ = −3| −A·c = 3
    #  2      0 | no advantage                      | 0             | 0
    out, grad = run("aspo", [0.8, 1.5, 0.25, 0.5, 2.0, 4.0, 2.0], [1, 1, 1, -1, -1, -1, 0], PolicyLossParams())
    close(out.loss[0], [-1.25, -1 / 1.2, 3.0, 0.8, 2.0, -3.0, 0.0])
    close(grad, [-1.25, 0.0, -3.0, 0.0, 2.0, 3.0, 0.0])
    assert flags(out, "clipped_high") == [False, True, False, False, False, False, False]
    assert flags(out, "clipped_low") == [False, False, False, True, False, False, False]
    assert flags(out, "dual_clipped") == [False, False, True, False, False, True, False]


def test_clip_cov_table():
    # r = 1 everywhere (on-policy), so PPO's loss is −A and its gradient −A.
    # log π = [0, −2, −4, −6] (mean −3), A = [2, 1, 0, −3] (mean 0)
    # Cov = (log π − mean)(A − mean) = [3·2, 1·1, −1·0, −3·−3] = [6, 1, 0, 9]
    # Band (0.5, 8): eligible tokens 0 (6) and 1 (1); token 3 (9) is outside.
    # r = 0.25: k = max(⌊0.25·4⌋, 1) = 1 -> token 0 (highest eligible) detached.
    p = PolicyLossParams(clip_cov_r=0.25, clip_cov_omega_low=0.5, clip_cov_omega_high=8.0)
    out, grad = run("clip_cov", [1.0] * 4, [2, 1, 0, -3], p, logprobs=[0.0, -2.0, -4.0, -6.0])
    close(out.loss[0], [-2.0, -1.0, 0.0, 3.0])  # detaching keeps the value
    close(grad, [0.0, -1.0, 0.0, 3.0])
    assert flags(out, "cov_clipped") == [True, False, False, False]
    # r = 0.5: k = 2 -> tokens 0 and 1.
    p2 = PolicyLossParams(clip_cov_r=0.5, clip_cov_omega_low=0.5, clip_cov_omega_high=8.0)
    out, grad = run("clip_cov", [1.0] * 4, [2, 1, 0, -3], p2, logprobs=[0.0, -2.0, -4.0, -6.0])
    close(grad, [0.0, 0.0, 0.0, 3.0])
    # Tiny r still detaches one token: max(⌊r·N⌋, 1).
    p3 = PolicyLossParams(clip_cov_r=1e-6, clip_cov_omega_low=0.5, clip_cov_omega_high=8.0)
    out, _ = run("clip_cov", [1.0] * 4, [2, 1, 0, -3], p3, logprobs=[0.0, -2.0, -4.0, -6.0])
    assert flags(out, "cov_clipped") == [True, False, False, False]


def test_clip_cov_skips_tokens_ppo_already_clipped():
    # Same as above, but token 0 has r = 2 with A = 2 > 0: PPO clips it (r > 1.2),
    # so it is not eligible and the detached token is token 1 (Cov 1).
    p = PolicyLossParams(clip_cov_r=0.25, clip_cov_omega_low=0.5, clip_cov_omega_high=8.0)
    out, grad = run("clip_cov", [2.0, 1.0, 1.0, 1.0], [2, 1, 0, -3], p, logprobs=[0.0, -2.0, -4.0, -6.0])
    assert flags(out, "cov_clipped") == [False, True, False, False]
    close(grad, [0.0, 0.0, 0.0, 3.0])


def test_reinforce_table():
    # loss = −A·log π: log π = [−1, −2], A = [1, −0.5] -> [1, −1]; gradient −A = [−1, 0.5].
    out, grad = run("reinforce", [1.3, 0.7], [1.0, -0.5], PolicyLossParams(), logprobs=[-1.0, -2.0])
    close(out.loss[0], [1.0, -1.0])
    close(grad, [-1.0, 0.5])
    close(out.diagnostics["ratio"][0], [1.3, 0.7])


def test_log_ratio_is_bounded_so_no_overflow():
    # A stale token with log-ratio 200 would overflow exp to inf; the ±20 clamp keeps it finite.
    lp = torch.tensor([[0.0]], requires_grad=True)
    out = get_policy_loss("ppo_clip")(
        lp, torch.tensor([[-200.0]]), torch.tensor([[-1.0]]), torch.tensor([[True]]), PolicyLossParams()
    )
    out.loss.sum().backward()
    assert math.isclose(out.loss.item(), math.exp(20.0), rel_tol=1e-6)
    assert torch.isfinite(lp.grad).all()
