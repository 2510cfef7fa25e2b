"""Multi-turn tool episodes sampled by vLLM: the agent loop's TurnSampler (glassrl.agents.loop) backed by
the run's vLLM engine (glassrl.rollout.vllm, ``rollout.engine: vllm``).

Each turn is one ``LLM.generate`` call over the running episodes' whole contexts (prompt, earlier
turns, observations: token ids, as the HF sampler takes them), one completion each, with vLLM's
SamplingParams as the single-turn engine builds them (glassrl.rollout.vllm.sampling_params): the
stop tokens, the run's and the call format's stop strings (``include_stop_str_in_output``), the
turn's token budget as ``max_tokens``, one seed per context drawn from the run's generator. The
tokens vLLM returns are cut as the HF sampler's are (glassrl.agents.loop.trim_turn: at the first
stop token or the token completing a stop string, kept, or at the budget), so how a turn ended
is decided by the same rule with either engine; the loop then masks the observation tokens out of
every loss as with the HF sampler. The engine's weights are synced (and verified) before a turn
whenever the actor changed, so every turn of an episode samples from the same weights within one
rollout. vLLM's sampler has its own RNG: the same seed does not give the HF sampler's tokens.

``top_logprobs`` (the endpoint's OpenAI ``top_logprobs``, k per context): vLLM's ``logprobs=k``
returns the k most likely tokens at each position with the sampled one, from the distribution the
sampled token's log-prob is read from (``logprobs_mode="processed_logprobs"``: after temperature,
and after top-k / top-p when they are on, where the tokens they cut are -inf); they come with the
turn (``SampledTurn.top_logprobs``), with no second forward pass as the HF sampler's endpoint needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from glassrl.agents.loop import SampledTurn, trim_turn
from glassrl.rollout.base import SamplingParams
from glassrl.rollout.vllm import VLLMRolloutEngine, sampling_params


class VLLMTurnSampler:
    """One turn per context, sampled by ``engine``'s vLLM ``LLM`` (module docstring)."""

    samples_top_logprobs = True  # the top-k log-probs come with the sampled turn (module docstring)

    def __init__(self, engine: VLLMRolloutEngine) -> None:
        self.engine = engine
        self.device = next(engine.source.parameters()).device
        self.path = engine.path
        # the weights' versions (asynchronous training): the agent loop and the endpoint record them per token
        # when their sampler has them, as HFTurnSampler does
        self.versions = engine.versions

    @torch.no_grad()
    def sample(
        self,
        contexts: list[list[int]],
        max_new_tokens: list[int],
        params: SamplingParams,
        generator: torch.Generator,
        stop_strings: tuple[str, ...],
        with_logprobs: bool,
        top_logprobs: Sequence[int] | None = None,
    ) -> list[SampledTurn]:
        """``top_logprobs``: k per context (0: none), the turn's ``top_logprobs`` (module docstring)."""
        stops = self.engine.stops.with_strings(stop_strings)
        seeds = torch.randint(0, 2**31 - 1, (len(contexts),), generator=generator, device=generator.device).tolist()
        tops = list(top_logprobs) if top_logprobs is not None else [0] * len(contexts)
        per_context = [
            sampling_params(dataclasses.replace(params, max_new_tokens=max(1, budget)), 1, seed, stops, k)
            for budget, seed, k in zip(max_new_tokens, seeds, tops)
        ]
        completions, version = self.engine.sample(contexts, per_context)
        turns = []
        for [completion], budget, k in zip(completions, max_new_tokens, tops):
            tokens, ended = trim_turn(list(completion.token_ids), budget, stops, self.engine.tokenizer.decode)
            logprobs = [step[t].logprob for step, t in zip(completion.logprobs, tokens)] if with_logprobs else None
            versions = [version] * len(tokens) if self.engine.versions is not None else None
            top = [_most_likely(step, k) for step in completion.logprobs[: len(tokens)]] if k else None
            turns.append(SampledTurn(tokens, ended, logprobs, versions, top))
        return turns


def _most_likely(step: dict, k: int) -> list[tuple[int, float]]:
    """The k most likely tokens of one position, most likely first: vLLM's dict holds them (ranks 1..k)
    and the sampled token (its own rank, maybe past k)."""
    ranked = sorted(step.items(), key=lambda item: (-item[1].logprob, item[1].rank))
    return [(token, item.logprob) for token, item in ranked[:k]]
