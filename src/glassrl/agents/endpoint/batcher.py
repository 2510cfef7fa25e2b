"""Concurrent requests of the running agents, sampled together by the engine, in lockstep.

The agents run in threads (or processes) and call the endpoint whenever they like; the engine
samples in the rollout's thread. A batch is sampled when **every running episode is waiting** on
at least one request (an episode whose agent returned is no longer running): then every waiting
request is sampled in one call of the :class:`~glassrl.agents.loop.TurnSampler`, in episode order
(within an episode, in arrival order), requests with different stop strings in separate calls.
This is the native loop's batching (turn k of every running response in one batch), so the
same seeds give the same batches and, with the same sampler, the same tokens; and it is the
batching an engine wants: as many contexts per forward pass as the agents allow.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from glassrl.agents.loop import SampledTurn, TurnSampler
from glassrl.rollout.base import SamplingParams


@dataclass
class Pending:
    """One request waiting: its context, ``n`` samples of it, each with at most ``max_new_tokens``."""

    episode: int
    context: list[int]
    n: int
    max_new_tokens: int
    stop_strings: tuple[str, ...]
    top_logprobs: int = 0  # the k most likely tokens at each sampled position, with their log-probs
    future: Future = field(default_factory=Future)  # -> n (SampledTurn, top-k list per token or None)


class Lockstep:
    """The waiting requests and the running episodes (module docstring)."""

    def __init__(self, episodes: int) -> None:
        self.running = set(range(episodes))
        self.pending: list[Pending] = []
        self.changed = threading.Condition()

    def submit(self, request: Pending) -> Future:
        with self.changed:
            self.pending.append(request)
            self.changed.notify_all()
        return request.future

    def finish(self, episode: int) -> None:
        """Episode ``episode``'s agent returned (or failed): it no longer holds a batch back."""
        with self.changed:
            self.running.discard(episode)
            self.changed.notify_all()

    def next_batch(self, timeout_s: float) -> list[Pending] | None:
        """The waiting requests once every running episode waits; None when none is running.
        TimeoutError past ``timeout_s`` without a batch."""
        with self.changed:
            ready = self.changed.wait_for(
                lambda: not self.running or self.running <= {p.episode for p in self.pending}, timeout_s
            )
            if not ready:
                waiting = {p.episode for p in self.pending}
                raise TimeoutError(sorted(self.running - waiting))
            if not self.running and not self.pending:
                return None
            batch = sorted(self.pending, key=lambda p: p.episode)  # stable: arrival order within an episode
            self.pending = []
            return batch


def sample_batch(
    sampler: TurnSampler,
    batch: list[Pending],
    params: SamplingParams,
    generator: torch.Generator,
    top_logprobs: TopLogprobs | None = None,
) -> None:
    """Sample every request of ``batch`` (``n`` rows each, log-probs kept), one sampler call per set of
    stop strings, and resolve each request's future with its n turns (and their top-k log-probs when it
    asked: from the sampler as it samples, vLLM's, else by ``top_logprobs``)."""
    groups: dict[tuple[str, ...], list[Pending]] = {}
    for p in batch:
        groups.setdefault(p.stop_strings, []).append(p)
    for stop_strings, requests in groups.items():
        contexts = [p.context for p in requests for _ in range(p.n)]
        budgets = [p.max_new_tokens for p in requests for _ in range(p.n)]
        ks = [p.top_logprobs for p in requests for _ in range(p.n)]
        turns: list[SampledTurn]
        try:
            if getattr(sampler, "samples_top_logprobs", False):  # the top-k come with the turn
                turns = sampler.sample(contexts, budgets, params, generator, stop_strings, True, top_logprobs=ks)
                tops = [turn.top_logprobs if k else None for turn, k in zip(turns, ks)]
            else:
                turns = sampler.sample(contexts, budgets, params, generator, stop_strings, True)
                tops = [
                    top_logprobs(context, turn.tokens, k) if k and top_logprobs else None
                    for k, context, turn in zip(ks, contexts, turns)
                ]
        except BaseException as err:
            for p in requests:
                p.future.set_exception(err)
            raise
        at = 0
        for p in requests:
            p.future.set_result(list(zip(turns[at : at + p.n], tops[at : at + p.n])))
            at += p.n


# (context ids, sampled ids, k) -> per sampled token, the k most likely (token id, log-prob)
TopLogprobs = Callable[[list[int], list[int], int], list[list[tuple[int, float]]]]


def gives_top_logprobs(sampler) -> bool:
    """The endpoint can answer ``top_logprobs`` with this sampler: it gives them as it samples (vLLM), or
    it has a model to compute them from (:func:`model_top_logprobs`)."""
    return getattr(sampler, "samples_top_logprobs", False) or getattr(sampler, "model", None) is not None


def model_top_logprobs(sampler, params: SamplingParams) -> TopLogprobs | None:
    """Top-k log-probs by one forward pass of the sampler's model over context + completion, under
    softmax(logits / temperature) as the sampled log-probs (1 when greedy); None for a sampler
    without a model (an engine that does not expose its logits)."""
    model = getattr(sampler, "model", None)
    if model is None:
        return None
    temperature = 1.0 if params.greedy else params.temperature

    @torch.no_grad()
    def top(context: list[int], tokens: list[int], k: int) -> list[list[tuple[int, float]]]:
        if not tokens:
            return []
        ids = torch.tensor([context + tokens], device=sampler.device)  # (1, L)
        was_training = model.training
        model.eval()
        try:
            logits = model(input_ids=ids).logits[0, len(context) - 1 : -1].float()  # (T, V)
        finally:
            model.train(was_training)
        values, indices = torch.log_softmax(logits / temperature, dim=-1).topk(k, dim=-1)  # (T, k)
        return [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]

    return top
