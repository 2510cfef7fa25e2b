"""``algo.rollout_is`` end to end on CPU with the Hugging Face engine keeping its own log-probs:
the mismatch is logged per step, and truncated importance sampling weighs the policy loss."""

from __future__ import annotations

from pathlib import Path

import pytest

from glassrl.config import load_config
from glassrl.rl.config import TrainConfig
from run_helpers import logged_metrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VARIED_REWARD = "reward.sources=[{name: arith_verify, weight: 1.0, partial_credit: true}]"


def _train(overrides: list[str]) -> None:
    from glassrl.rl.loop import Trainer

    Trainer(load_config(TrainConfig, EXAMPLES / "grpo.yaml", overrides), progress=False).train()


@pytest.mark.slow
def test_mismatch_is_logged_and_tis_weighs_the_loss(fast, tmp_path):
    common = [*fast, VARIED_REWARD, "logging.report=false"]
    _train([*common, f"output_dir={tmp_path / 'plain'}"])
    _train([*common, "algo.rollout_is.cap=2.0", f"output_dir={tmp_path / 'tis'}"])
    # A cap below every ratio (all ≈ 1): each weight is the cap, the step-1 loss exactly halved
    _train([*common, "algo.rollout_is.cap=0.5", f"output_dir={tmp_path / 'cut'}"])
    plain, tis, cut = (logged_metrics(tmp_path / name) for name in ("plain", "tis", "cut"))

    assert "rollout/logprob_diff_mean" not in plain[1]  # no engine log-probs without rollout_is
    for row in tis[1:]:
        # Same float32 model sampling and scoring: the engine's log-probs are the trainer's to 1e-4.
        assert 0 <= row["rollout/logprob_diff_mean"] <= row["rollout/logprob_diff_max"] < 1e-4
        assert row["actor/rollout_is_clip_frac"] == 0.0
    # Weights of 1 ± 1e-4: the same update as without the correction, to that precision.
    for a, b in zip(plain[1:], tis[1:]):
        assert b["actor/policy_loss"] == pytest.approx(a["actor/policy_loss"], rel=1e-3, abs=1e-7)
    # Cut at 0.5 (step 1: the same responses and π_old as the plain run).
    assert cut[1]["actor/rollout_is_clip_frac"] == 1.0
    assert cut[1]["actor/policy_loss"] == pytest.approx(0.5 * plain[1]["actor/policy_loss"], rel=1e-3, abs=1e-7)
