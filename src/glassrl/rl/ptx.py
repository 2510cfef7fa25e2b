"""PPO-ptx: a supervised loss mixed into each actor update (Ouyang et al. 2022, InstructGPT, eq. 2).

    objective(φ) = E_RL[…] + γ · E_{x ~ D_pretrain}[log π_φ(x)]

so each actor mini-batch (one optimiser step) adds ``γ = algo.ptx_coef`` × the SFT loss:
the token-mean cross-entropy of the response tokens of a batch of supervised pairs from
``data.ptx`` (collated and scored exactly as glassrl.supervised.sft does). Shapes: B pairs,
T response width. The order the pairs are drawn in is checkpointed (part ``ptx_data``).

In one process the update draws each step's pairs itself (:meth:`PtxLoss.take`); on the Ray
backend the driver draws them and splits each step's batch over the actor's ranks, each of which
adds its part through the same update loop (glassrl.rl.update.run_updates).
"""

from __future__ import annotations

import torch

from glassrl.data.collate import collate
from glassrl.data.stream import PromptStream
from glassrl.errors import GlassrlError
from glassrl.rl.ranks import Ranks
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


class PtxTerm:
    """γ × the SFT loss of a batch of supervised pairs, added to one actor optimiser step: the loss
    alone (a data-parallel rank trains on the pairs the driver sends it: glassrl.workers.ray.RayActor)."""

    def __init__(self, coef: float, micro_batch: int, pad_id: int) -> None:
        self.coef, self.micro_batch, self.pad_id = coef, micro_batch, pad_id

    def backward(self, pairs: list[Example], ranks: Ranks, device: torch.device) -> torch.Tensor:
        """Accumulate ∇(γ · CE) of ``pairs`` into the model's gradients, in micro-batches, each pass
        through ``ranks`` (the update's, glassrl.rl.ranks.Ranks; the gradients are reduced over the
        ranks in the last). Exact: each micro-batch's summed CE over the response tokens of the
        whole batch, every rank's pairs. Returns this rank's share of the CE (token mean, detached)."""
        total = int(ranks.sum(torch.tensor(sum(len(response) for _, response in pairs))).item())
        starts = range(0, len(pairs), self.micro_batch)
        passes = ranks.passes(len(starts))
        value = torch.zeros((), device=device)
        for j in range(passes):
            real = j < len(starts)  # FSDP2: a rank with fewer micro-batches runs its last again, weighted 0
            start = starts[min(j, len(starts) - 1)]
            micro = collate(pairs[start : start + self.micro_batch], self.pad_id)
            batch = {k: v.to(device) for k, v in micro.items()}
            with ranks.gradient_sync(j == passes - 1):
                loss_sum, _ = ranks.forward(response_loss, batch)
                # × W: DDP and FSDP2 average the ranks' gradients (glassrl.rl.update.run_updates)
                (self.coef * loss_sum / total * (ranks.world_size if real else 0)).backward()
            if real:
                value = value + loss_sum.detach() / total
        return value


class PtxLoss(PtxTerm):
    """The term and the pairs it trains on: ``batch_size`` pairs per optimiser step, drawn from
    ``stream`` (a checkpointed component) by :meth:`take`."""

    def __init__(
        self, examples: list[Example], coef: float, batch_size: int, micro_batch: int, pad_id: int, seed: int
    ) -> None:
        super().__init__(coef, micro_batch, pad_id)
        self.batch_size = batch_size
        self.stream = PromptStream(examples, seed, part="ptx_data", key="data.ptx")

    def take(self) -> list[Example]:
        """The pairs of the next optimiser step."""
        return self.stream.take(self.batch_size)
