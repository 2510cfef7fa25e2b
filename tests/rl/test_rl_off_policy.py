"""``algo.off_policy`` end to end on CPU (the local backend, the Hugging Face engine keeping its own
log-probs μ): each correction's weights and masks reach the policy loss, and its metrics are logged.
The engine and the trainer compute the same float32 numbers, so every ρ_i = π_old/μ is 1 ± 1e-4:
bounds set around or away from 1 decide what each correction must do."""

from __future__ import annotations

import pytest
from test_rl_rollout_is import VARIED_REWARD, _train

from run_helpers import logged_metrics


@pytest.mark.slow
def test_each_correction_reaches_the_policy_loss(fast, tmp_path):
    common = [*fast, VARIED_REWARD, "logging.report=false", "steps=1"]
    runs = {
        "plain": [],
        "decoupled": ["algo.off_policy.correction=decoupled"],  # w_i = ρ_i ≈ 1: the plain loss
        "icepop": ["algo.off_policy={correction: icepop, low: 1.5, high: 5}"],  # every ρ_i < 1.5: all dropped
        "geo": ["algo.off_policy={correction: geo_mask, low: 0.99, high: 1.01}"],  # every response kept
        "seq_tis": ["algo.off_policy={correction: seq_tis, cap: 0.5}"],  # Π ρ_i ≈ 1 > 0.5: every weight 0.5
    }
    for name, more in runs.items():
        _train([*common, *more, f"output_dir={tmp_path / name}"])
    plain, decoupled, icepop, geo, seq_tis = (logged_metrics(tmp_path / name)[1] for name in runs)

    assert "rollout/masked_share" not in plain
    loss = plain["actor/policy_loss"]
    assert decoupled["actor/policy_loss"] == pytest.approx(loss, rel=1e-3, abs=1e-7)
    assert decoupled["rollout/masked_share"] == 0.0
    assert decoupled["rollout/is_weight_max"] == pytest.approx(1.0, abs=1e-3)
    assert icepop["rollout/masked_share"] == 1.0 and icepop["actor/policy_loss"] == 0.0  # a mask, not a clip
    assert geo["rollout/masked_share"] == 0.0 and geo["actor/policy_loss"] == pytest.approx(loss, rel=1e-3, abs=1e-7)
    assert seq_tis["actor/rollout_is_clip_frac"] == 1.0
    assert seq_tis["actor/policy_loss"] == pytest.approx(0.5 * loss, rel=1e-3, abs=1e-7)
