"""Rollout with vLLM (optional extra ``pip install 'glassrl[vllm]'``, GPU only), colocated with
the actor: the same GPU, the same process.

**Never run in this repository**: it has no GPU, and the tests of this module
(tests/rollout/test_rollout_vllm.py, ``@pytest.mark.gpu``) skip here. The calls below follow
vLLM's documented API (``LLM``, ``SamplingParams``, ``collective_rpc``, sleep mode) and the way
TRL's colocate mode and verl's rollout load a trainer's weights into the engine.

Sampling parameters mean what they mean in the Hugging Face engine (glassrl.rollout.hf):

    temperature  -> temperature (greedy -> temperature 0: vLLM's argmax decoding)
    top_p        -> top_p (1 = off)
    top_k        -> top_k (glassrl's 0 = off is vLLM's -1)
    min_p, repetition_penalty -> the same (vLLM's penalty, as transformers', counts prompt tokens)
    max_new_tokens -> max_tokens;  n -> n (the n samples of a prompt adjacent, group_index as HF)
    generator    -> one seed per prompt drawn from it (SamplingParams.seed): the generator advances
                    as the run goes and is checkpointed, so a resumed run draws the same seeds
    (no repetition penalty, min-p or other processor: ``generation_config="vllm"`` keeps the
    checkpoint's generation_config.json defaults out, as the HF engine's ``_NEUTRAL`` does)

A response ends at a stop token (included, and trained on, as the HF engine's EOS), at the token
that completes a stop string, or at max_tokens: the engine's StopSet (glassrl.rollout.stops: the
tokenizer's and generation_config's EOS, the chat template's end of turn, ``rollout.stop``) is
passed as ``stop_token_ids`` and ``stop`` (``include_stop_str_in_output``: the text keeps it, as
the HF engine's does), beside the EOS ids vLLM stops at by itself.

The engine's log-probs are kept (``logprobs=0``: the sampled token's own log-prob) in
``RolloutBatch.rollout_logprobs``, read with ``logprobs_mode="processed_logprobs"``: after
temperature, so that they are comparable with the trainer's π_old at that temperature (vLLM's
default, raw_logprobs, is before temperature). With top-k / top-p on they are the truncated
distribution's (vLLM computes them after the cut), the distribution it sampled from.

Weights (colocated): before a rollout, if the actor's parameters changed since the last one
(their in-place version counters moved: an optimiser step, a checkpoint load), the actor's
state dict is loaded into the engine's model in place with the model's own
``load_weights`` (Hugging Face names, as in a checkpoint), through ``LLM.collective_rpc`` on
the in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``). Sleep mode
(``enable_sleep_mode``): after each rollout ``llm.sleep(level=1)`` frees the KV cache and
moves the weights to CPU memory, so training has the GPU; before the next,
``wake_up(tags=["weights"])``, the weight sync, then ``wake_up(tags=["kv_cache"])`` (verl's
order: the KV cache comes back only once the weights are in place).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.models.loading import pad_id
from glassrl.rollout.base import RolloutBatch, SamplingParams
from glassrl.rollout.hf import left_pad
from glassrl.rollout.stops import StopSet, stop_set


def _vllm():
    try:
        import vllm
    except ImportError:
        raise GlassrlError("rollout.engine = vllm needs the vllm package: pip install 'glassrl[vllm]'") from None
    return vllm


def sampling_params(params: SamplingParams, n: int, seed: int, stops: StopSet):
    """vLLM's SamplingParams for glassrl's ``params`` and ``stops`` (module docstring), the sampled
    tokens' log-probs kept."""
    vllm = _vllm()
    return vllm.SamplingParams(
        n=n,
        temperature=0.0 if params.greedy else params.temperature,
        top_p=1.0 if params.greedy else params.top_p,
        top_k=-1 if params.greedy or params.top_k == 0 else params.top_k,
        min_p=0.0 if params.greedy else params.min_p,
        repetition_penalty=params.repetition_penalty,
        max_tokens=params.max_new_tokens,
        stop_token_ids=list(stops.ids),
        stop=list(stops.strings),
        include_stop_str_in_output=True,
        seed=seed,
        logprobs=0,
        detokenize=False,
    )


def _load_weights(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Run by ``collective_rpc`` on the engine's worker: the actor's weights into its model."""
    return len(worker.model_runner.model.load_weights(weights))


class VLLMRolloutEngine:
    """A RolloutEngine (glassrl.rollout.base) sampling with a vLLM ``LLM`` whose weights follow ``source``."""

    def __init__(self, llm: Any, tokenizer, source: nn.Module, *, sleep: bool, stops: StopSet | None = None) -> None:
        self.llm, self.tokenizer, self.source, self.sleep = llm, tokenizer, source, sleep
        self.stops = stops if stops is not None else stop_set(tokenizer, getattr(source, "generation_config", None))
        self.pad_id = pad_id(tokenizer)
        self._synced: tuple[int, ...] | None = None  # the source's parameter versions at the last sync
        self.path = "vLLM (its own KV cache; weights copied from the actor when they change)"
        if sleep:
            llm.sleep(level=1)

    @classmethod
    def colocated(
        cls,
        model: nn.Module,
        tokenizer,
        *,
        gpu_memory_utilization: float,
        sleep: bool,
        seed: int,
        stops: StopSet | None = None,
    ) -> VLLMRolloutEngine:
        """An engine on ``model``'s GPU, loaded from the checkpoint ``model`` was loaded from."""
        if hasattr(model, "peft_config"):
            raise GlassrlError("rollout.engine = vllm with model.lora: syncing adapters into vLLM is not built")
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise GlassrlError(f"rollout.engine = vllm needs the actor on a GPU; it is on {device}")
        path = Path(model.name_or_path)
        if not (path / "config.json").is_file():
            raise GlassrlError(f"rollout.engine = vllm: {path} is not the actor's checkpoint directory")
        # The engine in this process, so that its model can take the actor's tensors without a copy
        # through another process (TRL's colocate mode does the same).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        vllm = _vllm()
        llm = vllm.LLM(
            model=str(path),
            tokenizer=str(path),
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=sleep,
            seed=seed,
            generation_config="vllm",  # not the checkpoint's sampling defaults (penalties, top-k): as hf's _NEUTRAL
            logprobs_mode="processed_logprobs",
        )
        return cls(llm, tokenizer, model, sleep=sleep, stops=stops)

    def _versions(self) -> tuple[int, ...]:
        # Every in-place write (optimizer.step, load_state_dict) bumps a tensor's version counter.
        return tuple(p._version for p in self.source.parameters())

    def sync_weights(self) -> None:
        """Load ``source``'s current weights into the engine's model (in place)."""
        weights = [(name, tensor.detach()) for name, tensor in self.source.state_dict().items()]
        self.llm.collective_rpc(_load_weights, args=(weights,))
        self._synced = self._versions()

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        *,
        n: int,
        params: SamplingParams,
        generator: torch.Generator,
        records: Sequence[PromptRecord] | None = None,
    ) -> RolloutBatch:
        """len(prompts) × n responses, the n of a prompt adjacent; ``rollout_logprobs`` kept."""
        _vllm()
        from vllm.inputs import TokensPrompt

        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator, device=generator.device).tolist()
        if self.sleep:
            self.llm.wake_up(tags=["weights"])
        if self._synced != self._versions():
            self.sync_weights()
        if self.sleep:
            self.llm.wake_up(tags=["kv_cache"])
        try:
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                [sampling_params(params, n, seed, self.stops) for seed in seeds],
                use_tqdm=False,
            )
        finally:
            if self.sleep:
                self.llm.sleep(level=1)
        return self._batch(prompts, n, [o.outputs for o in outputs])

    def _batch(self, prompts: list[list[int]], n: int, completions: list[list[Any]]) -> RolloutBatch:
        device = next(self.source.parameters()).device
        rows = [c for per_prompt in completions for c in per_prompt]  # B = len(prompts)·n, a prompt's n adjacent
        T = max(1, max(len(c.token_ids) for c in rows))
        ids = torch.full((len(rows), T), self.pad_id, dtype=torch.long)  # (B, T)
        logprobs = torch.zeros((len(rows), T), dtype=torch.float32)  # (B, T)
        for b, c in enumerate(rows):
            tokens = list(c.token_ids)
            ids[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            logprobs[b, : len(tokens)] = torch.tensor([step[t].logprob for step, t in zip(c.logprobs, tokens)])
        lengths = torch.tensor([len(c.token_ids) for c in rows])  # (B,) the stop token included
        response_mask = torch.arange(T) < lengths[:, None]  # (B, T)
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_id)
        texts = [self.tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(ids, response_mask)]
        return RolloutBatch(
            prompt_ids=prompt_ids.repeat_interleave(n, dim=0).to(device),  # (B, P)
            prompt_mask=prompt_mask.repeat_interleave(n, dim=0).to(device),  # (B, P)
            response_ids=ids.to(device),
            response_mask=response_mask.to(device),
            group_index=torch.arange(len(prompts), device=device).repeat_interleave(n),
            finish_reasons=["length" if c.finish_reason == "length" else "stop" for c in rows],
            texts=texts,
            rollout_logprobs=torch.where(response_mask, logprobs, 0.0).to(device),
        )
