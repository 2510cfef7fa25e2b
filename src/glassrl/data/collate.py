"""Prompt/response pairs in the project's batch layout (SFT, reward model, PPO-ptx, explain).

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

from collections.abc import Iterator, Sequence

import torch


def encode_response(tokenizer, response: str) -> list[int]:
    """Token ids of ``response`` as the model must produce it after the prompt: its text
    read as text (the text of a special token in it becomes ordinary tokens: glassrl.data.formatting),
    then the EOS token (which ends generation)."""
    return encode_responses(tokenizer, [response])[0]


def encode_responses(tokenizer, responses: Sequence[str]) -> list[list[int]]:
    """:func:`encode_response` of each response, in one batched tokenizer call."""
    if not responses:
        return []
    encoded = tokenizer(list(responses), add_special_tokens=False, split_special_tokens=True)["input_ids"]
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
