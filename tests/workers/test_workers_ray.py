"""Ray backend (glassrl.workers.ray): 2 data-parallel actor ranks on a local Ray cluster.

Slow: each module run starts one local cluster (2 CPUs, a 100 MiB object store) shared
by its tests. Tolerance against the in-process update: as test_workers_data_parallel
(float32 weights after 4 AdamW steps at lr 1e-3: tests/helpers.adam_weights_close).
"""

from __future__ import annotations

from functools import partial

import dp_cases
import pytest
import torch
from dp_cases import actor_batch, build_dp_actor, build_reward_rank, build_rollout_rank, in_process_update, plan_for

from glassrl.errors import GlassrlError
from glassrl.models.loading import load_causal_lm
from glassrl.models.logprobs import response_logprobs
from glassrl.run.checkpoint import CheckpointManager
from helpers import adam_weights_close

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

from glassrl.workers.ray import RayActor, RayReward, RayRollout  # noqa: E402
from glassrl.workers.ray_cluster import RayCluster, RoleSpec, connect  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    connect(None, num_cpus=2, object_store_memory=100 * 2**20, log_to_driver=False)
    # The test's build function lives in a test module that Ray workers cannot import.
    ray.cloudpickle.register_pickle_by_value(dp_cases)
    yield
    ray.shutdown()


def _actor_cluster(model_dir) -> RayCluster:
    spec = RoleSpec("actor", 2, partial(build_dp_actor, str(model_dir)), resources={"CPU": 0.5})
    return RayCluster([spec], placement="colocate")


def _weights(actor: RayActor, path) -> dict[str, torch.Tensor]:
    actor.save_pretrained(str(path))
    return load_causal_lm(path, dtype="float32", device="cpu").state_dict()


def test_two_ray_ranks_update_like_the_in_process_worker(local_ray, tiny_model_dir, tmp_path):
    batch = actor_batch(tiny_model_dir)
    cluster = _actor_cluster(tiny_model_dir)
    try:
        actor = RayActor(cluster["actor"])
        # Log-probs: rows split over the ranks and put back in order.
        model = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu")
        with torch.no_grad():
            expected, _ = response_logprobs(model, batch["input_ids"], batch["attention_mask"], 7)
        logprobs, entropy = actor.compute_logprobs(batch)
        torch.testing.assert_close(logprobs, expected, rtol=0, atol=1e-6)
        assert entropy.shape == expected.shape

        metrics = actor.update(batch, plan_for(8))
        weights, local_metrics = in_process_update(tiny_model_dir, batch, plan_for(8))
        ray_weights = _weights(actor, tmp_path / "after")
        assert adam_weights_close(ray_weights, weights, tight=2e-6, lr=1e-3) is None
        assert metrics["actor/policy_loss"] == pytest.approx(local_metrics["actor/policy_loss"], rel=1e-5)

        # Checkpoint (HF export + DCP shards written by the ranks), another update, resume.
        manager = CheckpointManager(tmp_path / "checkpoints", keep=1)
        saved = manager.save(1, actor.state_dict())
        actor.update(batch, plan_for(8))
        actor.load_state_dict(manager.load(saved, required=set(actor.part_names)))
        resumed = _weights(actor, tmp_path / "resumed")
        assert all(torch.equal(resumed[k], w) for k, w in ray_weights.items())
    finally:
        cluster.shutdown()


def test_a_killed_worker_is_a_clear_error(local_ray, tiny_model_dir):
    batch = actor_batch(tiny_model_dir)
    cluster = _actor_cluster(tiny_model_dir)
    try:
        actor = RayActor(cluster["actor"])
        ray.kill(cluster["actor"].hosts[1])
        with pytest.raises(GlassrlError, match=r"^actor worker rank 1 of 2 died"):
            actor.update(batch, plan_for(8))
    finally:
        cluster.shutdown()


def test_sampling_and_scoring_split_over_ranks(local_ray, tiny_model_dir):
    from glassrl.data.formatting import format_prompts, prompt_text
    from glassrl.data.tasks import load_task
    from glassrl.models.loading import load_tokenizer
    from glassrl.rewards import RewardRequest, build_combined
    from glassrl.rollout.base import SamplingParams
    from glassrl.rollout.hf import HFRolloutEngine

    tokenizer = load_tokenizer(tiny_model_dir)
    records = load_task("arith-verify", "test", size=3)
    prompts = format_prompts(tokenizer, [r.prompt for r in records])
    greedy = SamplingParams(max_new_tokens=12, greedy=True)
    specs = [
        RoleSpec("rollout", 2, partial(build_rollout_rank, str(tiny_model_dir)), resources={"CPU": 0.5}),
        RoleSpec("reward", 2, build_reward_rank, resources={"CPU": 0.5}),
    ]
    cluster = RayCluster(specs, placement="separate")
    try:
        rollout = RayRollout(cluster["rollout"], pad_id=tokenizer.pad_token_id)
        batch = rollout.generate(prompts, n=2, params=greedy)  # 3 prompts: ranks get 1 and 2
        model = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu")
        local = HFRolloutEngine(model, tokenizer).generate(prompts, n=2, params=greedy, generator=torch.Generator())
        assert batch.texts == local.texts and batch.finish_reasons == local.finish_reasons
        assert batch.group_index.tolist() == local.group_index.tolist() == [0, 0, 1, 1, 2, 2]
        assert torch.equal(batch.lengths, local.lengths)
        assert len(rollout.state_dict()["rollout_rng"][1]) == 2  # one RNG state per rank

        rows = [records[int(g)] for g in batch.group_index]
        requests = [RewardRequest(prompt_text(tokenizer, r.prompt), t, r) for r, t in zip(rows, batch.texts)]
        scores = [r.score for r in RayReward(cluster["reward"]).score(requests)]
        assert scores == [r.score for r in build_combined([{"name": "arith_verify"}]).score(requests)]
    finally:
        cluster.shutdown()
