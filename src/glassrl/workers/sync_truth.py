"""The sync truth check: proof, after every weight sync, that the sampler holds the trainer's weights.

Runs that finish and are wrong often had weights that never reached the sampler: a sleep mode that
dropped them (TRL #5312), LoRA syncs that shipped no adapters (verl #7495), merged LoRA weights sent
as base weights (miles #1087), a ``load_weights`` that corrupted a layout (SkyRL #1680). Each sync
here is followed by two checks (``check.*``, glassrl.rl.config_check), on by default:

- **Checksums, every sync**: each side fingerprints every parameter of its model (the trainer the
  tensors it holds, not the buffers it sent; the sampler its parameters after loading):
  :func:`fingerprints`, one row per tensor of four int64 numbers. Columns 0–1 are exact and
  order-free: the sum of the tensor's raw bits read as integers and the same sum weighted by the
  element's position (i mod 1021 + 1), products wrapping in the bits' width, sums in int64 (wrapping:
  addition stays associative, so the thread count that sums them cannot change the answer). A copy
  that landed matches both bit for bit; a dropped tensor, a stale bucket, zeroed weights or a permuted
  layout changes them (a permutation keeps a plain sum; the positional one moves). Columns 2–3 are
  float64 sums (Σx, Σ|x|) viewed as int64 for the trip, which the messages quote. One tensor of N × 4
  travels per sync, after the weights.
- **A reference that mixes the actor in** (θ_ref ← α·θ + (1 − α)·θ_ref, TR-DPO) holds neither side's
  weights, so it is checked exactly in two halves (:meth:`Checker.observe`): each tensor that reaches
  its ``load_weights`` must be the trainer's bit for bit, and the parameter after the sync must be
  ``torch.lerp`` of the one before and that tensor, bit for bit (the expected result is computed one
  tensor at a time before the sink runs; ``lerp`` is elementwise, so it is the same bits).
- **The probe, every ``check.sync_probe_every`` syncs**: a fixed batch of token sequences
  (:func:`probe_rows`) re-scored by both sides; the first token whose log-prob differs by more than
  its tolerance (glassrl.rollout.vllm_sync.Tolerance: per token, from the trainer's logits) is named
  (:func:`first_moved`). It sees what checksums cannot: adapters loaded but
  not applied, a kernel that reads a layout wrongly.
- **LoRA**: the sampler's adapters must be active and unmerged (:func:`adapters_not_applied`).

What a check finds is a :class:`Verdict` (picklable: it travels from a Ray rank to the driver); the
driver's :class:`SyncLog` gathers them for the step (glassrl.rl.loop: metrics ``sync/*``, the console
and ``sync.jsonl``; a breach stops the run or warns, ``check.on_sync_breach``).

The local one-process trainer has no separate sampler (the actor's own module samples), so there
nothing moves but the reference that follows the actor (algo.kl.ref_sync_every): that mix is checked.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from glassrl.rollout.vllm_sync import Tolerance, actor_probe, probe_breach, probe_ids, tolerance

PERIOD = 1021  # positions are weighted i mod PERIOD + 1 (a prime: a row permutation of any width moves the sum)
COLUMNS = ("bits", "bits_positional", "sum", "sum_abs")
PROBE_ROWS = 2
_LAYER = re.compile(r"\.(?:layers|layer|h|blocks)\.(\d+)\.")
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def full(p: torch.Tensor) -> torch.Tensor:
    """The whole tensor (an FSDP2 shard gathered: a collective of its group), detached."""
    return p.full_tensor() if isinstance(p, DTensor) else p.detach()


_WEIGHTS: dict[torch.device, torch.Tensor] = {}  # i mod PERIOD + 1, int32, kept per device (grown on demand)


def _position_weights(n: int, device: torch.device) -> torch.Tensor:
    kept = _WEIGHTS.get(device)
    if kept is None or kept.numel() < n:
        kept = _WEIGHTS[device] = torch.arange(n, dtype=torch.int32, device=device) % PERIOD + 1
    return kept[:n]


@torch.no_grad()
def fingerprint(tensor: torch.Tensor) -> torch.Tensor:
    """(4,) int64: the columns of :data:`COLUMNS` for one tensor (module docstring). The products
    bits × weight wrap in int32 and the sums in int64: both deterministic, so the columns are exact."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype.is_floating_point:
        bits = flat.view(_INT_VIEW[flat.element_size()])
    else:
        bits = flat
    if bits.dtype == torch.int8:
        bits = bits.int()
    weights = _position_weights(flat.numel(), flat.device).to(bits.dtype)
    exact = torch.stack([bits.sum(dtype=torch.int64), (bits * weights).sum(dtype=torch.int64)])
    sums = torch.stack([flat.sum(dtype=torch.float64), flat.abs().sum(dtype=torch.float64)])
    return torch.cat([exact, sums.view(torch.int64)]).cpu()


def fingerprints(named: Iterable[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """(N, 4) int64: :func:`fingerprint` of each tensor, in order."""
    rows = [fingerprint(t) for _, t in named]
    return torch.stack(rows) if rows else torch.zeros(0, len(COLUMNS), dtype=torch.int64)


def floats(prints: torch.Tensor) -> torch.Tensor:
    """(N, 2) float64: the float columns (Σx, Σ|x|) of fingerprints."""
    return prints[:, 2:].contiguous().view(torch.float64)


def layer_of(name: str) -> str:
    """'layer 3' for model.layers.3.mlp.up_proj.weight; 'no layer' for embeddings, norms, heads."""
    match = _LAYER.search(name)
    return f"layer {match.group(1)}" if match else "no layer"


def exact_mismatch(
    names: list[str], sent: torch.Tensor, got: torch.Tensor, sides: tuple[str, str] = ("trainer", "sampler")
) -> tuple[str, str] | None:
    """The first tensor whose exact columns differ, and how (``sides``: what ``sent`` and ``got`` are, in
    words); None when every tensor matches bit for bit."""
    want_side, have_side = sides
    for i in torch.nonzero((sent[:, :2] != got[:, :2]).any(1)).flatten().tolist():
        want, have = floats(sent[i : i + 1])[0].tolist(), floats(got[i : i + 1])[0].tolist()
        if have[1] == 0 and want[1] != 0:
            how = f"the {have_side}'s copy is all zeros ({want_side} Σ|x| = {want[1]:.6g})"
        elif have[0] == want[0] and have[1] == want[1]:
            how = (
                f"the same values in another order (Σx = {want[0]:.6g}, Σ|x| = {want[1]:.6g}; the positional sum moved)"
            )
        else:
            how = (
                f"{want_side} Σx = {want[0]:.6g}, Σ|x| = {want[1]:.6g}; "
                f"{have_side} Σx = {have[0]:.6g}, Σ|x| = {have[1]:.6g}"
            )
        return names[i], how
    return None


def probe_rows(vocab_size: int) -> list[list[int]]:
    """The fixed probe batch: PROBE_ROWS sequences spread over the vocabulary (no tokenizer needed)."""
    first = probe_ids(vocab_size, 64)
    return [[(t + 97 * r) % vocab_size for t in first] for r in range(PROBE_ROWS)]


def vocab_size(model: nn.Module) -> int:
    return int(model.get_input_embeddings().weight.shape[0])


@torch.no_grad()
def probe_scores(model: nn.Module, rows: list[list[int]]) -> torch.Tensor:
    """(2, R, L − 1) float32: [0] log π(row[t] | row[:t]) of each probe row, [1] the spread of the logits
    at each position (glassrl.rollout.vllm_sync.actor_probe)."""
    training = model.training
    model.eval()  # no dropout: both sides score the same function
    try:
        return torch.stack([actor_probe(model, row) for row in rows], 1)
    finally:
        model.train(training)


def first_moved(
    rows: list[list[int]], trainer: torch.Tensor, sampler: torch.Tensor, tol: Tolerance
) -> tuple[float, str | None]:
    """The largest |trainer − sampler| over the probe, and the first token (row-major) beyond its
    tolerance (``trainer``: :func:`probe_scores`, whose spreads set it; ``sampler``: log-probs)."""
    worst, _, at, how = probe_breach(sampler, trainer, tol)
    if at is None:
        return worst, None
    r, t = at
    return worst, (
        f"probe row {r}, token {t + 1} (id {rows[r][t + 1]}): trainer log-prob {float(trainer[0, r, t]):.5g}, "
        f"sampler {float(sampler[r, t]):.5g}: {how}"
    )


def adapters_not_applied(model: nn.Module) -> list[str]:
    """The LoRA layers of ``model`` (peft) whose adapters would not act on a forward pass: disabled,
    merged into the base (then sent adapters would count twice), or none of them active."""
    bad = []
    for name, module in model.named_modules():
        if not hasattr(module, "lora_A") or not len(module.lora_A):
            continue
        active = set(getattr(module, "active_adapters", ())) & set(module.lora_A.keys())
        if getattr(module, "disable_adapters", False) or getattr(module, "merged", False) or not active:
            bad.append(name)
    return bad


@dataclass(frozen=True)
class Verdict:
    """What one sync's check found on one receiver (``where``: "rollout rank 1", "reference rank 0", …).

    ``breach``: None when the sync is proven, else the sentence naming the tensor, its layer and, with a
    probe, the first token whose log-prob moved. ``probe_diff``: the probe's largest |Δ log-prob| (None
    when no probe ran). ``seconds``: the receiver's time checking."""

    where: str
    version: int
    tensors: int
    breach: str | None = None
    tensor: str | None = None
    probe_diff: float | None = None
    seconds: float = 0.0


class Checker:
    """A receiver's side: its model's parameters fingerprinted after a sync and compared with the
    trainer's (``alpha``: a reference that mixes the actor in; 1 = a copy)."""

    def __init__(self, model: nn.Module, where: str, alpha: float | None = None, tol: float | None = None) -> None:
        self.model, self.where, self.alpha = model, where, alpha
        self.params = dict(model.named_parameters())
        dtype = next(model.parameters()).dtype
        self.tol = tolerance(dtype, tol)
        self.received: dict[str, torch.Tensor] = {}  # a mixing receiver: fingerprints of what reached the sink
        self.expected: dict[str, torch.Tensor] = {}  # … and of lerp(θ_ref, θ, α) computed before the sink ran

    def mine(self, names: list[str]) -> tuple[torch.Tensor, str | None]:
        missing = [n for n in names if n not in self.params]
        if missing:
            return fingerprints([]), missing[0]
        return fingerprints((n, self.params[n]) for n in names), None

    def ahead(self) -> None:
        """A sync begins: what the last one observed is forgotten."""
        self.received, self.expected = {}, {}

    @torch.no_grad()
    def observe(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """A mixing receiver, before its sink takes ``weights``: each tensor's fingerprint, and that of the
        parameter the mix must produce (``torch.lerp``, as glassrl.workers.weight_sync.lerp_into runs it)."""
        if self.alpha is None:
            return
        for name, tensor in weights:
            target = self.params.get(name)
            if target is not None:
                self.received[name] = fingerprint(tensor)
                self.expected[name] = fingerprint(torch.lerp(target.detach(), tensor.to(target.dtype), self.alpha))

    def verdict(
        self,
        version: int,
        names: list[str],
        sent: torch.Tensor,
        probe: torch.Tensor | None,
        start: float,
        payload: list[str] | None = None,
    ) -> Verdict:
        """Compare after loading (module docstring); ``probe``: the trainer's probe log-probs, or None;
        ``payload``: the names the sync carried (a mixing receiver checks those)."""
        got, missing = self.mine(names)
        n = len(names)
        if missing is not None:
            return self._breach(version, n, missing, "the sampler's model has no such tensor", None, start)
        found = exact_mismatch(names, sent, got) if self.alpha is None else self._mix(names, sent, got, payload)
        if found is not None:
            return self._breach(version, n, *found, None, start)
        bad = adapters_not_applied(self.model)
        if bad:
            how = "LoRA adapters loaded but not applied (disabled, merged or inactive)"
            return self._breach(version, n, f"{bad[0]} (and {len(bad) - 1} more)", how, None, start)
        if probe is None or self.alpha is not None:
            return Verdict(self.where, version, n, seconds=time.perf_counter() - start)
        rows = probe_rows(vocab_size(self.model))
        worst, token = first_moved(rows, probe, probe_scores(self.model, rows)[0], self.tol)
        if token is not None:
            return self._breach(version, n, "the probe batch", token, worst, start)
        return Verdict(self.where, version, n, probe_diff=worst, seconds=time.perf_counter() - start)

    def _mix(self, names, sent, got, payload) -> tuple[str, str] | None:
        """The first tensor of the payload that did not reach the sink, reached it other than the trainer
        sent it, or was not mixed in as lerp(θ_ref, θ, α)."""
        row = {name: i for i, name in enumerate(names)}
        for name in payload if payload is not None else names:
            if name not in self.received:
                return name, "sent, but never reached the reference's load_weights"
            i = row[name]
            if not torch.equal(self.received[name][:2], sent[i, :2]):
                found = exact_mismatch([name], sent[i : i + 1], self.received[name][None], ("trainer", "arrived"))
                return name, f"arrived other than the trainer sent it: {found[1]}"
            if not torch.equal(self.expected[name][:2], got[i, :2]):
                found = exact_mismatch([name], self.expected[name][None], got[i : i + 1], ("expected", "reference"))
                return name, f"not mixed in as α·θ + (1 − α)·θ_ref (α = {self.alpha:g}): {found[1]}"
        return None

    def _breach(self, version, n, tensor, how, probe_diff, start) -> Verdict:
        text = f"{self.where}, weights of version {version}: {tensor} ({layer_of(tensor + '.')}): {how}"
        return Verdict(self.where, version, n, text, tensor, probe_diff, time.perf_counter() - start)


@dataclass
class SyncLog:
    """The driver's: every verdict of the step, drained once a step by the loop (:meth:`drain`)."""

    verdicts: list[Verdict] = field(default_factory=list)
    engines: list[list] = field(default_factory=list)  # [engine, its syncs already counted]: vLLM's own checks

    def add(self, verdicts: Iterable[Verdict | None]) -> None:
        self.verdicts.extend(v for v in verdicts if v is not None)

    def follow(self, engine) -> None:
        """A vLLM engine (glassrl.rollout.vllm) verifies each of its syncs itself (glassrl.rollout.vllm_sync:
        every parameter loaded, the unrepacked ones equal, its probe log-probs within tolerance; a LoRA
        adapter read back from the engine's LoRA slot equal bit for bit, the base unchanged), raising
        on a failure; each sync it made since the last drain is counted here as a check, its probe's
        largest |Δ| as ``probe_diff``."""
        self.engines.append([engine, engine.syncs])

    def _engine_verdicts(self) -> None:
        for entry in self.engines:
            engine, seen = entry
            if engine.syncs > seen and engine.last_sync is not None:
                diff = engine.last_sync.max_diff
                # tensors: those it compared bit for bit (a LoRA adapter's, read back from its LoRA slot)
                self.verdicts.append(Verdict("vLLM engine", engine.syncs, engine.last_sync.tensors, probe_diff=diff))
                entry[1] = engine.syncs

    def drain(self) -> tuple[dict[str, float], list[str]]:
        """The step's metrics (``sync/checks``, ``sync/tensors``, ``sync/breaches``, ``sync/probe_max_diff``,
        ``perf/sync_check_s``) and its breach sentences; the log is empty after."""
        self._engine_verdicts()
        verdicts, self.verdicts = self.verdicts, []
        if not verdicts:
            return {}, []
        breaches = [v.breach for v in verdicts if v.breach is not None]
        metrics = {
            "sync/checks": float(len(verdicts)),
            "sync/tensors": float(sum(v.tensors for v in verdicts)),
            "sync/breaches": float(len(breaches)),
            "perf/sync_check_s": max(v.seconds for v in verdicts),
        }
        probes = [v.probe_diff for v in verdicts if v.probe_diff is not None]
        if probes:
            metrics["sync/probe_max_diff"] = max(probes)
        return metrics, breaches
