"""Rollout with a Hugging Face causal LM, the default engine: a decoding loop over the
model's forward with a preallocated KV cache (:func:`decode`).

Why not ``model.generate``: its default cache (transformers' ``DynamicCache``) grows by
``torch.cat`` at every step, i.e. copies the whole cache per generated token (issue 14
measured 54 % of generation time there at 256 tokens), and a row that has ended keeps
costing a forward slot until the last row ends. The loop here:

- keeps each layer's keys and values in one buffer (B, H, P + max_new_tokens, D) written in
  place (:class:`PreallocatedCache`); attention reads a view of its filled part, so the
  tensors it sees have exactly the shapes and values ``generate``'s would;
- prefills each distinct prompt once and copies its cache rows to its n samples (generate
  computes the same rows n times);
- drops ended rows from the batch: the running rows behind them move into their cache slots
  in place (at most once per step, and only when a row ended; a copy of as many rows as
  ended), so a step costs the rows still writing;
- samples as ``generate`` does, with transformers' own warpers (temperature, top-k, top-p,
  in generate's order), then ``torch.multinomial`` over all B rows of the original batch
  (ended rows get a placeholder distribution). ATen draws ``multinomial(probs, 1)`` as
  argmax(probs / q) with q ~ Exp(1) of probs' shape (the Gumbel-max form, its fast path for
  one sample), so the draws do not depend on the probabilities: the generator advances as
  in ``generate`` and every row gets the token ``generate`` gives it. tests/rollout/
  test_rollout_hf.py checks token-for-token equality and the generator's state after, greedy
  and sampled; the demo's figures are unchanged. That a row's numbers do not depend on how
  many other rows share the forward pass holds for the CPU kernels (tested); on CUDA, cuBLAS
  may pick kernels by batch size, and a token may then differ from ``generate``'s at a near
  tie (rounding of the same logits, so the same distribution); not yet checked on a GPU.

``model.generate`` (:func:`generate_with_hf`) remains the reference the tests compare with,
and the path for models whose cache is not plain full attention (sliding-window, linear
attention) or whose forward lacks ``position_ids`` / ``logits_to_keep``. ``torch.compile``
is not used: on CPU its compilation (100 s for the default model) costs more than it saves in a
run of the demo's length, and its kernels need not give ``generate``'s tokens
(benchmarks/bench_generation.py, BENCHMARKS.md). On CUDA, where a decoding step of a model of real
size is launch-bound, :func:`sampler_for` picks glassrl.rollout.graphed's loop instead: these
steps over a static cache, each replayed from a CUDA graph. On a CPU, when the weights are larger than
the last-level cache (a decoding step then streams them from memory), the linear layers' products run
by oneDNN over weights reordered once per rollout (glassrl.rollout.packed_weights: 1.75× faster decoding
steps at 0.5 B; the same distribution, other rounding, so not ``generate``'s tokens at a near tie).

Sampling randomness: the loop draws from the caller's ``generator`` directly. ``generate``
draws from torch's *global* RNG (torch.multinomial), which other code also draws from, so
:func:`generate_with_hf` runs inside :func:`sampling_rng`: the global state is set from the
caller's generator right before, copied back into it right after, and the global state is
then restored. The trainer owns that generator and saves it in checkpoints, so a resumed run
samples exactly the tokens the uninterrupted run would have.

Where a response ends: at any stop token or stop string of a :class:`~glassrl.rollout.stops.StopSet`
(the tokenizer's EOS, the model's ``generation_config`` EOS ids, the chat template's end-of-turn
token, ``rollout.stop``; glassrl.rollout.stops), the stopping token included. Both paths check
stop strings the same way after every token, so they stop at the same token.

The checkpoint's own ``generation_config`` may carry repetition penalties, a default top-k,
a min-p, etc.; each would make the sampling distribution differ from π_θ(·|s)/temperature,
whose log-probs the trainer computes. The loop applies none of them; for ``generate``,
``_NEUTRAL`` switches them off. Those the config asks for (``rollout.top_k``, ``top_p``,
``min_p``, ``repetition_penalty``) both paths apply alike, in ``generate``'s order; they shape
the draw, not the log-probs (as top-k and top-p, and as TRL and verl compute them).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial

import torch
from transformers.cache_utils import DynamicCache
from transformers.generation.stopping_criteria import StoppingCriteriaList

from glassrl.data.records import PromptRecord
from glassrl.models.loading import pad_id
from glassrl.models.shared_prefix import attention_mask_for, distinct_rows, full_attention
from glassrl.rollout.base import PolicyVersions, RolloutBatch, SamplingParams, masked_token_lists
from glassrl.rollout.decoding import (
    PreallocatedCache,
    cache_argument,
    compaction,
    draw,
    logits_warpers,
    sampled_logprobs,
)
from glassrl.rollout.graphed import GraphedDecoder, why_not_graphed
from glassrl.rollout.packed_weights import PackedWeights, packed_path, why_not_packed
from glassrl.rollout.stops import StopSet, StopStringCriteria, stop_set

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
    cut by top-k / top-p / min-p (or argmax when greedy), after the repetition penalty when one
    is set, with every other logits processor off."""
    if params.greedy:
        sampling = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    else:
        sampling = {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}
        sampling["min_p"] = params.min_p if params.min_p > 0 else None
    return {**_NEUTRAL, **sampling, "repetition_penalty": params.repetition_penalty}


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


def why_not_decode(model) -> str | None:
    """Why :func:`decode` cannot run ``model`` (None when it can): it runs a decoder-only model whose
    cache is full attention in every layer (transformers' ``DynamicLayer``) and whose forward takes
    a cache (under either of transformers' names, :func:`cache_argument`), ``position_ids`` and
    ``logits_to_keep``, as ``generate`` would pass them."""
    if model.config.is_encoder_decoder:
        return "an encoder-decoder model"
    missing = {"position_ids", "logits_to_keep"} - inspect.signature(model.forward).parameters.keys()
    if cache_argument(model) is None:
        missing.add("cache (or past_key_values)")
    if missing:
        return f"{type(model).__name__}.forward takes no {', '.join(sorted(missing))}"
    if not full_attention(model.config):
        return "its attention is not full attention in every layer (a sliding window or linear attention)"
    return None


@torch.no_grad()
def decode(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    params: SamplingParams,
    *,
    stops: StopSet,
    pad_id: int,
    generator: torch.Generator,
    logprobs_out: torch.Tensor | None = None,
    decode_text: Callable[[list[list[int]]], list[str]] | None = None,
    versions: PolicyVersions | None = None,
    versions_out: torch.Tensor | None = None,
    packed: bool = False,
) -> torch.Tensor:
    """The tokens after left-padded prompts, (B, T) long: T = the steps run (until every row has
    ended at a stop of ``stops`` or at ``params.max_new_tokens``), ``pad_id`` after a row's stop.
    The same tokens as :func:`generate_with_hf` for the same generator state, which is left as it
    leaves it.

    prompt_ids (B, P) long, left-padded; prompt_mask (B, P) bool. ``model`` in eval mode,
    ``why_not_decode(model)`` is None. ``logprobs_out`` (B, max_new_tokens) float32, when given,
    receives :func:`sampled_logprobs` of each token written (untouched after a row's stop).
    ``decode_text``: token-id lists -> texts, special tokens kept (the tokenizer's
    ``batch_decode``); needed when ``stops`` has strings. ``versions`` (asynchronous training):
    refreshed before every forward pass, which may load newer weights into ``model`` (the cache keeps
    the keys and values the earlier weights wrote, as PipelineRL's in-flight weight updates do:
    Piché et al. 2025); ``versions_out`` (B, max_new_tokens) long receives the version of the pass
    that gave each token its distribution. ``packed``: the linear layers' products by oneDNN over weights
    reordered for this rollout (glassrl.rollout.packed_weights; the same distribution, other rounding).
    """
    B, P = prompt_ids.shape
    device = prompt_ids.device
    steps = params.max_new_tokens
    if steps == 0:
        return prompt_ids.new_zeros((B, 0))
    if stops.strings and decode_text is None:
        raise ValueError("decode: stop strings need decode_text")
    stop_ids = torch.tensor(stops.ids, dtype=torch.long, device=device)
    cache_name = cache_argument(model)  # transformers renamed past_key_values to cache in 5.24
    cache = PreallocatedCache(len(DynamicCache(config=model.config).layers), P + steps, B)
    # generate drops an all-ones mask (no padding), which lets attention skip it; so do we.
    padded = not bool(prompt_mask.all())
    mask = torch.ones((B, P + steps), dtype=torch.long, device=device)  # (B, P+T), compacted with the cache
    mask[:, :P] = prompt_mask.long()
    # Position ids as generate's: count of real tokens before, pads at 0; then +1 per step.
    positions = (prompt_mask.long().cumsum(-1) - 1).masked_fill(~prompt_mask, 0)  # (B, P)
    tokens = torch.full((B, steps), pad_id, dtype=torch.long, device=device)  # (B, T)
    rows = torch.arange(B, device=device)  # (n,) the original row of each row still writing
    warpers = logits_warpers(params)
    penalised = params.repetition_penalty != 1.0  # draw() then reads each row's tokens so far

    # sdpa and eager take a 4D mask as it is; another attention gets the 2D mask transformers converts.
    own_mask = model.config.get_text_config()._attn_implementation in ("sdpa", "eager")

    def last_logits(ids: torch.Tensor, attention: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        if padded and own_mask and ids.shape[1] == 1:
            # One query per row: the key padding is its whole mask, (rows, 1, 1, length), the mask
            # transformers would build at every step (in the attention's own form).
            attention = attention_mask_for(model, attention.bool()[:, None, None, :])
        logits = model(
            input_ids=ids,
            attention_mask=attention if padded else None,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{cache_name: cache},
        ).logits
        return logits[:, -1].to(dtype=torch.float32, copy=True)  # (rows, V)

    # Prefill each distinct prompt once (generate computes the n samples' identical rows n times;
    # a row's numbers do not depend on the other rows), then copy its cache rows to its samples.
    first, inverse = distinct_rows(prompt_ids, prompt_mask)  # (U,), (B,)
    version = versions.refresh() if versions is not None else 0  # of the weights of the next forward pass
    weights = PackedWeights(model, B) if packed else None  # glassrl.rollout.packed_weights
    if weights is not None:
        weights.pack()
    try:
        logits = last_logits(prompt_ids[first], mask[first, :P], positions[first])  # (U, V)
        if len(first) < B:
            cache.take_rows(inverse)
            logits = logits[inverse]  # (B, V)
        length, positions = P, positions[:, -1:]  # (B, 1)
        for t in range(steps):
            seen = torch.cat([prompt_ids[rows], tokens[rows, :t]], dim=1) if penalised else None  # (n, P+t)
            chosen = draw(logits, rows, B, params, warpers, generator, seen)  # (n,)
            tokens[rows, t] = chosen
            if logprobs_out is not None:
                logprobs_out[rows, t] = sampled_logprobs(logits, chosen, params)
            if versions_out is not None:
                versions_out[rows, t] = version
            ended = torch.isin(chosen, stop_ids)  # (n,)
            if stops.strings:  # decode each running row's last tokens (glassrl.rollout.stops)
                tails = tokens[rows, max(0, t + 1 - stops.window) : t + 1].tolist()
                ended |= torch.tensor(stops.completes_string(tails, decode_text), device=device)
            if t + 1 == steps or bool(ended.all()):
                return tokens[:, : t + 1]
            length += 1
            positions = positions + 1  # (n, 1)
            if bool(ended.any()):
                # A row's numbers do not depend on its place in the batch (module docstring).
                k, to, source, order = compaction(ended)
                rows, chosen, positions = rows[order], chosen[order], positions[order]
                cache.move_rows(to, source, k)
                mask[to, :length] = mask[source, :length]
            if versions is not None:
                version, before = versions.refresh(), version
                if weights is not None and version != before:
                    weights.pack()  # newer weights were loaded: reorder them
            logits = last_logits(chosen[:, None], mask[: len(rows), :length], positions)  # (n, V)
    finally:
        if weights is not None:
            weights.restore()


def generate_with_hf(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    params: SamplingParams,
    *,
    stops: StopSet,
    pad_id: int,
    generator: torch.Generator,
    logprobs_out: torch.Tensor | None = None,
    decode_text: Callable[[list[list[int]]], list[str]] | None = None,
    versions: PolicyVersions | None = None,
    versions_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`decode`'s result by ``model.generate`` (the reference, and the path for models that
    :func:`why_not_decode` refuses): the tokens after the prompts, (B, T) long; ``logprobs_out``
    as :func:`decode` fills it (from ``generate``'s raw logits). Stop strings are checked by
    :class:`~glassrl.rollout.stops.StopStringCriteria`, as :func:`decode` checks them. With no stop
    id, ``generate`` falls back to the model's ``generation_config`` EOS. ``versions`` is refreshed
    once, before: ``generate`` runs whole with one version of the weights (``versions_out``)."""
    if stops.strings and decode_text is None:
        raise ValueError("generate_with_hf: stop strings need decode_text")
    criteria = [StopStringCriteria(stops, decode_text, prompt_ids.shape[1])] if stops.strings else []
    if versions_out is not None:
        versions_out.fill_(versions.refresh() if versions is not None else 0)
    with sampling_rng(generator):
        out = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask.long(),
            max_new_tokens=params.max_new_tokens,
            eos_token_id=list(stops.ids) or None,
            pad_token_id=pad_id,
            stopping_criteria=StoppingCriteriaList(criteria),
            use_cache=True,
            return_dict_in_generate=True,
            output_logits=logprobs_out is not None,
            **generation_kwargs(params),
        )
    tokens = out.sequences[:, prompt_ids.shape[1] :]  # (B, T)
    if logprobs_out is not None:
        logprobs_out[:, : tokens.shape[1]] = sampled_logprobs(torch.stack(out.logits, dim=1), tokens, params)
    return tokens


def sampler_for(model) -> tuple[Callable[..., torch.Tensor], str]:
    """The function that samples from ``model`` (on CUDA glassrl.rollout.graphed's
    :class:`~glassrl.rollout.graphed.GraphedDecoder`, else :func:`decode`, with its weights reordered for
    oneDNN on a CPU where that is faster (glassrl.rollout.packed_weights), else :func:`generate_with_hf`, all
    taking the same arguments) and, for the run's start-up lines, which one it is and why: no faster path
    turns off silently."""
    refused = why_not_decode(model)
    if refused is None:
        if (unfit := why_not_graphed(model)) is None:
            return GraphedDecoder(), "glassrl's decoding loop, each step a CUDA graph (static KV cache, batch buckets)"
        line = f"glassrl's decoding loop (preallocated KV cache, passed as `{cache_argument(model)}`)"
        if next(model.parameters()).device.type == "cuda":
            return decode, f"{line}; no CUDA graphs: {unfit}"
        sample = partial(decode, packed=True) if why_not_packed(model) is None else decode
        return sample, f"{line}; {packed_path(model)}"
    return generate_with_hf, f"model.generate; the decoding loop cannot run this model: {refused}"


class HFRolloutEngine:
    """Samples with :func:`decode` (or ``model.generate`` where it cannot); see the module docstring.

    ``sampling_logprobs``: keep log π of each sampled token as computed while sampling
    (``RolloutBatch.rollout_logprobs``, :func:`sampled_logprobs`), for the train/rollout
    mismatch metrics and truncated importance sampling (glassrl.algos.off_policy).
    ``stops``: where responses end (glassrl.rollout.stops); default: the stop tokens of the
    tokenizer and the model's ``generation_config``, no stop string. ``versions`` (asynchronous
    training): the version of the weights each token is sampled with (``RolloutBatch.policy_versions``).
    """

    def __init__(
        self,
        model,
        tokenizer,
        sampling_logprobs: bool = False,
        stops: StopSet | None = None,
        versions: PolicyVersions | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.sampling_logprobs = sampling_logprobs
        self.versions = versions
        self.stops = stops if stops is not None else stop_set(tokenizer, getattr(model, "generation_config", None))
        self.pad_id = pad_id(tokenizer)
        self.sample, self.path = sampler_for(model)

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
        """``prompts`` token ids -> a RolloutBatch of len(prompts) × n responses, n per prompt adjacent
        (``records``, the prompts' rows, are for multi-turn engines: a single turn needs none)."""
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_id)
        prompt_ids = prompt_ids.repeat_interleave(n, dim=0).to(device)  # (B, P), B = len(prompts)·n
        prompt_mask = prompt_mask.repeat_interleave(n, dim=0).to(device)  # (B, P)
        was_training = self.model.training
        self.model.eval()
        B = prompt_ids.shape[0]
        logprobs = torch.zeros((B, params.max_new_tokens), device=device) if self.sampling_logprobs else None
        versions = (
            None if self.versions is None else torch.zeros((B, params.max_new_tokens), dtype=torch.long, device=device)
        )
        try:
            response_ids = self.sample(
                self.model,
                prompt_ids,
                prompt_mask,
                params,
                stops=self.stops,
                pad_id=self.pad_id,
                generator=generator,
                logprobs_out=logprobs,
                decode_text=self.tokenizer.batch_decode,
                versions=self.versions,
                versions_out=versions,
            )  # (B, T)
        finally:
            self.model.train(was_training)
        response_mask, ended = self.stops.response_mask(response_ids, self.tokenizer.decode)
        response_ids = torch.where(response_mask, response_ids, self.pad_id)  # (B, T)
        T = response_ids.shape[1]
        texts = self.texts(masked_token_lists(response_ids, response_mask))
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response_ids,
            response_mask=response_mask,
            group_index=torch.arange(len(prompts), device=device).repeat_interleave(n),
            finish_reasons=["stop" if e else "length" for e in ended.tolist()],
            texts=texts,
            rollout_logprobs=None if logprobs is None else torch.where(response_mask, logprobs[:, :T], 0.0),
            policy_versions=None if versions is None else torch.where(response_mask, versions[:, :T], -1),
        )

    def texts(self, responses: list[list[int]]) -> list[str]:
        """Each response's text, decoded in one call: its tokens without special tokens, a final stop
        token left out."""
        cut = [tokens[:-1] if tokens and tokens[-1] in self.stops.ids else tokens for tokens in responses]
        return self.tokenizer.batch_decode(cut, skip_special_tokens=True)
