"""Will a step fit? The memory one training step holds at once, estimated at start.

A batch too large for the machine ran for minutes and died by the OOM killer without a word
(``batch.prompts_per_step=100000`` on the default model: 23.7 GB after 157 s). Before any model is
loaded, :func:`check_step_fits` estimates what the step holds at its largest and refuses a run whose
estimate exceeds the memory available, naming the figures. Counted (B = responses a round samples,
P + T = the longest prompt in the data, at most the prompt limit, plus ``rollout.max_new_tokens``):

- the rollout's key-value cache: the round's B sequences are sampled as one batch, each at full
  length, every layer: ``B × layers × 2 × kv_heads × head_dim × (P + T) × bytes`` of the compute
  dtype (the cache glassrl.rollout.hf allocates);
- the step's per-token tensors: about 16 tensors of shape ``(B, P + T)`` (ids, masks, log-probs,
  values, rewards, advantages, returns; their copies in the update), ``B × (P + T) × 64`` bytes;
- the actor's weights at ``model.dtype`` (float32 on CPU under ``auto``, whatever the file holds), 4
  times for each model that trains (weights, gradients and Adam's two moments: the actor, a critic
  when there is one), once for the reference when a KL needs one;
  under ``model.lora`` once per model (the base is frozen; the adapters' few parameters are left out),
  and no reference of its own (π_ref is the actor with its adapters off) unless ``model.reference`` names one;
  the decoding loop's reordered copy of the linear weights on a CPU (glassrl.rollout.packed_weights) lives
  only during the rollout, when the gradients (freed after each optimiser step) do not: inside those 4 times,
  and a term of its own under LoRA (the weights once more, when they are larger than the last-level cache);
- the update's activations of one micro-batch (issue 40): its tokens (``micro_batch_responses × (P + T)``,
  at most ``batch.max_tokens_per_micro_batch``) × layers × the values a decoder layer keeps per token
  for backward, ``6 × hidden + 3 × intermediate`` (norms, q/k/v/o, the MLP's three products; a floor), or
  ``hidden`` (the layer's input) under ``model.gradient_checkpointing``, in the compute dtype;
- the chunked log-probs' peak in backward (glassrl.models.logprobs): the LM head's gradient (V × hidden × 4)
  and about 3 float32 tensors of one chunk's logits with the fused head backward (measured 768 MiB at 4,096
  tokens, H = 896, V = 151,936, entropy included: benchmarks/bench_logprobs.py), the same under
  ``model.compute_dtype: bfloat16``, whose backward takes tiles of half as many values in slices of the
  vocabulary (measured 712 MiB at 4,096 tokens, 7,399 naive: within the same bound); plus the micro-batch's
  logits when the fused backward keeps them (at most 1 GiB, glassrl.models.logprobs.KEEP_LOGITS_BYTES).

It is an upper bound of those terms (a response that stops early holds less; measured on the
default model, 32,000 responses held about half of it) and leaves out activations, which the
micro-batches bound. Checked for every backend and engine (:func:`check_step_fits` says what each
counts); the terms are glassrl.models.memory's, which every other command checks too.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from glassrl.errors import GlassrlError
from glassrl.models.loading import resolve_device, resolve_dtype
from glassrl.models.logprobs import CHUNK_LOGITS, KEEP_LOGITS_BYTES
from glassrl.models.memory import (
    DTYPE_BYTES,
    available_bytes,
    kv_cache_bytes,
    logits_bytes,
    refuse_if_over,
    text_config,
    weight_bytes,
)
from glassrl.rl.config import TrainConfig
from glassrl.rl.resolve import Resolved
from glassrl.rollout.packed_weights import UNKNOWN_CACHE_BYTES, last_level_cache_bytes

_PER_TOKEN_BYTES = 64  # ~16 (B, P + T) tensors of 4 bytes
# chunk-sized float32 tensors alive at once in the fused head backward, with the entropy (measured; under bfloat16
# autocast: tiles of the vocabulary-sliced backward, half as many values each, within the same bound)
_CHUNK_COPIES = 3


def step_memory(cfg: TrainConfig, resolved: Resolved, actor: Path, prompt_limit: int) -> dict[str, int]:
    """Bytes of each term of the module docstring: {"key-value cache", "per-token tensors", "weights",
    "update activations", "log-prob chunks"}, and "reordered weights" under LoRA on a CPU where the decoding
    loop reorders them."""
    m = cfg.model
    dtype = DTYPE_BYTES.get(m.compute_dtype if m.compute_dtype != "auto" else m.dtype, 4)
    stored = loaded_bytes(m.dtype, m.device)
    B, length = resolved.responses_per_step, prompt_limit + cfg.rollout.max_new_tokens
    model = text_config(actor)
    trains = 1 if m.lora is not None else 4  # a model that trains: weights, gradients, Adam's two moments
    reference = resolved.uses_reference and (m.lora is None or m.reference is not None)
    models = trains + (1 if reference else 0) + (trains if resolved.uses_critic else 0)
    micro_tokens = cfg.batch.micro_batch_responses * length
    if cfg.batch.max_tokens_per_micro_batch is not None:
        micro_tokens = min(micro_tokens, cfg.batch.max_tokens_per_micro_batch)
    hidden, layers = int(model["hidden_size"]), int(model["num_hidden_layers"])
    per_layer = hidden if m.gradient_checkpointing else 6 * hidden + 3 * int(model.get("intermediate_size", 4 * hidden))
    vocab = int(model["vocab_size"])
    # the fused head backward's kept logits (of the response positions only), when they fit its budget
    kept = min(cfg.batch.micro_batch_responses * cfg.rollout.max_new_tokens, micro_tokens) * vocab * 4
    kept = kept if kept <= KEEP_LOGITS_BYTES else 0
    # Under LoRA no full-size gradient makes room for the decoding loop's reordered weights (module docstring).
    actor_bytes = weight_bytes(actor, stored)
    reordered = reordered_bytes(actor_bytes, resolve_device(m.device)) if m.lora is not None else 0
    return {
        "key-value cache": kv_cache_bytes(model, B, length, dtype),
        "per-token tensors": B * length * _PER_TOKEN_BYTES,
        "weights": models * actor_bytes,
        "update activations": micro_tokens * layers * per_layer * dtype,
        "log-prob chunks": _CHUNK_COPIES * min(CHUNK_LOGITS, micro_tokens * vocab) * 4 + vocab * hidden * 4 + kept,
        **({"reordered weights": reordered} if reordered else {}),
    }


def reordered_bytes(weights: int, device: torch.device) -> int:
    """The decoding loop's reordered copy of the linear weights (glassrl.rollout.packed_weights): on a CPU,
    about the weights once (the LM head included, the input embedding not: an upper bound) when they are
    larger than the last-level cache, where the loop reorders them; else 0."""
    cache = last_level_cache_bytes() or UNKNOWN_CACHE_BYTES
    return weights if device.type == "cpu" and weights > cache else 0


def loaded_bytes(dtype: str, device: str) -> int:
    """Bytes per element of the weights as ``model.dtype`` loads them on ``model.device``."""
    return torch.finfo(resolve_dtype(dtype, resolve_device(device))).bits // 8


def check_step_fits(cfg: TrainConfig, resolved: Resolved, actor: Path, prompt_limit: int) -> None:
    """GlassrlError when the step's estimated memory (:func:`step_memory`) exceeds what is available.

    Every backend and engine (issue 37, item 9: Ray and vLLM were not checked): vLLM sizes its own
    key-value cache within ``rollout.vllm.gpu_memory_utilization``, so that term is left to it; on Ray
    with GPUs or a cluster elsewhere the ranks hold the models and the cache on their own devices, and
    this process the step's per-token tensors, checked against this machine's memory. A Ray cluster
    this process starts on CPU (``ray.address`` null) shares this machine: every term counts."""
    device = resolve_device(cfg.model.device)
    terms = step_memory(cfg, resolved, actor, prompt_limit)
    if cfg.rollout.engine == "vllm":
        terms.pop("key-value cache")
    if cfg.trainer.backend == "ray" and (device.type != "cpu" or cfg.ray.address is not None):
        terms, device = {"per-token tensors": terms["per-token tensors"]}, torch.device("cpu")
    refuse_if_over(
        terms,
        available_bytes(device),
        device,
        f"batch.prompts_per_step = {cfg.batch.prompts_per_step} × rollout.n = {cfg.rollout.n}: one step",
        "lower batch.prompts_per_step (or rollout.n, rollout.max_new_tokens); batch.max_tokens_per_micro_batch, "
        "model.gradient_checkpointing and model.lora lower the update's part",
        f"; responses of up to {prompt_limit} + {cfg.rollout.max_new_tokens} tokens",
    )


def check_sampling_fits(
    cfg: TrainConfig,
    model_dir: Path,
    sequences: int,
    longest: int,
    what: str,
    lower: str,
    *,
    also: Sequence[Path] = (),
    forward: int = 0,
) -> None:
    """``glassrl generate`` and ``eval``: the longest prompt (``longest`` tokens) plus ``rollout.max_new_tokens``
    fits the model's positions, and sampling ``sequences`` responses as one batch fits the memory (the
    key-value cache, the per-token tensors, the weights once); else GlassrlError, before the model loads
    (issue 45, item 4: ``rollout.max_new_tokens=1000000000`` on a 64-position model ran until memory ran out).
    ``glassrl explain --model --sample N`` (issue 37) adds the weights of the models it also loads
    (``also``: reference, critic) and the logits of a forward pass over ``forward`` responses (its micro-batch)."""
    model, new = text_config(model_dir), cfg.rollout.max_new_tokens
    positions = model.get("max_position_embeddings")
    if positions is not None and longest + new > positions:
        raise GlassrlError(
            f"rollout.max_new_tokens = {new}: the longest prompt ({longest} tokens) + {new} is more than the "
            f"model's {positions} positions ({model_dir}); use rollout.max_new_tokens <= {max(positions - longest, 0)}"
        )
    dtype = DTYPE_BYTES.get(cfg.model.compute_dtype if cfg.model.compute_dtype != "auto" else cfg.model.dtype, 4)
    length = longest + new
    terms = {
        "key-value cache": kv_cache_bytes(model, sequences, length, dtype),
        "per-token tensors": sequences * length * _PER_TOKEN_BYTES,
    }
    if forward:
        terms["logits"] = logits_bytes(model, forward, length)
    stored = loaded_bytes(cfg.model.dtype, cfg.model.device)
    policy = weight_bytes(model_dir, stored)
    terms["weights"] = policy + sum(weight_bytes(path, stored) for path in also)
    device = resolve_device(cfg.model.device)
    if reordered := reordered_bytes(policy, device):
        terms["reordered weights"] = reordered
    refuse_if_over(terms, available_bytes(device), device, what, lower)
