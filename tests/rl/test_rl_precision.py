"""``model.compute_dtype: bfloat16`` end to end on CPU: float32 master weights trained through
bfloat16 autocast (glassrl.models.precision), and the half-precision-weights combination refused."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.models import load_causal_lm
from glassrl.rl.config import TrainConfig
from run_helpers import logged_metrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VARIED_REWARD = "reward.sources=[{name: arith_verify, weight: 1.0, partial_credit: true}]"


def _trainer(overrides: list[str]):
    from glassrl.rl.loop import Trainer

    return Trainer(load_config(TrainConfig, EXAMPLES / "grpo.yaml", overrides), progress=False)


@pytest.mark.slow
def test_bf16_compute_trains_float32_weights(fast, tiny_model_dir, tmp_path):
    common = [*fast, VARIED_REWARD, "model.dtype=float32", "logging.report=false"]
    _trainer([*common, f"output_dir={tmp_path / 'fp32'}"]).train()
    trainer = _trainer([*common, "model.compute_dtype=bfloat16", f"output_dir={tmp_path / 'bf16'}"])
    trainer.train()

    model = trainer.workers.actor.model
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the master weights
    initial = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu").state_dict()
    assert any(not torch.equal(w, initial[k]) for k, w in model.state_dict().items())  # it trained

    fp32, bf16 = logged_metrics(tmp_path / "fp32"), logged_metrics(tmp_path / "bf16")
    assert all(math.isfinite(v) for row in bf16 for k, v in row.items() if k.startswith(("actor/", "advantage/")))
    # Phase 3 ran under autocast: the entropy of the same step-1 responses moves by bf16 rounding only.
    entropy32, entropy16 = fp32[1]["actor/entropy"], bf16[1]["actor/entropy"]
    assert entropy16 != entropy32 and entropy16 == pytest.approx(entropy32, abs=0.05)


def test_bf16_compute_on_bf16_weights_is_refused():
    with pytest.raises(GlassrlError, match=r"^model.dtype = 'bfloat16': model.compute_dtype = bfloat16 needs float32"):
        load_config(TrainConfig, None, ["model.compute_dtype=bfloat16", "model.dtype=bfloat16"])
