"""A trained reward model as a reward source: one scalar per prompt ⊕ response.

The model reads the prompt followed by the response and its output at the last
real token is the score (Ouyang et al. 2022, InstructGPT, §3.5); loading and the
read-out are :func:`glassrl.models.load_scalar_model` and
:func:`glassrl.models.sequence_scores`.

The text: a chat prompt (messages) with a tokenizer that has a chat template is
rendered with the response as the assistant's turn; otherwise it is
``prompt + response``, tokenized with the tokenizer's special tokens (BOS).

A text longer than ``max_length`` tokens is an ``error`` result, not truncated:
cutting off either end would change what the model scores without a trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from glassrl.data.formatting import format_prompt, plain_ids
from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardRequest, RewardResult


class RewardModelSource:
    """Scores responses with a scalar reward model loaded from ``path``.

    tokenizer:  directory of the tokenizer (default: ``path``)
    max_length: the most tokens of prompt ⊕ response the model may read
    batch_size: texts per forward pass
    head, dtype, device: as :func:`glassrl.models.load_scalar_model`
    """

    name = "reward_model"

    def __init__(
        self,
        path: str,
        tokenizer: str | None = None,
        max_length: int = 1024,
        batch_size: int = 8,
        head: str = "token-classification",
        dtype: str = "auto",
        device: str = "auto",
    ) -> None:
        # torch and transformers load when the source is built, so that importing
        # glassrl.rewards stays torch-free (worker_pool.py's user-function worker imports it)
        from glassrl.models import load_scalar_model, load_tokenizer

        if max_length < 1 or batch_size < 1:
            raise GlassrlError(f"reward_model: max_length and batch_size must be >= 1, got {max_length}, {batch_size}")
        self.model = load_scalar_model(path, head=head, dtype=dtype, device=device)
        self.tokenizer = load_tokenizer(tokenizer if tokenizer is not None else path)
        self.max_length = max_length
        self.batch_size = batch_size

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        results: list[RewardResult | None] = [None] * len(requests)
        fitting: list[tuple[int, list[int]]] = []
        for j, request in enumerate(requests):
            ids = self._encode(request)
            if not ids:
                results[j] = RewardResult.error("prompt and response are empty: nothing to score")
            elif len(ids) > self.max_length:
                message = f"prompt + response is {len(ids)} tokens, longer than max_length={self.max_length}"
                results[j] = RewardResult.error(message)
            else:
                fitting.append((j, ids))
        for start in range(0, len(fitting), self.batch_size):
            chunk = fitting[start : start + self.batch_size]
            for (j, _), value in zip(chunk, self._forward([ids for _, ids in chunk])):
                results[j] = RewardResult.ok(value)
        return results  # type: ignore[return-value]  # every slot is filled above

    def _encode(self, request: RewardRequest) -> list[int]:
        """The tokens the reward model was trained to score (glassrl.supervised.rm): the prompt as
        ``format_prompt`` renders it (chat template with the generation prompt, or the text), the
        response's tokens, then EOS — the score is read at that EOS, as in training."""
        prompt = format_prompt(self.tokenizer, request.record.prompt)
        response = plain_ids(self.tokenizer, request.response)
        return [*prompt, *response, self.tokenizer.eos_token_id]

    def _forward(self, batch: list[list[int]]) -> list[float]:
        """Right-pad ``batch`` to (B, L) and read each row's score at its last real token."""
        import torch  # see __init__

        from glassrl.models import sequence_scores

        device = next(self.model.parameters()).device
        width = max(len(ids) for ids in batch)
        pad: Any = self.tokenizer.pad_token_id
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in batch], device=device)  # (B, L)
        mask = [[1] * len(ids) + [0] * (width - len(ids)) for ids in batch]
        attention_mask = torch.tensor(mask, device=device)  # (B, L)
        with torch.no_grad():
            return sequence_scores(self.model, input_ids, attention_mask).tolist()  # (B,)
