"""Weight sync: actor rank 0 broadcasts π_θ's trained weights to rollout ranks placed apart.

W: the rollout ranks. The sync group holds actor rank 0 (its rank 0) and the W rollout
ranks (1 … W). It is a torch.distributed process group of its own, built on a TCPStore of its
own, beside each process's default group (the actor's data-parallel group, the rollout ranks'
group), which it neither reads nor changes: ``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL``
when every member holds a GPU. OpenRLHF builds such a second "main" group with a copy of
torch's private ``_new_process_group_helper`` (openrlhf/utils/distributed_util.py), vLLM with
its ``StatelessProcessGroup`` + ``PyNcclCommunicator`` (examples/offline_inference/rlhf_utils.py);
here the public backend constructors on a ``PrefixStore`` do it, and collectives are called
on the backend object itself (no entry in torch.distributed's world of groups).

What travels: the trainable parameters (``requires_grad``), in ``named_parameters`` order (a tied
weight once): every parameter under full fine-tuning; under LoRA the adapters only, since both
sides load the frozen base from the same checkpoint (the rollout rank applies the same adapters
to it, and samples with them on). A vLLM engine would need merged weights instead; the config
refuses vLLM with LoRA.

Buckets: consecutive parameters of one dtype are packed into one flat buffer of at most
``bucket_bytes`` (a larger parameter is a bucket alone), one broadcast per bucket, so a model of
N tensors costs about size / bucket_bytes collectives instead of N (OpenRLHF broadcasts one per
parameter; verl and vLLM's RLHF examples bucket). Each side keeps one buffer per dtype, the size of
its largest bucket, from the first sync on (a buffer allocated at every sync costs its page faults
again); a bucket of one tensor is sent from the tensor itself. Rank 0 writes the layout (names,
shapes, offsets, dtypes) into the store once; the rollout ranks read it from there.

FSDP2: every actor rank gathers each sharded parameter (``DTensor.full_tensor()``, a collective of
the actor's default group, so all actor ranks call :meth:`WeightSender.send`); rank 0 packs and
broadcasts, the others drop the gathered tensors.

Receiving: per bucket, the receiver hands ``[(name, tensor), …]`` (views of the flat buffer, Hugging
Face names) to its ``load_weights``, the signature of a vLLM model's ``load_weights``
(glassrl.rollout.vllm calls that through ``collective_rpc``); :class:`ModuleSink` is the one for
a Hugging Face model: each tensor copied into the parameter of that name, in place.

The reference policy that follows the actor (algo.kl.ref_sync_every, TR-DPO) takes the same path:
actor rank 0 broadcasts to the reference ranks over a group of their own, and :class:`MixSink`
moves each reference parameter towards the one sent (θ_ref ← α·θ + (1 − α)·θ_ref, :func:`lerp_into`,
the very operation the in-process reference runs: glassrl.workers.local.LocalReference).

Versions: each sync starts with one broadcast of the weights' version (the actor updates they hold:
asynchronous training stages them by version, glassrl.workers.async_rollout) and whether a probe
follows, then the buckets.

The sync truth check (glassrl.workers.sync_truth, ``check.sync``): after the buckets, rank 0 sends the
fingerprints of every parameter it holds (the trained tensors it sent, and the frozen ones: a merged
LoRA leak changes the base) and, when asked, its log-probs of the probe batch (not under FSDP2); the
names and shapes are in the store (``CHECK_KEY``). The receiver keeps them (:attr:`WeightReceiver.sent`)
for its checker, which compares after loading (:meth:`WeightReceiver.receive_checked`, or at load time in
asynchronous training).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from glassrl.workers.sync_truth import COLUMNS, Checker, Verdict, fingerprint, full, probe_rows, probe_scores
from glassrl.workers.sync_truth import vocab_size as model_vocab

LoadWeights = Callable[[list[tuple[str, torch.Tensor]]], object]  # vLLM's model.load_weights signature
DEFAULT_BUCKET_BYTES = 256 * 2**20
LAYOUT_KEY = "layout"
CHECK_KEY = "check"  # {"names": [...], "probe": [2, R, L − 1]} when the sender checks, {} when not


@dataclass(frozen=True)
class Slot:
    """One parameter in a bucket: ``numel`` elements from ``offset`` of the flat buffer, viewed as ``shape``."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


@dataclass(frozen=True)
class Bucket:
    """One broadcast: a flat buffer of ``dtype`` holding ``slots`` back to back."""

    dtype: torch.dtype
    slots: tuple[Slot, ...]

    @property
    def numel(self) -> int:
        return self.slots[-1].offset + self.slots[-1].numel


def trained_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of what the optimiser changes, in ``named_parameters`` order (tied ones once)."""
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def plan_buckets(params: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[Bucket]:
    """Consecutive tensors of one dtype packed into buckets of at most ``bucket_bytes`` (a larger tensor alone)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes = {bucket_bytes}: must be >= 1")
    buckets: list[Bucket] = []
    slots: list[Slot] = []
    dtype, used = None, 0
    for name, p in params:
        size = p.numel() * p.element_size()
        if slots and (p.dtype != dtype or used + size > bucket_bytes):
            buckets.append(Bucket(dtype, tuple(slots)))
            slots, used = [], 0
        offset = slots[-1].offset + slots[-1].numel if slots else 0
        slots.append(Slot(name, tuple(p.shape), offset, p.numel()))
        dtype, used = p.dtype, used + size
    if slots:
        buckets.append(Bucket(dtype, tuple(slots)))
    return buckets


def _dumps(buckets: list[Bucket]) -> str:
    return json.dumps(
        [
            {
                "dtype": str(b.dtype).removeprefix("torch."),
                "slots": [[s.name, s.shape, s.offset, s.numel] for s in b.slots],
            }
            for b in buckets
        ]
    )


def _loads(text: str) -> list[Bucket]:
    return [
        Bucket(getattr(torch, b["dtype"]), tuple(Slot(n, tuple(shape), o, k) for n, shape, o, k in b["slots"]))
        for b in json.loads(text)
    ]


class SyncGroup:
    """A process group of its own: rank 0 (actor rank 0) listens on ``address:port``; gloo, or NCCL
    on ``device`` cuda. The store stays reachable (:meth:`store`) for the layout."""

    def __init__(
        self, address: str, port: int, rank: int, world_size: int, device: str = "cpu", timeout_s: float = 600.0
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        timeout = timedelta(seconds=timeout_s)
        tcp = dist.TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
        # The prefix keeps these keys apart from any other user of the store.
        self.store = dist.PrefixStore("glassrl/weight_sync", tcp)
        self._tcp = tcp  # the master's server lives as long as this object
        if self.device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.backend = dist.ProcessGroupNCCL(self.store, rank, world_size, options)
        else:
            self.backend = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """``tensor`` from rank 0 to every rank, in place (a collective of the group)."""
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        self.backend.broadcast([tensor], options).wait()


def _buffer(buffers: dict[torch.dtype, torch.Tensor], buckets: list[Bucket], bucket: Bucket, device) -> torch.Tensor:
    """The first ``bucket.numel`` elements of the kept buffer of ``bucket.dtype`` (made at the first call)."""
    if bucket.dtype not in buffers:
        largest = max(b.numel for b in buckets if b.dtype == bucket.dtype)
        buffers[bucket.dtype] = torch.empty(largest, dtype=bucket.dtype, device=device)
    return buffers[bucket.dtype][: bucket.numel]


class WeightSender:
    """An actor rank's side: every rank gathers (FSDP2), rank 0 (``is_main``) packs and broadcasts."""

    def __init__(
        self, model: nn.Module, is_main: bool, bucket_bytes: int = DEFAULT_BUCKET_BYTES, check: bool = False
    ) -> None:
        self.model, self.is_main, self.check = model, is_main, check
        self.buckets = plan_buckets(trained_parameters(model), bucket_bytes)
        self.group: SyncGroup | None = None
        self.buffers: dict[torch.dtype, torch.Tensor] = {}
        self.names = [name for name, _ in model.named_parameters()]  # what the check fingerprints
        self.probe = probe_rows(model_vocab(model)) if check else []
        # FSDP2 shards: the probe's forward outside the actor's own forward path mixes DTensor and tensor
        # (aten.embedding refuses it); the checksums still run (on the gathered tensors), the probe not
        self.sharded = any(isinstance(p, DTensor) for p in model.parameters())

    def join(self, address: str, port: int, world_size: int, device: str = "cpu") -> None:
        """Rank 0 of the sync group (rank 0 of the actor only; a no-op elsewhere); the layout into the store."""
        if not self.is_main:
            return
        self.group = SyncGroup(address, port, 0, world_size, device)
        self.group.store.set(LAYOUT_KEY, _dumps(self.buckets))
        check = {"names": self.names, "probe": [2, len(self.probe), len(self.probe[0]) - 1]} if self.check else {}
        self.group.store.set(CHECK_KEY, json.dumps(check))

    @torch.no_grad()
    def send(self, version: int = 0, probe: bool = False) -> None:
        """Broadcast ``version``, then the current trained weights, bucket by bucket (every actor rank calls
        it); with the check, the fingerprints of every parameter and (``probe``) the probe's log-probs."""
        probe = probe and self.check and not self.sharded
        if self.is_main:
            if self.group is None:
                raise RuntimeError("WeightSender.send before join")
            self.group.broadcast(torch.tensor([version, int(probe)], dtype=torch.long, device=self.group.device))
        params = dict(self.model.named_parameters())
        prints: dict[str, torch.Tensor] = {}
        for bucket in self.buckets:
            # Gathered on every rank (a collective of the actor group under FSDP2), in the same order.
            tensors = [full(params[s.name]) for s in bucket.slots]
            if not self.is_main:
                continue
            if self.check:  # the tensors the trainer holds, not the buffer sent: a packing fault shows
                prints.update((s.name, fingerprint(t)) for s, t in zip(bucket.slots, tensors))
            if len(tensors) == 1 and tensors[0].device == self.group.device and tensors[0].is_contiguous():
                self.group.broadcast(tensors[0])  # the root only reads it
                continue
            flat = _buffer(self.buffers, self.buckets, bucket, self.group.device)
            for slot, tensor in zip(bucket.slots, tensors):
                flat[slot.offset : slot.offset + slot.numel].copy_(tensor.reshape(-1))
            self.group.broadcast(flat)
        if self.check:
            self._send_check(params, prints, probe)

    def _send_check(self, params: dict[str, torch.Tensor], prints: dict[str, torch.Tensor], probe: bool) -> None:
        """The fingerprints of every parameter (the frozen ones gathered on every rank), then the probe's
        log-probs (a forward pass on every rank: under FSDP2 a collective)."""
        sent = {s.name for b in self.buckets for s in b.slots}
        frozen = {n: full(params[n]) for n in self.names if n not in sent}  # every rank: the same gathers
        logprobs = probe_scores(self.model, self.probe) if probe else None
        if not self.is_main:
            return
        rows = torch.stack([prints[n] if n in prints else fingerprint(frozen[n]) for n in self.names])
        self.group.broadcast(rows.to(self.group.device))
        if logprobs is not None:
            self.group.broadcast(logprobs.to(self.group.device))


class WeightReceiver:
    """A rollout rank's side: rank ``rank`` (1 … W) of the sync group; each bucket to ``load_weights``."""

    def __init__(self, load_weights: LoadWeights, checker: Checker | None = None) -> None:
        self.load_weights, self.checker = load_weights, checker
        self.group: SyncGroup | None = None
        self.buckets: list[Bucket] = []
        self.buffers: dict[torch.dtype, torch.Tensor] = {}
        self.check: dict = {}  # the sender's CHECK_KEY
        # the last sync's check data from the sender: (names, fingerprints (N, 4), probe log-probs or None)
        self.sent: tuple[list[str], torch.Tensor, torch.Tensor | None] | None = None

    def join(
        self, address: str, port: int, rank: int, world_size: int, device: str = "cpu", timeout_s: float = 600.0
    ) -> None:
        """Rank ``rank`` of the sync group; ``timeout_s``: the longest a receive may wait for rank 0."""
        self.group = SyncGroup(address, port, rank, world_size, device, timeout_s)
        self.buckets = _loads(self.group.store.get(LAYOUT_KEY).decode())  # waits for rank 0 to write it
        self.check = json.loads(self.group.store.get(CHECK_KEY).decode())

    @torch.no_grad()
    def receive(self) -> int:
        """The weights rank 0 sends now, loaded bucket by bucket (and what the check needs: :attr:`sent`);
        returns their version."""
        if self.group is None:
            raise RuntimeError("WeightReceiver.receive before join")
        header = torch.zeros(2, dtype=torch.long, device=self.group.device)  # version, probe follows
        self.group.broadcast(header)
        if self.checker is not None:
            self.checker.ahead()
        for bucket in self.buckets:
            flat = _buffer(self.buffers, self.buckets, bucket, self.group.device)
            self.group.broadcast(flat)
            weights = [(s.name, flat[s.offset : s.offset + s.numel].view(s.shape)) for s in bucket.slots]
            if self.checker is not None:
                self.checker.observe(weights)  # a mixing reference: what its sink must make of them
            # load_weights copies out before the buffer is written again (the next bucket)
            self.load_weights(weights)
        if self.check:
            names = self.check["names"]
            prints = torch.zeros(len(names), len(COLUMNS), dtype=torch.long, device=self.group.device)
            self.group.broadcast(prints)
            probe = None
            if header[1]:
                probe = torch.zeros(*self.check["probe"], dtype=torch.float32, device=self.group.device)
                self.group.broadcast(probe)
                probe = probe.cpu()
            self.sent = (names, prints.cpu(), probe)
        return int(header[0].item())

    def receive_checked(self) -> Verdict | None:
        """:meth:`receive`, then the checker's verdict on the weights now loaded (None without a check)."""
        start = time.perf_counter()
        version = self.receive()
        if self.checker is None or self.sent is None:
            return None
        payload = [s.name for b in self.buckets for s in b.slots]
        return self.checker.verdict(version, *self.sent, start, payload)


class ModuleSink:
    """``load_weights`` for a torch module: each named tensor copied (cast) into its parameter, in place."""

    def __init__(self, model: nn.Module) -> None:
        self.params = dict(model.named_parameters())

    def __call__(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        copy_into(self.params, weights)


@torch.no_grad()
def copy_into(targets: dict[str, torch.Tensor], weights: list[tuple[str, torch.Tensor]]) -> None:
    """Each named tensor of a bucket copied (cast) into the tensor of that name in ``targets``, in place."""
    for name, tensor in weights:
        target = targets.get(name)
        if target is None or target.shape != tensor.shape:
            found = "no such parameter" if target is None else f"shape {tuple(target.shape)}"
            raise ValueError(f"weight sync: {name} {tuple(tensor.shape)} sent, the rollout model has {found}")
        target.copy_(tensor)


class MixSink:
    """``load_weights`` for a reference that follows the actor: each named tensor mixed into the
    parameter of that name, θ_ref ← α·θ + (1 − α)·θ_ref (:func:`lerp_into`)."""

    def __init__(self, model: nn.Module, alpha: float) -> None:
        self.params, self.alpha = dict(model.named_parameters()), alpha

    def __call__(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        lerp_into(self.params, weights, self.alpha)


@torch.no_grad()
def lerp_into(targets: dict[str, torch.Tensor], weights: Iterable[tuple[str, torch.Tensor]], alpha: float) -> None:
    """θ_ref ← α·θ + (1 − α)·θ_ref for each named tensor θ, in place (TR-DPO's soft update, Gorbatovski
    et al. 2024, arXiv:2404.09656; α = 1 copies θ, its hard update). ``lerp_`` computes θ_ref + α·(θ − θ_ref)."""
    for name, tensor in weights:
        target = targets[name]
        target.lerp_(tensor.to(target.dtype), alpha)
