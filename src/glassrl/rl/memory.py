"""Will a step fit? The memory one training step holds at once, estimated at start.

A batch too large for the machine ran for minutes and died by the OOM killer without a word
(``batch.prompts_per_step=100000`` on the default model: 23.7 GB after 157 s). Before any model is
loaded, :func:`check_step_fits` estimates what the step holds at its largest and refuses a run whose
estimate exceeds the memory available, naming the figures. Counted (B = responses a round samples,
P + T = the longest prompt the data may hold plus ``rollout.max_new_tokens``):

- the rollout's key-value cache: the round's B sequences are sampled as one batch, each at full
  length, every layer: ``B × layers × 2 × kv_heads × head_dim × (P + T) × bytes`` of the compute
  dtype (the cache glassrl.rollout.hf allocates);
- the step's per-token tensors: about 16 tensors of shape ``(B, P + T)`` (ids, masks, log-probs,
  values, rewards, advantages, returns; their copies in the update), ``B × (P + T) × 64`` bytes;
- the actor's weights as on disk, 4 times for each model that trains (weights, gradients and Adam's
  two moments: the actor, a critic when there is one) and once for the reference.

It is an upper bound of those terms (a response that stops early holds less; measured on the
default model, 32,000 responses held about half of it) and leaves out activations, which the
micro-batches bound. Checked for the in-process backend with the Hugging Face rollout; vLLM and Ray
workers manage their own memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from glassrl.errors import GlassrlError
from glassrl.models.loading import resolve_device
from glassrl.rl.config import TrainConfig
from glassrl.rl.resolve import Resolved

GIB = 2**30
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_PER_TOKEN_BYTES = 64  # ~16 (B, P + T) tensors of 4 bytes


def step_memory(cfg: TrainConfig, resolved: Resolved, actor: Path, prompt_limit: int) -> dict[str, int]:
    """Bytes of each term of the module docstring: {"key-value cache", "per-token tensors", "weights"}."""
    model = _text_config(actor)
    layers = int(model["num_hidden_layers"])
    heads = int(model.get("num_attention_heads") or 1)
    kv_heads = int(model.get("num_key_value_heads") or heads)
    head_dim = int(model.get("head_dim") or int(model["hidden_size"]) // heads)
    dtype = _BYTES.get(cfg.model.compute_dtype if cfg.model.compute_dtype != "auto" else cfg.model.dtype, 4)
    B, length = resolved.responses_per_step, prompt_limit + cfg.rollout.max_new_tokens
    models = 4 + 1 + (4 if resolved.uses_critic else 0)  # the actor trains; a reference; a critic trains
    return {
        "key-value cache": B * layers * 2 * kv_heads * head_dim * length * dtype,
        "per-token tensors": B * length * _PER_TOKEN_BYTES,
        "weights": models * _weight_bytes(actor),
    }


def check_step_fits(cfg: TrainConfig, resolved: Resolved, actor: Path, prompt_limit: int) -> None:
    """GlassrlError when the step's estimated memory (:func:`step_memory`) exceeds what is available."""
    if cfg.trainer.backend != "local" or cfg.rollout.engine != "hf":
        return
    device = resolve_device(cfg.model.device)
    available = available_bytes(device)
    if available is None:
        return
    terms = step_memory(cfg, resolved, actor, prompt_limit)
    need = sum(terms.values())
    if need <= available:
        return
    parts = ", ".join(f"{name} {size / GIB:.1f}" for name, size in terms.items())
    raise GlassrlError(
        f"batch.prompts_per_step = {cfg.batch.prompts_per_step} × rollout.n = {cfg.rollout.n}: one step needs "
        f"about {need / GIB:.1f} GiB ({parts}; responses of up to {prompt_limit} + {cfg.rollout.max_new_tokens} "
        f"tokens), more than the {available / GIB:.1f} GiB available on {device}; lower batch.prompts_per_step "
        "(or rollout.n, rollout.max_new_tokens)"
    )


def available_bytes(device: torch.device) -> int | None:
    """Memory free for the run on ``device``: the GPU's free memory, or the machine's MemAvailable
    (Linux); None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _text_config(path: Path) -> dict:
    """The model's config.json (the text model's part of a multimodal one)."""
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    return config.get("text_config") or config


def _weight_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.safetensors")) or sum(
        f.stat().st_size for f in path.glob("*.bin")
    )
