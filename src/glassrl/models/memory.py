"""Will it fit? What a command holds at once, from a model's config.json and the batch, before any model loads.

    terms = {"key-value cache": kv_cache_bytes(shape, sequences=B, length=P + T, dtype_bytes=4), ...}
    refuse_if_over(terms, available_bytes(device), device, "--n 100000000 × 1 prompt:", "lower --n")

Every command that samples or trains checks its largest allocation here first (issue 37, item 9:
``generate --n 100000000`` and ``dpo batch_size=1000000`` had no estimate and ended in a traceback or
a hang; ``glassrl.rl.memory`` is ``train``'s and ``eval``'s step). Each term is a floor of what the
command holds at its largest, so a run that fits is never refused:

- a sampler's key-value cache: ``B × layers × 2 × kv_heads × head_dim × length × bytes`` (B sequences
  sampled as one batch, each at full length: the cache glassrl.rollout.hf allocates);
- a trainer's logits and their log-softmax over the vocabulary, ``2 × B × length × V × 4`` bytes (the
  supervised trainers' forward of a batch: glassrl.supervised);
- the weights at the dtype they are loaded in (elements from the safetensors headers), times the
  copies held (4 for a model that trains: weights, gradients and Adam's two moments; 1 for one that
  only runs).

The refusal is one line with each term's figure and what to lower.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from glassrl.errors import GlassrlError

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def text_config(path: Path) -> dict:
    """The model's config.json (the text model's part of a multimodal one)."""
    config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    return config.get("text_config") or config


def kv_cache_bytes(model: dict, sequences: int, length: int, dtype_bytes: int) -> int:
    """Bytes of the key-value cache of ``sequences`` sequences of ``length`` tokens (``model``: text_config)."""
    layers = int(model["num_hidden_layers"])
    heads = int(model.get("num_attention_heads") or 1)
    kv_heads = int(model.get("num_key_value_heads") or heads)
    head_dim = int(model.get("head_dim") or int(model["hidden_size"]) // heads)
    return sequences * layers * 2 * kv_heads * head_dim * length * dtype_bytes


def logits_bytes(model: dict, sequences: int, length: int) -> int:
    """Bytes of float32 logits and their log-softmax for ``sequences`` × ``length`` tokens."""
    return 2 * sequences * length * int(model["vocab_size"]) * 4


def activation_bytes(model: dict, sequences: int, length: int) -> int:
    """Bytes of the hidden states a backward pass keeps: one float32 vector per token and layer (a floor)."""
    return sequences * length * int(model["hidden_size"]) * int(model["num_hidden_layers"]) * 4


def check_training_fits(
    model_dir: Path, sequences: int, length: int, device: torch.device, what: str, lower: str, *, vocabulary: bool
) -> None:
    """A supervised trainer's ``length`` (``max_length``) fits the model's positions, and its batch
    (``sequences`` of up to ``length`` tokens, in one forward and backward) fits the memory: the logits over the
    vocabulary when the model has its language-model head (``vocabulary``; not
    a reward model's scalar head), the hidden states kept for the backward, the weights 4 times
    (GlassrlError before the model loads; nothing when its config.json is not there yet: the loader
    says so)."""
    if not (Path(model_dir) / "config.json").is_file():
        return
    model = text_config(model_dir)
    positions = model.get("max_position_embeddings")
    if positions is not None and length > positions:  # first: loading would print transformers' report before it
        raise GlassrlError(f"max_length = {length}: more than the {positions} positions of the model ({model_dir})")
    terms = {"logits": logits_bytes(model, sequences, length)} if vocabulary else {}
    weights = 4 * weight_bytes(model_dir, DTYPE_BYTES["float32"])  # the supervised trainers load float32
    terms |= {"hidden states": activation_bytes(model, sequences, length), "weights": weights}
    refuse_if_over(terms, available_bytes(device), device, what, lower)


def weight_bytes(path: Path, dtype_bytes: int | None = None) -> int:
    """The model's weights in memory when loaded at ``dtype_bytes`` bytes per element: the elements the
    safetensors headers list × ``dtype_bytes``. As on disk when ``dtype_bytes`` is None or a file has no
    readable header (a .bin checkpoint). Issue 40: Qwen2.5-0.5B written in bf16 (988 MB) loads as float32
    (dtype ``auto`` on CPU, the supervised trainers always): 1.98 GB a copy, which the disk size halved."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    on_disk = sum(f.stat().st_size for f in files) or sum(f.stat().st_size for f in path.glob("*.bin"))
    if dtype_bytes is None or not files:
        return on_disk
    counts = [safetensors_elements(f) for f in files]
    return on_disk if None in counts else sum(counts) * dtype_bytes


def safetensors_elements(file: Path) -> int | None:
    """How many elements the tensors of a safetensors file hold, from its header alone (8 bytes of
    little-endian length, then JSON: name -> dtype, shape, offsets; huggingface/safetensors' format);
    None when the header cannot be read."""
    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 2 <= size <= 100 * 2**20:
                return None
            header = json.loads(f.read(size))
        return sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError):
        return None


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


def refuse_if_over(
    terms: dict[str, int], available: int | None, device: torch.device, what: str, lower: str, detail: str = ""
) -> None:
    """GlassrlError ``WHAT needs about N GiB (TERM n, …DETAIL), more than the M GiB available on DEVICE; LOWER``
    when the terms add up to more than ``available`` (nothing when it cannot be read)."""
    need = sum(terms.values())
    if available is None or need <= available:
        return
    parts = ", ".join(f"{name} {size / GIB:.1f}" for name, size in terms.items())
    raise GlassrlError(
        f"{what} needs about {need / GIB:.1f} GiB ({parts}{detail}), more than the {available / GIB:.1f} GiB "
        f"available on {device}; {lower}"
    )


def enable_gradient_checkpointing(model: torch.nn.Module) -> int:
    """``model.gradient_checkpointing``: every Hugging Face model inside ``model`` (the actor itself, a
    critic's backbone under its value head, a LoRA-wrapped one) recomputes its decoder layers' activations
    in backward instead of keeping them (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost";
    transformers' ``activation_checkpointing_enable``, before 5.x ``gradient_checkpointing_enable``),
    non-reentrant (``use_reentrant=False``: frozen inputs, as under LoRA, need no ``requires_grad`` trick,
    and the gradients equal the plain backward's). Active in training mode only, so the no-grad passes are
    unchanged. Returns how many models it was enabled on; GlassrlError when none supports it."""
    kwargs = {"use_reentrant": False}
    enabled: list[torch.nn.Module] = []
    for module in model.modules():
        if not getattr(module, "supports_gradient_checkpointing", False):
            continue
        if any(module is inner for outer in enabled for inner in outer.modules()):
            continue  # inside a model already enabled (a CausalLM's own base model)
        if hasattr(module, "activation_checkpointing_enable"):
            module.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        elif hasattr(module, "gradient_checkpointing_enable"):
            module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        else:
            continue
        enabled.append(module)
    if not enabled:
        raise GlassrlError(f"model.gradient_checkpointing: {type(model).__name__} does not support it")
    return len(enabled)
