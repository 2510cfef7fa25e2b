"""Weight sync from actor rank 0 to rollout ranks placed apart (glassrl.workers.weight_sync).

Processes from torch.multiprocessing (spawn, gloo, CPU), no Ray: actor ranks send, rollout
ranks receive into a model of their own (ModuleSink). After a sync every trained weight on
every rollout rank equals the actor's bit for bit (a broadcast copies bytes; nothing is
computed), so the comparisons are exact (torch.equal).

Cases: "toy", one actor rank and two rollout ranks (which hold a default group of their own,
still usable after the syncs), a model with a tied weight, a bfloat16 layer and a frozen
layer, buckets of 200 bytes, two syncs; "fsdp", two FSDP2 actor ranks (fully_shard runs on
CPU under gloo) gathering their shards for one rollout rank; "lora", a peft model whose
adapters alone travel (the frozen base is loaded from the same checkpoint on both sides), after
which the rollout model's logits equal the actor's. GPU (``gpu`` marker, skipped here): "fsdp-cuda",
an FSDP2 actor rank on the GPU syncing a CPU rollout rank over gloo (buckets staged through the
CPU); "nccl", actor and rollout rank on a GPU each, the sync over NCCL (needs 2 GPUs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from spawned import spawn_ranks
from torch import nn

from glassrl.workers.data_parallel import free_port
from glassrl.workers.sync_truth import Checker
from glassrl.workers.weight_sync import (
    Bucket,
    ModuleSink,
    Slot,
    WeightReceiver,
    WeightSender,
    plan_buckets,
    trained_parameters,
)

BUCKET_BYTES = 200
# case: (actor ranks, rollout ranks, actor device, rollout device, sync device)
CASES = {
    "toy": (1, 2, "cpu", "cpu", "cpu"),
    "fsdp": (2, 1, "cpu", "cpu", "cpu"),
    "lora": (1, 1, "cpu", "cpu", "cpu"),
    "fsdp-cuda": (1, 1, "cuda:0", "cpu", "cpu"),
    "nccl": (1, 1, "cuda:0", "cuda:1", "cuda"),
}


class Toy(nn.Module):
    """embed (tied to head) 11×6 float32, body 6→6 float32, half 6→4 bfloat16, frozen 4→4."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.body = nn.Linear(6, 6)
        self.half = nn.Linear(6, 4).to(torch.bfloat16)
        self.frozen = nn.Linear(4, 4).requires_grad_(False)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight


def test_buckets_by_size_and_dtype():
    # embed.weight 66 × 4 B = 264 B > 200: alone; body 144 + 24 B; half (bfloat16) 48 + 8 B: a new dtype.
    buckets = plan_buckets(trained_parameters(Toy()), BUCKET_BYTES)
    assert buckets == [
        Bucket(torch.float32, (Slot("embed.weight", (11, 6), 0, 66),)),
        Bucket(torch.float32, (Slot("body.weight", (6, 6), 0, 36), Slot("body.bias", (6,), 36, 6))),
        Bucket(torch.bfloat16, (Slot("half.weight", (4, 6), 0, 24), Slot("half.bias", (4,), 24, 4))),
    ]
    assert [b.numel for b in buckets] == [66, 42, 28]
    # Consecutive tensors only: float32 (embed, body), bfloat16 (half), float32 again (frozen).
    assert [b.dtype for b in plan_buckets(Toy().named_parameters(), 2**20)] == [
        torch.float32,
        torch.bfloat16,
        torch.float32,
    ]


def test_module_sink_names_a_mismatch():
    sink = ModuleSink(Toy())
    with pytest.raises(ValueError, match=r"body.weight \(6, 5\) sent, the rollout model has shape \(6, 6\)"):
        sink([("body.weight", torch.zeros(6, 5))])
    with pytest.raises(ValueError, match="nope.weight .* no such parameter"):
        sink([("nope.weight", torch.zeros(1))])


def _perturb(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:  # DTensor shards under FSDP2: the same draw on every rank, its own part
                noise = torch.randn(p.shape, generator=g).to(p.device, p.dtype)
                if hasattr(p, "full_tensor"):
                    from torch.distributed.tensor import distribute_tensor

                    noise = distribute_tensor(noise, p.device_mesh, p.placements)
                p.add_(noise)


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
        for n, p in model.named_parameters()
    }


def _tiny_lm(model_dir: str, lora: bool, device: str = "cpu"):
    from glassrl.models.loading import load_causal_lm

    model = load_causal_lm(model_dir, dtype="float32", device=device)
    if lora:
        from glassrl.models.lora import LoraSettings, apply_lora

        model = apply_lora(model, LoraSettings(r=2, target_modules="all-linear"), Path(model_dir))
    return model


def _rank(rank: int, case: str, ports: tuple[int, int], model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    sync_port, group_port = ports
    actors, rollouts, actor_device, rollout_device, sync_device = CASES[case]
    world = 1 + rollouts  # the sync group: actor rank 0 + the rollout ranks
    device = torch.device(actor_device if rank < actors else rollout_device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    result: dict = {}
    if rank < actors:  # ------------------------------------------------ an actor rank
        torch.manual_seed(0)
        if case.startswith("fsdp"):
            from glassrl.workers.data_parallel import DataParallelModel, init_group

            ctx = init_group("actor", rank, actors, "127.0.0.1", group_port, actor_device)
            model = DataParallelModel(_tiny_lm(model_dir, False, actor_device), ctx, fsdp=True).module
        else:
            model = Toy() if case == "toy" else _tiny_lm(model_dir, case == "lora", actor_device)
        check = case != "toy"  # the sync truth check rides along (glassrl.workers.sync_truth); the probe at sync 1
        sender = WeightSender(
            model, is_main=rank == 0, bucket_bytes=BUCKET_BYTES if case == "toy" else 4096, check=check
        )
        sender.join("127.0.0.1", sync_port, world, sync_device)
        for seed in (1, 2):  # two syncs: the group is used again
            _perturb(model, seed)
            sender.send(probe=seed == 1)
            result[f"sent{seed}"] = _state(model)
        result["buckets"] = len(sender.buckets)
        result["default_group"] = dist.is_initialized() and dist.get_world_size()
        if case == "lora":
            ids = torch.arange(3, 12)[None]
            result["logits"] = model(input_ids=ids).logits.detach()
    else:  # ------------------------------------------------------------ a rollout rank
        torch.manual_seed(rank)  # another initialisation than the actor's: only what is sent can match
        if case == "toy":  # the two rollout ranks' own group, which the sync must leave alone
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{group_port}", rank=rank - 1, world_size=2)
        model = Toy() if case == "toy" else _tiny_lm(model_dir, case == "lora", rollout_device)
        result["before"] = _state(model)
        checker = None if case == "toy" else Checker(model, f"rollout rank {rank - actors}")
        receiver = WeightReceiver(ModuleSink(model), checker)
        receiver.join("127.0.0.1", sync_port, rank - actors + 1, world, sync_device)
        for seed in (1, 2):
            verdict = receiver.receive_checked()
            result[f"verdict{seed}"] = verdict
            result[f"received{seed}"] = _state(model)
        result["tied"] = case != "toy" or model.head.weight is model.embed.weight
        if case == "toy":
            total = torch.tensor([float(rank)])
            dist.all_reduce(total)
            result["default_group"] = (dist.get_world_size(), total.item())
        if case == "lora":
            ids = torch.arange(3, 12)[None]
            result["logits"] = model(input_ids=ids).logits.detach()
    torch.save(result, Path(out) / f"rank{rank}.pt")
    if dist.is_initialized():
        dist.barrier()  # no rank tears gloo down while a peer still uses the connection (SIGABRT at exit)
        dist.destroy_process_group()


def _spawn(case: str, model_dir: Path, out: Path) -> list[dict]:
    nprocs = CASES[case][0] + CASES[case][1]
    spawn_ranks(_rank, (case, (free_port(), free_port()), str(model_dir), str(out)), nprocs, out)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(nprocs)]


GPU_CASES = [
    pytest.param(
        case,
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(torch.cuda.device_count() < gpus, reason=f"needs {gpus} CUDA device(s)"),
        ],
    )
    for case, gpus in (("fsdp-cuda", 1), ("nccl", 2))
]


@pytest.mark.parametrize("case", ["toy", "fsdp", "lora", *GPU_CASES])
def test_rollout_ranks_hold_the_actors_weights_bitwise(case, tiny_model_dir, tmp_path):
    ranks = _spawn(case, tiny_model_dir, tmp_path)
    actor, rollouts = ranks[0], ranks[CASES[case][0] :]
    trained = set(actor["sent1"])
    if case == "toy":
        assert actor["buckets"] == 3 and actor["default_group"] is False  # the sender's default group: none
        trained = {"embed.weight", "body.weight", "body.bias", "half.weight", "half.bias"}
    if case == "lora":
        trained = {n for n in actor["sent1"] if "lora_" in n}
        assert trained and len(trained) < len(actor["sent1"])
    if case == "fsdp":
        assert ranks[1]["sent2"].keys() == actor["sent2"].keys()
        assert all(torch.equal(ranks[1]["sent2"][n], t) for n, t in actor["sent2"].items())  # the same model
    for rollout in rollouts:
        for seed in (1, 2):
            sent, received = actor[f"sent{seed}"], rollout[f"received{seed}"]
            assert sent.keys() == received.keys()
            for name in sent:
                if name in trained or case.startswith("fsdp"):  # FSDP2 here trains every weight
                    assert torch.equal(received[name], sent[name]), (seed, name)
                    assert not torch.equal(received[name], rollout["before"][name]), name
                else:  # frozen: not sent, left as the rollout rank had it
                    assert torch.equal(received[name], rollout["before"][name]), name
        assert rollout["tied"]
        if case != "toy":  # the sync truth check proves both syncs; the probe ran at the first
            assert rollout["verdict1"].breach is None and rollout["verdict2"].breach is None
            if not case.startswith("fsdp"):  # FSDP2: the checksums, no probe (glassrl.workers.weight_sync)
                assert rollout["verdict1"].probe_diff is not None and rollout["verdict1"].probe_diff <= 1e-3
            assert rollout["verdict2"].probe_diff is None and rollout["verdict1"].tensors == len(actor["sent1"])
    if case == "toy":  # the rollout ranks' default group: still theirs (world 2: ranks 1 + 2 summed)
        assert [r["default_group"] for r in rollouts] == [(2, 3.0), (2, 3.0)]
    if case == "lora":  # adapters on the same frozen base: the same policy
        assert torch.equal(rollouts[0]["logits"], actor["logits"])
