"""Helpers shared by the trainers (RL, SFT, reward model): seeding, the optimiser and its
schedule (from the shared :class:`~glassrl.trainer.config.OptimConfig`), and collation of
prompt/response pairs into the project's batch layout.

Batch layout (the one every module touching models uses):

    prompt_ids     (B, P)    LEFT-padded
    response_ids   (B, T)    RIGHT-padded
    input_ids      (B, P+T)  cat(prompt_ids, response_ids)
    attention_mask (B, P+T)  bool, True on real tokens
    position_ids   (B, P+T)  (attention_mask.cumsum(-1) - 1).clamp(min=0)
    response_mask  (B, T)    bool, True on response tokens that train

Logits at absolute position P-1+i predict response token i.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Iterator, Sequence
from functools import partial

import numpy as np
import torch

from glassrl.trainer.config import OptimConfig


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch, and ask torch for deterministic kernels.

    Same seed, same machine, same thread count -> bit-identical training.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    # Needed by cuBLAS for deterministic matmuls (PyTorch "Reproducibility" notes).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic mode also fills every new uninitialised tensor with NaN, a check for code that
    # reads memory it never wrote: none here does (the KV cache, the largest, is written before it
    # is read), and the fills cost ~2.5 % of a CPU step of bench_vs_trl's large model (BENCHMARKS.md).
    torch.utils.deterministic.fill_uninitialized_memory = False


def make_optimizer(
    model: torch.nn.Module, optim: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (Loshchilov & Hutter 2019) as ``optim`` says, with its learning-rate schedule
    (:func:`lr_lambda`: linear warm-up, then ``optim.decay``) over ``total_steps`` optimiser steps.

    Weight decay applies to matrices only, not to norms and biases (1-D tensors), as in
    GPT-2/nanoGPT. Call ``scheduler.step()`` after each ``optimizer.step()``.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": optim.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    # On CUDA the fused kernel updates every tensor in a few launches (transformers' default optimiser
    # there, "adamw_torch_fused"); on CPU torch's default, one tensor at a time, whose figures the
    # README gives (foreach measured slower there, fused changes the last bits: BENCHMARKS.md).
    fused = bool(params) and all(type(p) is torch.nn.Parameter and p.is_cuda for p in params)
    optimizer = torch.optim.AdamW(groups, lr=optim.lr, betas=(0.9, 0.95), fused=fused or None)
    schedule = lr_lambda(optim.decay, optim.warmup_steps, total_steps)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def optimizer_path(optimizer: torch.optim.Optimizer) -> str:
    """Which AdamW kernel :func:`make_optimizer`'s ``optimizer`` runs, for the start-up lines: the
    fused one on CUDA, or why not."""
    if optimizer.defaults.get("fused"):
        return "AdamW, fused kernel (CUDA)"
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(p.is_cuda for p in params):
        kinds = sorted({type(p).__name__ for p in params if type(p) is not torch.nn.Parameter or not p.is_cuda})
        return f"AdamW, torch's default kernel; the fused one needs plain CUDA parameters, these are also {', '.join(kinds)}"
    return "AdamW, one tensor at a time (torch's default on CPU)"


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Multiplier of the peak learning rate at optimiser step ``step`` (0-based), decay "cosine".

    Linear warmup over ``warmup_steps`` (Goyal et al. 2017, §2.2), then half a cosine
    down to 0 at ``total_steps`` (Loshchilov & Hutter 2017, SGDR, eq. 5 without restarts).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def constant_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Decay "constant": linear warm-up (Goyal et al. 2017, §2.2), then the peak rate."""
    return min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0


# OptimConfig.decay -> multiplier of the peak rate at (step, warmup_steps, total_steps)
LR_SCHEDULES: dict[str, Callable[[int, int, int], float]] = {"cosine": lr_factor, "constant": constant_factor}


def lr_lambda(decay: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """The multiplier of the peak learning rate at optimiser step s (0-based), for LambdaLR.

    A partial of a module-level function, not a closure: a remote worker can receive it pickled.
    """
    return partial(_schedule_at, decay, warmup_steps, total_steps)


def _schedule_at(decay: str, warmup_steps: int, total_steps: int, step: int) -> float:
    return LR_SCHEDULES[decay](step, warmup_steps, total_steps)


def encode_response(tokenizer, response: str) -> list[int]:
    """Token ids of ``response`` as the model must produce it after the prompt: its text
    without special tokens, then the EOS token (which ends generation)."""
    return encode_responses(tokenizer, [response])[0]


def encode_responses(tokenizer, responses: Sequence[str]) -> list[list[int]]:
    """:func:`encode_response` of each response, in one batched tokenizer call."""
    if not responses:
        return []
    encoded = tokenizer(list(responses), add_special_tokens=False)["input_ids"]
    return [list(ids) + [tokenizer.eos_token_id] for ids in encoded]


def collate(pairs: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad (prompt_ids, response_ids) pairs into the batch layout of this module's docstring.

    Returns input_ids, attention_mask, position_ids (B, P+T) and response_mask (B, T), plus
    the prompt width ``prompt_len`` = P as a 0-d tensor.
    """
    P = max(len(p) for p, _ in pairs)
    T = max(len(r) for _, r in pairs)
    rows, masks = [], []
    for prompt, response in pairs:
        left, right = P - len(prompt), T - len(response)
        rows.append([pad_id] * left + prompt + response + [pad_id] * right)
        masks.append([False] * left + [True] * (len(prompt) + len(response)) + [False] * right)
    input_ids = torch.tensor(rows, dtype=torch.long)  # (B, P+T)
    attention_mask = torch.tensor(masks, dtype=torch.bool)  # (B, P+T)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.long().cumsum(-1) - 1).clamp(min=0),
        "response_mask": attention_mask[:, P:],  # (B, T)
        "prompt_len": torch.tensor(P),
    }


def batch_indices(n: int, batch_size: int, generator: torch.Generator) -> Iterator[list[int]]:
    """Endless batches of example indices: a fresh permutation of range(n) per epoch,
    cut into consecutive batches of ``batch_size`` (a batch may straddle two epochs)."""
    buffer: list[int] = []
    while True:
        while len(buffer) < batch_size:
            buffer.extend(torch.randperm(n, generator=generator).tolist())
        yield buffer[:batch_size]
        buffer = buffer[batch_size:]
