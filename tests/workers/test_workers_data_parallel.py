"""Data parallelism inside a role (glassrl.workers.data_parallel).

2 ranks (torch.multiprocessing spawn, gloo, CPU) against 1 process on the same batch,
once with DDP replicas and once with FSDP2 shards (fully_shard runs on CPU under
gloo too; its GPU/NCCL run is the `gpu` test at the end): the update (the one loop,
glassrl.rl.update.run_updates, with the ranks' collectives), its on-policy form with
PPO-ptx, whitening through the ``reduce`` hook, and a DCP save/load round trip of the
sharded state.

Tolerance against one process: float32 weights after 4 AdamW steps at lr 1e-3
(each weight moves by up to 4e-3) agree to atol 2e-6, 0.2 % of one step, but for at most 0.1 % of
them, which must agree to 2.5 % of one step (tests/helpers.adam_weights_close): the gradients are
summed in another order, and Adam's g/√v amplifies that where |g| is tiny; measured max |Δw| =
3.8e-7 for DDP and FSDP2 on one CPU, 3.4e-6 on one element on an AVX-512 Xeon (2026-11-28). Loss terms and the
gradient norm
agree to rtol 1e-5. FSDP2 with bf16 compute (MixedPrecisionPolicy) keeps float32
master weights; its update is compared by direction (cosine > 0.9), bf16 rounding
being far above the float tolerance.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dp_cases import (
    PTX,
    actor_batch,
    dp_kwargs,
    in_process_on_policy,
    in_process_update,
    on_policy_batch,
    optimizer_for,
    plan_for,
    ptx_pairs,
)
from spawned import spawn_ranks

from glassrl.algos.masked import masked_whiten
from glassrl.models.loading import load_causal_lm
from glassrl.rl.update import run_updates
from glassrl.workers.sharding import balanced_partitions, shard_plan, shard_rows
from helpers import adam_weights_close


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor: a DTensor (FSDP2 shard) gathered."""
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().clone()


def _rank(rank: int, world: int, port: int, model_dir: str, out: str, fsdp: bool) -> None:
    torch.set_num_threads(1)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from glassrl.workers.data_parallel import (
        DataParallelModel,
        all_reduce_sum,
        init_group,
        load_sharded,
        save_sharded,
    )

    def weights(dp):  # full (gathered) weights by the model's own names
        full = get_model_state_dict(dp.wrapped, options=StateDictOptions(full_state_dict=True))
        return {k.removeprefix("model."): v.detach().clone() for k, v in full.items()}

    def optim_state(optimizer):
        return {k: {n: _full(t) for n, t in v.items()} for k, v in optimizer.state_dict()["state"].items()}

    device = "cuda" if torch.cuda.is_available() and fsdp else "cpu"
    if device == "cuda":
        torch.cuda.set_device(rank)
    ctx = init_group("actor", rank, world, "127.0.0.1", port, device)
    batch = {k: v.to(device) for k, v in actor_batch(Path(model_dir)).items()}
    local_batch, local_plan = shard_plan(batch, plan_for(8), world)[rank]

    def replica(compute="float32"):
        model = load_causal_lm(model_dir, dtype="float32", device=device)
        return DataParallelModel(model, ctx, fsdp=fsdp, compute=compute)

    dp = replica()
    optimizer, scheduler = optimizer_for(dp.module)
    result = {"metrics": run_updates(dp.module, optimizer, scheduler, local_batch, local_plan, **dp_kwargs(dp))}
    result["weights"] = weights(dp)

    # Whitening over both ranks' tokens, through the reduce hook.
    rows = shard_rows(batch, world)[rank]
    whitened = masked_whiten(batch["advantages"][rows], batch["response_mask"][rows], reduce=all_reduce_sum)
    result["whitened"] = (rows, whitened.cpu())

    # DCP: save, then load into a fresh replica and optimiser.
    save_sharded(dp, optimizer, scheduler, Path(out) / "dcp")
    fresh = replica()
    fresh_optimizer, fresh_scheduler = optimizer_for(fresh.module)
    load_sharded(fresh, fresh_optimizer, fresh_scheduler, Path(out) / "dcp")
    result["reloaded"] = weights(fresh)
    result["saved_optim"], result["reloaded_optim"] = optim_state(optimizer), optim_state(fresh_optimizer)
    result["steps"] = (scheduler.last_epoch, fresh_scheduler.last_epoch)

    # The on-policy update (its forward gives log π_old) with PPO-ptx: this rank's rows, and its part of the
    # supervised pairs, split by tokens as glassrl.workers.ray.RayActor splits them.
    rows = {**on_policy_batch(Path(model_dir)), "row": torch.arange(8)}
    on_batch, on_plan = shard_plan({k: v.to(device) for k, v in rows.items()}, [torch.arange(8)], world)[rank]
    pairs = ptx_pairs()
    mine = [pairs[i] for i in balanced_partitions([len(p) + len(r) for p, r in pairs], world)[rank]]
    on_policy = replica()
    on_optimizer, on_scheduler = optimizer_for(on_policy.module)
    outputs: dict[str, torch.Tensor] = {}
    kwargs = {**dp_kwargs(on_policy), "ptx": PTX, "ptx_pairs": [mine], "forward_outputs": outputs}
    on_metrics = run_updates(on_policy.module, on_optimizer, on_scheduler, on_batch, on_plan, **kwargs)
    outputs = {k: v.cpu() for k, v in outputs.items()}
    result["on_policy"] = (on_metrics, weights(on_policy), on_batch["row"].cpu(), outputs)

    if fsdp:  # bf16 compute: the parameters FSDP2 keeps (the optimiser's) stay float32
        mixed = replica("bfloat16")
        mixed_optimizer, mixed_scheduler = optimizer_for(mixed.module)
        run_updates(mixed.module, mixed_optimizer, mixed_scheduler, local_batch, local_plan, **dp_kwargs(mixed))
        result["mixed_dtypes"] = {p.dtype for p in mixed.module.parameters()}
        result["mixed_weights"] = weights(mixed)
    torch.save({k: v for k, v in result.items()}, Path(out) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


def _spawn(model_dir, out: Path, fsdp: bool, world: int = 2) -> list[dict]:
    from glassrl.workers.data_parallel import free_port

    spawn_ranks(_rank, (world, free_port(), str(model_dir), str(out), fsdp), world, out)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module", params=["ddp", "fsdp2"])
def two_ranks(request, tiny_model_dir, tmp_path_factory):
    return request.param, _spawn(tiny_model_dir, tmp_path_factory.mktemp(request.param), request.param == "fsdp2")


@pytest.fixture(scope="module")
def one_process(tiny_model_dir):
    return in_process_update(tiny_model_dir, actor_batch(tiny_model_dir), plan_for(8))


def test_two_ranks_update_like_one_process(tiny_model_dir, two_ranks, one_process):
    _, ranks = two_ranks
    weights, metrics = one_process
    initial = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu").state_dict()
    assert max((weights[k] - v).abs().max().item() for k, v in initial.items()) > 1e-3  # the update moved them
    for rank in ranks:
        assert adam_weights_close(rank["weights"], weights, tight=2e-6, lr=1e-3) is None
        # Term values and the gradient norm are global sums: equal to one process's.
        for key in ("actor/policy_loss", "actor/kl_loss", "actor/entropy_loss", "actor/grad_norm", "actor/lr"):
            assert rank["metrics"][key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-7), key
        assert set(rank["metrics"]) == set(metrics)
    assert ranks[0]["metrics"] == ranks[1]["metrics"]


@pytest.fixture(scope="module")
def one_process_on_policy(tiny_model_dir):
    return in_process_on_policy(tiny_model_dir, on_policy_batch(tiny_model_dir), ptx_pairs())


def test_on_policy_update_with_ptx_on_two_ranks_like_one_process(two_ranks, one_process_on_policy):
    """The same loop on the ranks: PPO-ptx's term (each rank its pairs; FSDP2 pads the rank with fewer
    micro-batches) and the on-policy forward outputs, each rank's rows, as one process computes them."""
    weights, metrics, outputs = one_process_on_policy
    assert metrics["actor/ptx_loss"] > 0
    ranks = [rank["on_policy"] for rank in two_ranks[1]]
    assert sorted(torch.cat([rows for _, _, rows, _ in ranks]).tolist()) == list(range(8))
    for rank_metrics, rank_weights, rows, rank_outputs in ranks:
        assert adam_weights_close(rank_weights, weights, tight=2e-6, lr=1e-3) is None
        assert set(rank_metrics) == set(metrics)
        for key in ("actor/policy_loss", "actor/kl_loss", "actor/ptx_loss", "actor/grad_norm", "actor/lr"):
            assert rank_metrics[key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-7), key
        for key in ("logprobs", "entropy"):
            torch.testing.assert_close(rank_outputs[key], outputs[key][rows], rtol=0, atol=1e-6)
    assert ranks[0][0] == ranks[1][0]


def test_whitening_over_ranks_is_global(tiny_model_dir, two_ranks):
    batch = actor_batch(tiny_model_dir)
    expected = masked_whiten(batch["advantages"], batch["response_mask"])
    for rank in two_ranks[1]:
        rows, whitened = rank["whitened"]
        torch.testing.assert_close(whitened, expected[rows], rtol=1e-5, atol=1e-6)


def test_sharded_checkpoint_round_trip(two_ranks):
    for rank in two_ranks[1]:
        for key, value in rank["weights"].items():
            assert torch.equal(rank["reloaded"][key], value), key
        assert rank["saved_optim"].keys() == rank["reloaded_optim"].keys()
        for param, state in rank["saved_optim"].items():
            for name, tensor in state.items():
                assert torch.equal(rank["reloaded_optim"][param][name], tensor), (param, name)
        assert rank["steps"][0] == rank["steps"][1] == 4


def test_fsdp2_bf16_compute_keeps_fp32_masters(tiny_model_dir, two_ranks, one_process):
    mode, ranks = two_ranks
    if mode != "fsdp2":
        pytest.skip("FSDP2's mixed-precision policy")
    weights, _ = one_process
    initial = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu").state_dict()
    for rank in ranks:
        assert rank["mixed_dtypes"] == {torch.float32}
        fp32 = torch.cat([(weights[k] - v).flatten() for k, v in initial.items()])
        mixed = torch.cat([(rank["mixed_weights"][k].cpu() - v).flatten() for k, v in initial.items()])
        assert torch.nn.functional.cosine_similarity(mixed, fp32, dim=0) > 0.9


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fsdp2_on_gpus_updates_like_one_process(tiny_model_dir, tmp_path, one_process):
    world = torch.cuda.device_count()  # NCCL: one GPU per rank
    ranks = _spawn(tiny_model_dir, tmp_path, fsdp=True, world=world)
    weights, metrics = one_process
    for rank in ranks:
        diff = max((rank["weights"][k].cpu() - w).abs().max().item() for k, w in weights.items())
        assert diff < 1e-4, diff  # GPU matmuls (TF32 off by default in float32) differ from CPU's
        assert rank["metrics"]["actor/policy_loss"] == pytest.approx(metrics["actor/policy_loss"], rel=1e-3)
        assert rank["mixed_dtypes"] == {torch.float32}
