"""rollout.engine=vllm on the Ray backend with the rollout placed apart (`make test-vllm`): vLLM runs
on the rollout rank, which receives the actor's weights by broadcast after each update
(glassrl.workers.weight_sync) and loads them into its engine (glassrl.rollout.vllm_sync, verified).

What it shows: the actor's broadcast ran after each update (perf/weight_sync_s; that it lands bit
for bit in the rank's model: tests/rl/test_rl_ray_rollout_apart.py), and the vLLM engine on the rank
sampled with that model's weights (rollout/logprob_diff_max, its log-probs against π_old, under 1e-3
at a learning rate where one step moves them by far more: skipping the engine's sync fails
tests/rollout/test_rollout_vllm_cpu.py's same check). Without the broadcast
(``workers.actor.weight_sync = None``) it fails: no perf/weight_sync_s."""

from __future__ import annotations

import json

import pytest

from glassrl.builtin.default_model import build_default_model
from glassrl.models.default_model import DefaultModelSpec
from helpers import RAY_ROLLOUT_APART, TINY_SPEC, preset_trainer, tiny_run_overrides

pytestmark = pytest.mark.vllm

ray = pytest.importorskip("ray")


# LoRA: the rank's peft model receives the adapters alone (the broadcast of what trains) and its
# engine syncs the adapter alone into vLLM (a new LoRARequest per version, verified: glassrl.rollout.vllm)
LORA = [
    "model.lora.r=4",
    "model.lora.alpha=8",
    "reward.sources=[{name: arith_verify, weight: 1.0, partial_credit: true}]",
]


@pytest.mark.parametrize("lora", [[], LORA], ids=["full", "lora"])
def test_grpo_with_vllm_on_a_rollout_rank_apart(lora, local_ray, prompt_files, tmp_path):
    if lora:
        pytest.importorskip("peft")
    model = tmp_path / "model"  # heads of 32: vLLM's CPU attention takes no head of 16
    build_default_model(model, seed=0, spec=DefaultModelSpec(**{**TINY_SPEC, "hidden_size": 64}))
    out = tmp_path / "run"
    trainer = preset_trainer(
        "grpo",
        [
            *tiny_run_overrides(model, prompt_files, out),
            "rollout.engine=vllm",
            "actor_optim.lr=0.01",  # one step moves the weights far enough to see a stale rollout
            "actor_optim.warmup_steps=0",
            "logging.report=false",
            *RAY_ROLLOUT_APART,
            *lora,
        ],
    )
    assert trainer.workers.rollout.group.role == "rollout"
    assert trainer.paths["rollout"].startswith("vLLM 0.32.0 on cpu")
    assert ("weights: the LoRA adapter alone" in trainer.paths["rollout"]) == bool(lora)
    trainer.train()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    diffs = {m["step"]: m["rollout/logprob_diff_max"] for m in rows if "rollout/logprob_diff_max" in m}
    assert sorted(diffs) == [1, 2] and all(d < 1e-3 for d in diffs.values()), diffs
    assert all(m["perf/weight_sync_s"] > 0 for m in rows if m["step"] > 0)  # the broadcast ran each update
    if lora:  # step 2's policy moved off the base (π_ref), and vLLM sampled with it: the adapter reached vLLM
        assert [m["kl/mean"] > 0 for m in rows if "kl/mean" in m] == [False, True]
