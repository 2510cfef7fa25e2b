"""The decoding loop with every decoding step one CUDA graph: a static KV cache, fixed batch buckets.

On a GPU a decoding step of a model of a size people post-train (~0.5 B parameters, a few hundred
rows) is launch-bound: the kernels of one step (~15 per layer) take less time than the Python and
the launches around them (BENCHMARKS.md, "On a GPU": 8,000 launches per step, 19 ms of kernels in a
190–270 ms step). A CUDA graph replays the step's kernels with one launch. A graph fixes the
addresses and shapes of everything it reads and writes, hence (as transformers' ``StaticCache``,
vLLM's and SGLang's decode graphs):

- a **static cache**: each layer's keys and values in buffers (rows, H, capacity, D) that outlive a
  call (:class:`StaticLayer`); a decoding step writes its position with ``index_copy_`` at an index
  held in a tensor (``write_at``) and attention reads the whole capacity, the positions not yet
  written hidden by the attention mask (``allowed``, (rows, 1, 1, capacity) bool, True = attend);
- **batch buckets**: one graph per bucket (1, 2, 4, … up to the rows of the cache) captured when
  first needed; a step runs the smallest bucket that holds the rows still writing, so ended rows
  still leave the batch as in :func:`glassrl.rollout.hf.decode` (the running rows move into their
  slots), in steps of a power of two;
- the capacity rounded up to a multiple of ``CAPACITY_STEP`` so that calls with other prompt widths
  reuse the cache and its graphs; a larger call allocates a larger cache and captures anew.

What stays out of the graph: the prefill (one eager pass over each distinct prompt, written into
the same buffers, exactly :func:`~glassrl.rollout.hf.decode`'s), and the sampling (transformers'
warpers, ``torch.multinomial`` over all B rows from the caller's generator), which is
:func:`~glassrl.rollout.hf.decode`'s line for line: the generator advances as there, and a row
gets the token ``decode`` gives it wherever the two steps' logits agree. They agree up to float
rounding: attention over the capacity with the unwritten tail masked sums the same terms as over
the filled part (the masked ones are exact zeros), in another order. tests/rollout/
test_rollout_graphed.py runs the same loop without capture (``capture=False``) on CPU against
``decode``: the same tokens, log-probs to 1e-5; tests/gpu/test_gpu_graphed.py captures on CUDA.

A graph reads the weights where they were at capture: an optimiser step updates them in place
(seen by the next replay), a weight load that replaces the tensors is noticed (their addresses are
part of the graphs' key) and the graphs are captured again; so is a change of autocast dtype.
Autocast's cache of cast weights is off during capture (a cached cast would be freed after the
capture's autocast region, and the graph would read freed memory); the casts are then part of the
graph and follow the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch
from torch.distributed.tensor import DTensor
from transformers.cache_utils import Cache, DynamicCache

from glassrl.models.precision import autocast_dtype
from glassrl.models.shared_prefix import attention_mask_for, distinct_rows
from glassrl.rollout.base import SamplingParams
from glassrl.rollout.decoding import (
    PreallocatedCache,
    PreallocatedLayer,
    cache_argument,
    compaction,
    draw,
    logits_warpers,
    sampled_logprobs,
)
from glassrl.rollout.stops import StopSet

CAPACITY_STEP = 256  # cache positions are allocated in multiples of this


def why_not_graphed(model) -> str | None:
    """Why :class:`GraphedDecoder` cannot run ``model``, which :func:`~glassrl.rollout.hf.decode` can
    run (``why_not_decode`` is asked first), with CUDA graphs (None when it can): it needs a CUDA
    device, whole weights (not FSDP2 shards), and an attention that takes the 4D mask as a tensor
    (sdpa or eager)."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return f"the model is on {device.type}, CUDA graphs need a CUDA device"
    if any(isinstance(p, DTensor) for p in model.parameters()):
        return "its weights are sharded (FSDP2): each step gathers them, which a CUDA graph cannot hold"
    attention = model.config.get_text_config()._attn_implementation
    if attention not in ("sdpa", "eager"):
        return f"its attention ({attention}) takes no 4D mask tensor; load it with sdpa or eager attention"
    return None


class StaticLayer(PreallocatedLayer):
    """A :class:`~glassrl.rollout.decoding.PreallocatedLayer` whose buffers outlive a call, with a second
    way to write: in ``static`` mode, ``update`` writes one position at ``write_at`` (1,) long into
    the first ``bucket`` rows and returns those rows over the whole capacity (bucket, H, capacity, D),
    shapes and addresses that do not change from step to step (what a CUDA graph needs)."""

    def __init__(self, capacity: int, batch: int, write_at: torch.Tensor) -> None:
        super().__init__(capacity, batch)
        self.write_at = write_at
        self.key_buffer = self.value_buffer = None
        self.static, self.bucket = False, batch

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        shape = (self.batch, key_states.shape[1], self.capacity, key_states.shape[-1])
        kept = self.key_buffer
        if kept is None or kept.shape != shape or kept.dtype != key_states.dtype or kept.device != key_states.device:
            # zeros: rows no prompt fills (a bucket past B) attend finite numbers
            self.key_buffer = key_states.new_zeros(shape)
            self.value_buffer = value_states.new_zeros(shape)
        self.dtype, self.device = key_states.dtype, key_states.device
        self.rows = key_states.shape[0]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.static:
            return super().update(key_states, value_states, *args, **kwargs)
        keys, values = self.key_buffer[: self.bucket], self.value_buffer[: self.bucket]
        keys.index_copy_(2, self.write_at, key_states)
        values.index_copy_(2, self.write_at, value_states)
        return keys, values

    def restart(self) -> None:
        """Empty for a new call; the buffers are kept."""
        self.rows = self.length = 0
        self.is_initialized = False
        self.static = False


class StaticCache(PreallocatedCache):
    """A :class:`StaticLayer` per attention layer, ``capacity`` positions and ``batch`` rows each,
    and the inputs of a decoding step at fixed addresses: ``ids`` (batch, 1) long, ``positions``
    (batch, 1) long, ``allowed`` (batch, 1, 1, capacity) bool, ``write_at`` (1,) long."""

    def __init__(self, num_layers: int, capacity: int, batch: int, device: torch.device) -> None:
        self.write_at = torch.zeros(1, dtype=torch.long, device=device)
        # PreallocatedCache's rows operations over layers of its own kind
        Cache.__init__(self, layers=[StaticLayer(capacity, batch, self.write_at) for _ in range(num_layers)])
        self.capacity, self.batch = capacity, batch
        self.ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.allowed = torch.zeros((batch, 1, 1, capacity), dtype=torch.bool, device=device)

    def restart(self) -> None:
        for layer in self.layers:
            layer.restart()
        self.allowed.zero_()
        self.allowed[..., 0] = True  # rows no prompt fills attend one (zero) position, not none (NaN)

    def go_static(self, bucket: int, length: int) -> None:
        """The next updates write position ``length`` of the first ``bucket`` rows."""
        for layer in self.layers:
            layer.static, layer.bucket, layer.length = True, bucket, length + 1
        self.write_at.fill_(length)

    def buffers(self) -> tuple[int, ...]:
        """The buffers' addresses (a graph's key: a new buffer means capturing anew)."""
        return tuple(b.data_ptr() for layer in self.layers for b in (layer.key_buffer, layer.value_buffer))


def bucket_of(rows: int, most: int) -> int:
    """The batch bucket that runs ``rows`` rows: the next power of two, at most ``most``."""
    return min(most, 1 << max(0, rows - 1).bit_length())


class GraphedDecoder:
    """:func:`glassrl.rollout.hf.decode` with a :class:`StaticCache` and, with ``capture``, each
    decoding step one CUDA graph per batch bucket (the module docstring). Called with ``decode``'s
    arguments, it returns ``decode``'s result; it keeps the cache and the graphs between calls.
    ``capture=False`` runs the same steps eagerly (CPU: the tests)."""

    def __init__(self, capture: bool = True) -> None:
        self.capture = capture
        self.cache: StaticCache | None = None
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.key: tuple = ()

    @torch.no_grad()
    def __call__(
        self,
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
        versions=None,
        versions_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """prompt_ids (B, P) long, left-padded; prompt_mask (B, P) bool -> tokens (B, T) long, as
        :func:`~glassrl.rollout.hf.decode` (same arguments, same generator use).

        ``versions`` (asynchronous training, the async branch's ``PolicyVersions``: ``refresh()`` ->
        int, which may load newer weights into ``model``) is refreshed before every forward pass, as
        the async branch's ``decode`` does; weights it replaces are captured anew. ``versions_out``
        (B, max_new_tokens) long receives the version of the pass that gave each token its
        distribution."""
        B, P = prompt_ids.shape
        device = prompt_ids.device
        steps = params.max_new_tokens
        if steps == 0:
            return prompt_ids.new_zeros((B, 0))
        if stops.strings and decode_text is None:
            raise ValueError("GraphedDecoder: stop strings need decode_text")
        cache = self._cache(model, B, P + steps, device)
        stop_ids = torch.tensor(stops.ids, dtype=torch.long, device=device)
        cache_name = cache_argument(model)
        cache.allowed[:B, 0, 0, :P] = prompt_mask
        positions = (prompt_mask.long().cumsum(-1) - 1).masked_fill(~prompt_mask, 0)  # (B, P) as decode's
        tokens = torch.full((B, steps), pad_id, dtype=torch.long, device=device)  # (B, T)
        rows = torch.arange(B, device=device)  # (n,) the original row of each row still writing
        warpers = logits_warpers(params)
        penalised = params.repetition_penalty != 1.0  # draw() then reads each row's tokens so far

        # The prefill: decode's, eager, into the first rows of the static buffers.
        padded = not bool(prompt_mask.all())
        first, inverse = distinct_rows(prompt_ids, prompt_mask)  # (U,), (B,)
        version = versions.refresh() if versions is not None else 0  # of the next forward pass's weights
        logits = (
            model(
                input_ids=prompt_ids[first],
                attention_mask=prompt_mask[first].long() if padded else None,
                position_ids=positions[first],
                use_cache=True,
                logits_to_keep=1,
                **{cache_name: cache},
            )
            .logits[:, -1]
            .to(dtype=torch.float32, copy=True)
        )  # (U, V)
        if len(first) < B:
            cache.take_rows(inverse)
            logits = logits[inverse]  # (B, V)
        if self.capture:
            self._keep_graphs(model, device)
        length, positions = P, positions[:, -1:]  # (B, 1)
        for t in range(steps):
            seen = torch.cat([prompt_ids[rows], tokens[rows, :t]], dim=1) if penalised else None  # (n, P+t)
            chosen = draw(logits, rows, B, params, warpers, generator, seen)  # (n,) decode's draw
            tokens[rows, t] = chosen
            if logprobs_out is not None:
                logprobs_out[rows, t] = sampled_logprobs(logits, chosen, params)
            if versions_out is not None:
                versions_out[rows, t] = version
            ended = torch.isin(chosen, stop_ids)  # (n,)
            if stops.strings:
                tails = tokens[rows, max(0, t + 1 - stops.window) : t + 1].tolist()
                ended |= torch.tensor(stops.completes_string(tails, decode_text), device=device)
            if t + 1 == steps or bool(ended.all()):
                return tokens[:, : t + 1]
            positions = positions + 1  # (n, 1)
            if bool(ended.any()):  # decode's compaction
                k, to, source, order = compaction(ended)
                rows, chosen, positions = rows[order], chosen[order], positions[order]
                cache.move_rows(to, source, k)
                cache.allowed[to] = cache.allowed[source]
            n = len(rows)
            cache.ids[:n, 0] = chosen
            cache.positions[:n] = positions
            cache.allowed[:, 0, 0, length] = True  # the new token attends itself
            bucket = bucket_of(n, cache.batch)
            cache.go_static(bucket, length)
            if versions is not None:
                version = versions.refresh()
                if self.capture:
                    self._keep_graphs(model, device)
            logits = self._step(model, bucket)[:n]  # (n, V)
            length += 1
        raise AssertionError("unreachable: the loop returns at its last step")

    def _cache(self, model, rows: int, positions: int, device: torch.device) -> StaticCache:
        """The kept cache when it holds ``rows`` × ``positions``, else a new one that holds the kept
        one's too (calls of alternating sizes allocate once); emptied."""
        cache, num_layers = self.cache, len(DynamicCache(config=model.config).layers)
        capacity = -(-positions // CAPACITY_STEP) * CAPACITY_STEP
        batch = bucket_of(rows, 1 << 30)
        if cache is not None:
            capacity, batch = max(capacity, cache.capacity), max(batch, cache.batch)
        if (
            cache is None
            or cache.capacity < positions
            or cache.batch < rows
            or len(cache.layers) != num_layers
            or cache.allowed.device != device
        ):
            cache = self.cache = StaticCache(num_layers, capacity, batch, device)
            self.graphs.clear()
        cache.restart()
        return cache

    def _forward(self, model, bucket: int) -> torch.Tensor:
        """One decoding step over the first ``bucket`` rows of the cache's inputs: (bucket, V) float32."""
        cache = self.cache
        allowed = attention_mask_for(model, cache.allowed[:bucket])  # sdpa: as is; eager: additive
        logits = model(
            input_ids=cache.ids[:bucket],
            attention_mask=allowed,
            position_ids=cache.positions[:bucket],
            use_cache=True,
            logits_to_keep=1,
            **{cache_argument(model): cache},
        ).logits
        return logits[:, -1].float()

    def _step(self, model, bucket: int) -> torch.Tensor:
        """The step's logits (bucket, V) float32: replayed from the bucket's graph (captured when new)."""
        if not self.capture:
            return self._forward(model, bucket)
        if bucket not in self.graphs:
            device = self.cache.allowed.device
            self.graphs[bucket] = self._capture(model, bucket, device, autocast_dtype(device.type))
        graph, out = self.graphs[bucket]
        graph.replay()
        return out

    def _keep_graphs(self, model, device: torch.device) -> None:
        """Drop the graphs when what they read moved: the cache's buffers, the weights (replaced, not
        updated in place), or the autocast dtype."""
        key = (self.cache.buffers(), autocast_dtype(device.type), tuple(p.data_ptr() for p in model.parameters()))
        if key != self.key:
            self.graphs.clear()
            self.key = key

    def _capture(self, model, bucket: int, device: torch.device, dtype: torch.dtype | None):
        """A graph of :meth:`_forward` over ``bucket`` rows and its output tensor. The warm-up passes
        and the capture write the step's keys and values at ``write_at``: the values the replay writes."""
        casting = torch.autocast(device.type, dtype=dtype, cache_enabled=False) if dtype is not None else nullcontext()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), casting:
            for _ in range(2):  # lazy initialisations (cuBLAS handles, workspaces) stay out of the graph
                self._forward(model, bucket)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread (rollout.overlap's trainer) may use CUDA during the capture
        with torch.cuda.graph(graph, capture_error_mode="thread_local"), casting:
            out = self._forward(model, bucket)
        return graph, out
