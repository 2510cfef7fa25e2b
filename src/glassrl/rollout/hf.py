"""Rollout with a Hugging Face causal LM, the default engine: a decoding loop over the
model's forward with a preallocated KV cache (:func:`decode`).

Why not ``model.generate``: its default cache (transformers' ``DynamicCache``) grows by
``torch.cat`` at every step, i.e. copies the whole cache per generated token (issue 14
measured 54 % of generation time there at 256 tokens), and a row that has ended keeps
costing a forward slot until the last row ends. The loop here:

- keeps each layer's keys and values in one buffer (B, H, P + max_new_tokens, D) written in
  place (:class:`PreallocatedCache`); attention reads a view of its filled part, so the
  tensors it sees have exactly the shapes and values ``generate``'s would;
- drops ended rows from the batch: their cache rows are compacted away in place (at most
  once per step, and only when a row ended), so a step costs the rows still writing;
- samples as ``generate`` does, with transformers' own warpers (temperature, top-k, top-p,
  in generate's order), then ``torch.multinomial`` over all B rows of the original batch
  (ended rows get a placeholder distribution). ATen draws ``multinomial(probs, 1)`` as
  argmax(probs / q) with q ~ Exp(1) of probs' shape (the Gumbel-max form, its fast path for
  one sample), so the draws do not depend on the probabilities: the generator advances as
  in ``generate`` and every row gets the token ``generate`` gives it. tests/rollout/
  test_rollout_hf.py checks token-for-token equality and the generator's state after, greedy
  and sampled; the demo's figures are unchanged.

``model.generate`` (:func:`generate_with_hf`) remains the reference the tests compare with,
and the path for models whose cache is not plain full attention (sliding-window, linear
attention) or whose forward lacks ``position_ids`` / ``logits_to_keep``. ``torch.compile``
is not used: on CPU it did not pay off (benchmarks/bench_generation.py, BENCHMARKS.md).

Sampling randomness: the loop draws from the caller's ``generator`` directly. ``generate``
draws from torch's *global* RNG (torch.multinomial), which other code also draws from, so
:func:`generate_with_hf` runs inside :func:`sampling_rng`: the global state is set from the
caller's generator right before, copied back into it right after, and the global state is
then restored. The trainer owns that generator and saves it in checkpoints, so a resumed run
samples exactly the tokens the uninterrupted run would have.

The checkpoint's own ``generation_config`` may carry repetition penalties, a default top-k,
a min-p, etc.; each would make the sampling distribution differ from π_θ(·|s)/temperature,
whose log-probs the trainer computes. The loop applies none of them; for ``generate``,
``_NEUTRAL`` switches them off.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from glassrl.rollout.base import RolloutBatch, SamplingParams

# Logits processors a checkpoint's generation_config may enable, set to their identity.
_NEUTRAL = {
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "min_p": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "min_new_tokens": 0,
    "num_beams": 1,
}


def generation_kwargs(params: SamplingParams) -> dict:
    """``model.generate`` keyword arguments that sample from softmax(logits / temperature),
    cut by top-k / top-p (or argmax when greedy), with every other logits processor off."""
    if params.greedy:
        sampling = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    else:
        sampling = {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}
    return {**sampling, **_NEUTRAL}


@contextmanager
def sampling_rng(generator: torch.Generator) -> Iterator[None]:
    """Run the block with torch's global RNG (of ``generator``'s device) set from
    ``generator``; afterwards ``generator`` holds the advanced state and the
    global RNG is as it was before."""
    device = generator.device
    cuda = device.type == "cuda"
    index = device.index if device.index is not None else (torch.cuda.current_device() if cuda else None)
    with torch.random.fork_rng(devices=[index] if cuda else [], device_type="cuda" if cuda else "cpu"):
        if cuda:
            torch.cuda.set_rng_state(generator.get_state(), index)
        else:
            torch.set_rng_state(generator.get_state())
        yield
        generator.set_state(torch.cuda.get_rng_state(index) if cuda else torch.get_rng_state())


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists -> prompt_ids (B, P) left-padded and prompt_mask (B, P) bool."""
    P = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (P - len(p)) + list(p) for p in prompts], dtype=torch.long)  # (B, P)
    mask = torch.tensor([[False] * (P - len(p)) + [True] * len(p) for p in prompts], dtype=torch.bool)  # (B, P)
    return ids, mask


def response_mask_from_eos(response_ids: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(response_mask (B, T) bool: True up to and including the first EOS, or everywhere
    without one; ended (B,) bool: the row has an EOS)."""
    is_eos = response_ids == eos_id  # (B, T)
    eos_before = is_eos.long().cumsum(-1) - is_eos.long()  # (B, T) EOS tokens strictly before i
    return eos_before == 0, is_eos.any(-1)


class HFRolloutEngine:
    """Samples with ``model.generate`` (KV cache on); see the module docstring for the RNG."""

    def __init__(self, model, tokenizer) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], *, n: int, params: SamplingParams, generator: torch.Generator
    ) -> RolloutBatch:
        """``prompts`` token ids -> a RolloutBatch of len(prompts) × n responses, n per prompt adjacent."""
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_id)
        prompt_ids = prompt_ids.repeat_interleave(n, dim=0).to(device)  # (B, P), B = len(prompts)·n
        prompt_mask = prompt_mask.repeat_interleave(n, dim=0).to(device)  # (B, P)
        was_training = self.model.training
        self.model.eval()
        with sampling_rng(generator):
            out = self.model.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask.long(),
                max_new_tokens=params.max_new_tokens,
                eos_token_id=self.eos_id,
                pad_token_id=self.pad_id,
                use_cache=True,
                **generation_kwargs(params),
            )
        self.model.train(was_training)
        response_ids = out[:, prompt_ids.shape[1] :]  # (B, T)
        response_mask, ended = response_mask_from_eos(response_ids, self.eos_id)
        response_ids = torch.where(response_mask, response_ids, self.pad_id)  # (B, T)
        texts = [
            self.tokenizer.decode(row[mask].tolist(), skip_special_tokens=True)
            for row, mask in zip(response_ids.cpu(), response_mask.cpu())
        ]
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response_ids,
            response_mask=response_mask,
            group_index=torch.arange(len(prompts), device=device).repeat_interleave(n),
            finish_reasons=["stop" if e else "length" for e in ended.tolist()],
            texts=texts,
        )
