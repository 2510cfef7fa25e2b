"""PPO-ptx: a supervised loss mixed into each actor update (Ouyang et al. 2022, InstructGPT, eq. 2).

    objective(φ) = E_RL[…] + γ · E_{x ~ D_pretrain}[log π_φ(x)]

so each actor mini-batch (one optimiser step) adds ``γ = algo.ptx_coef`` × the SFT loss:
the token-mean cross-entropy of the response tokens of a batch of supervised pairs from
``data.ptx`` (collated and scored exactly as glassrl.supervised.sft does). Shapes: B pairs,
T response width. The order the pairs are drawn in is checkpointed (part ``ptx_data``).
"""

from __future__ import annotations

import torch

from glassrl.data.collate import collate
from glassrl.data.stream import PromptStream
from glassrl.errors import GlassrlError
from glassrl.supervised.sft import Example, load_pairs, response_loss, tokenize_pairs


def load_ptx_examples(spec: str, tokenizer, max_length: int) -> list[Example]:
    """(prompt ids, response ids + EOS) of ``data.ptx``: "task:NAME[/SPLIT]" (a bundled task's
    pairs, train split by default) or a JSONL file of {"prompt", "response"}."""
    from glassrl.data.tasks import parse_task, sft_pairs

    try:
        if (ref := parse_task(spec)) is not None:
            pairs = sft_pairs(ref.name, ref.split)
            rows = [(prompt, answer, f"{spec}#{i}") for i, (prompt, answer) in enumerate(pairs)]
        else:
            rows = load_pairs(spec)
        return tokenize_pairs(tokenizer, rows, max_length)
    except GlassrlError as err:
        raise GlassrlError(f"data.ptx = {spec!r}: {err}") from None


class PtxLoss:
    """γ and the next supervised batch per call; ``stream`` is a checkpointed component."""

    def __init__(
        self, examples: list[Example], coef: float, batch_size: int, micro_batch: int, pad_id: int, seed: int
    ) -> None:
        self.coef, self.batch_size, self.micro_batch, self.pad_id = coef, batch_size, micro_batch, pad_id
        self.stream = PromptStream(examples, seed, part="ptx_data", key="data.ptx")

    def backward(self, model: torch.nn.Module) -> torch.Tensor:
        """Accumulate ∇(γ · CE) of the next ``batch_size`` pairs into ``model``'s gradients, in
        micro-batches (exact: each micro-batch's summed CE over the batch's token count);
        returns the CE (token mean, detached)."""
        examples = self.stream.take(self.batch_size)
        device = next(model.parameters()).device
        total = sum(len(response) for _, response in examples)  # response tokens of the batch
        value = torch.zeros((), device=device)
        for start in range(0, len(examples), self.micro_batch):
            micro = collate(examples[start : start + self.micro_batch], self.pad_id)
            batch = {k: v.to(device) for k, v in micro.items()}
            loss_sum, _ = response_loss(model, batch)
            (self.coef * loss_sum / total).backward()
            value = value + loss_sum.detach() / total
        return value
