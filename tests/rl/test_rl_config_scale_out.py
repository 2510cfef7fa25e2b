"""The scale-out keys of TrainConfig (trainer.backend, ray.*, model.compute_dtype, model.lora,
rollout.engine, algo.rollout_is): each misuse is one GlassrlError line naming the key."""

from __future__ import annotations

import pytest

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.rl.config import TrainConfig

RAY = ["trainer.backend=ray"]

CASES = [
    (["ray.actor.world_size=2"], r"^ray: ignored: trainer\.backend = local"),
    ([*RAY, "ray.actor.world_size=0"], r"^ray\.actor\.world_size = 0: must be >= 1"),
    (  # one placement group under colocate: the actor's strategy places every role (issue 43)
        [*RAY, "ray.reference.nodes=spread"],
        r"^ray\.reference\.nodes = 'spread': ignored: ray\.placement = colocate places every role by ray\.actor\.nodes",
    ),
    ([*RAY, "ray.actor.nodes=strict"], r"ray\.actor\.nodes"),
    (
        [*RAY, "ray.actor.resources={CPU: 0}"],
        r"^ray\.actor\.resources = \{'CPU': 0\}: needs amounts >= 0, one of them > 0",
    ),
    # 8 prompts × 4 responses per mini-batch by default: 33 ranks would leave one without rows
    ([*RAY, "ray.actor.world_size=33"], r"^ray\.actor\.world_size = 33: more ranks than the 32 responses"),
    ([*RAY, "ray.rollout_ranks=2"], r"^ray\.rollout_ranks = 2: must lie in \[1, ray\.actor\.world_size = 1\]"),
    ([*RAY, "ray.fsdp=true"], r"^ray\.fsdp = True: sampling from FSDP2 shards is not built"),
    (
        [*RAY, "ray.rollout.world_size=2"],
        r"^ray\.rollout\.world_size = 2: ignored: ray\.rollout\.placement = with_actor",
    ),
    (
        [*RAY, "ray.rollout.placement=apart", "ray.rollout_ranks=1"],
        r"^ray\.rollout_ranks = 1: ignored: with ray\.rollout\.placement = apart",
    ),
    ([*RAY, "ray.rollout.placement=apart", "ray.rollout.world_size=0"], r"^ray\.rollout\.world_size = 0: must be >= 1"),
    ([*RAY, "ray.rollout.placement=apart", "ray.rollout.sync_bucket_mb=0"], r"^ray\.rollout\.sync_bucket_mb = 0"),
    (["rollout.vllm.sleep=false"], r"^rollout\.vllm: ignored: rollout\.engine = hf"),
    (["rollout.engine=vllm", "rollout.vllm.gpu_memory_utilization=1.5"], r"gpu_memory_utilization = 1\.5: must lie in"),
    (["model.lora.dropout=1.0"], r"^model\.lora\.dropout = 1\.0: must lie in \[0, 1\)"),
    (["model.lora.r=0"], r"^model\.lora\.r = 0: must be >= 1"),
    (["rollout.engine=vllm", "model.lora.r=1024"], r"^model\.lora\.r = 1024: rollout\.engine = vllm takes adapters"),
    (["algo.rollout_is.cap=0"], r"^algo\.rollout_is\.cap = 0(\.0)?: must be > 0"),
    (["model.compute_dtype=float16"], r"model\.compute_dtype"),
    (["algo.off_policy.correction=tis"], r"^algo\.off_policy\.correction = 'tis': unknown; valid: token_tis"),
    (
        ["algo.off_policy={correction: icepop, cap: 2}"],
        r"^algo\.off_policy\.cap = 2(\.0)?: ignored: icepop does not read it",
    ),
    (["algo.off_policy={correction: token_mis, cap: 0}"], r"^algo\.off_policy\.cap = 0(\.0)?: must be > 0"),
    (
        ["algo.off_policy={correction: geo_mask, low: 1.2}"],
        r"^algo\.off_policy\.low = 1\.2: must be <= algo\.off_policy\.high",
    ),
    (
        ["algo.rollout_is.cap=2", "algo.off_policy.correction=seq_tis"],
        r"^algo\.off_policy = 'seq_tis': algo\.rollout_is is set",
    ),
    (["rollout.max_staleness=-1"], r"^rollout\.max_staleness = -1: must be >= 0"),
    (["rollout.overlap=true", "rollout.max_staleness=2"], r"^rollout\.overlap = True: is rollout\.max_staleness: 1"),
    (["rollout.partial_rollouts=true"], r"^rollout\.partial_rollouts = True: ignored: rollout\.max_staleness = 0"),
    (
        ["rollout.max_staleness=1", "rollout.partial_rollouts=true"],
        r"^rollout\.partial_rollouts = True: trainer\.backend = local",
    ),
    (["rollout.max_staleness=2"], r"^rollout\.max_staleness = 2: trainer\.backend = local samples at most one"),
    (
        [*RAY, "rollout.max_staleness=1", "ray.rollout.placement=with_actor"],
        r"^rollout\.max_staleness = 1: samples ahead on rollout ranks of their own",
    ),
    ([*RAY, "rollout.overlap=true"], r"^rollout\.overlap = True: not wired into trainer\.backend = ray"),
]


@pytest.mark.parametrize(("overrides", "message"), CASES, ids=[" ".join(o) for o, _ in CASES])
def test_misuse_names_the_key(overrides, message):
    with pytest.raises(GlassrlError, match=message):
        load_config(TrainConfig, None, overrides)


def test_a_ray_config_loads():
    cfg = load_config(
        TrainConfig,
        None,
        [*RAY, "ray.actor.world_size=2", "ray.actor.resources={GPU: 1, CPU: 4}", "ray.reward={world_size: 2}"],
    )
    assert cfg.ray.actor.resources == {"GPU": 1, "CPU": 4} and cfg.ray.reward.world_size == 2
    assert cfg.ray.reward.resources == {"CPU": 1.0}  # a section's omitted keys keep their defaults


def test_fsdp_loads_with_the_rollout_apart():
    cfg = load_config(TrainConfig, None, [*RAY, "ray.fsdp=true", "ray.rollout={placement: apart, world_size: 2}"])
    assert cfg.ray.fsdp and cfg.ray.rollout.world_size == 2 and cfg.ray.rollout.resources == {"CPU": 1.0}


def test_ptx_loads_on_ray():  # PPO-ptx runs on the Ray ranks (tests/rl/test_rl_ray.py)
    cfg = load_config(TrainConfig, None, [*RAY, "algo.ptx_coef=0.1", "data.ptx=task:arith-verify"])
    assert cfg.algo.ptx_coef == 0.1
