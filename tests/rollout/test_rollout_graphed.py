"""The static-cache decoding loop (glassrl.rollout.graphed) without graph capture, on CPU, against the
preallocated-cache loop (glassrl.rollout.hf.decode): the same tokens and generator state, the same
log-probs up to float rounding (attention over the static capacity with its unwritten tail masked
sums the same terms in another order). The capture itself runs on CUDA: tests/gpu/test_gpu_graphed.py."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from glassrl.rollout import graphed
from glassrl.rollout.base import SamplingParams
from glassrl.rollout.graphed import GraphedDecoder, bucket_of, why_not_graphed
from glassrl.rollout.hf import decode, left_pad, sampler_for
from glassrl.rollout.stops import StopSet

PROMPTS = ["请问1+1=2？", "Is 12+34=47?", "请问30+5=35？"]
SAMPLINGS = {
    "sampled": SamplingParams(max_new_tokens=16),
    "greedy": SamplingParams(max_new_tokens=16, greedy=True),
    "top-k 5, T 0.7": SamplingParams(max_new_tokens=16, top_k=5, temperature=0.7),
    "top-p 0.9, T 1.5": SamplingParams(max_new_tokens=16, temperature=1.5, top_p=0.9),
}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from glassrl.data.formatting import format_prompt
    from glassrl.models import load_causal_lm, load_tokenizer
    from glassrl.models.loading import pad_id
    from glassrl.rollout.stops import stop_set

    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_causal_lm(tiny_model_dir, device="cpu").eval()
    prompts = [format_prompt(tokenizer, p) for p in PROMPTS]
    return model, prompts, stop_set(tokenizer, model.generation_config), pad_id(tokenizer)


@pytest.fixture(scope="module")
def qwen2():
    """A randomly initialised Qwen2 of a few layers (grouped-query attention, biased q/k/v, the
    architecture bench_gpu.py measures), sdpa attention; its prompts are random token ids."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (5, 9, 12)]
    return model, prompts, StopSet((2, 3, 4), ()), 0  # three common ids as stops: rows end at different steps


def _both(model, prompts, n, params, stops, pad, seed, decoder=None):
    """decode's and the static loop's tokens, log-probs and generator states for the same prompts."""
    ids, mask = left_pad(prompts, pad)
    ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
    out = []
    for sample in (decode, decoder or GraphedDecoder(capture=False)):
        g = torch.Generator().manual_seed(seed)
        logprobs = torch.zeros(len(ids), params.max_new_tokens)
        tokens = sample(model, ids, mask, params, stops=stops, pad_id=pad, generator=g, logprobs_out=logprobs)
        out.append((tokens, logprobs, g.get_state()))
    return out


@pytest.mark.parametrize("name", list(SAMPLINGS))
@pytest.mark.parametrize("which", ["tiny", "qwen2"])
def test_static_steps_give_decodes_tokens(request, which, name):
    """Padded prompts, n = 8 samples each (prefilled once, copied), rows ending at different steps
    (the batch shrinks through its buckets): decode's tokens, generator state, and log-probs to 1e-5."""
    model, prompts, stops, pad = request.getfixturevalue(which)
    params = SAMPLINGS[name]
    shrank = False
    for seed in range(2):
        (ref, ref_lp, g_ref), (out, out_lp, g_out) = _both(model, prompts, 8, params, stops, pad, seed)
        assert out.shape == ref.shape and torch.equal(out, ref), (which, name, seed)
        assert torch.equal(g_out, g_ref)
        torch.testing.assert_close(out_lp, ref_lp, rtol=0, atol=1e-5)
        stop = torch.isin(ref, torch.tensor(stops.ids))  # (B, T)
        lengths = torch.where(stop.any(-1), stop.long().argmax(-1) + 1, ref.shape[1])  # (B,)
        shrank |= bool(lengths.min() < lengths.max())
    assert shrank or params.greedy  # rows ended at different steps: the batch shrank through its buckets


def test_one_decoder_serves_calls_of_other_widths_and_sizes(qwen2, monkeypatch):
    """The cache and its buckets are kept between calls: a smaller call reuses them, a larger one
    (more rows, more positions) allocates one that holds both; each gives decode's tokens."""
    monkeypatch.setattr(graphed, "CAPACITY_STEP", 32)  # positions in steps of 32: a call of 12 + 24 outgrows one
    model, prompts, stops, pad = qwen2
    decoder = GraphedDecoder(capture=False)
    for chosen, n, new, rows, capacity in (
        (prompts, 4, 16, 16, 32),  # 3 × 4 rows, 12 + 16 positions
        (prompts[:1], 2, 8, 16, 32),  # smaller: kept
        (prompts, 8, 8, 32, 32),  # 24 rows: a larger cache
        (prompts[1:], 2, 24, 32, 64),  # 12 + 24 positions: larger, the rows kept
    ):
        params = SamplingParams(max_new_tokens=new)
        (ref, ref_lp, _), (out, out_lp, _) = _both(model, chosen, n, params, stops, pad, 7, decoder)
        assert torch.equal(out, ref)
        torch.testing.assert_close(out_lp, ref_lp, rtol=0, atol=1e-5)
        assert (decoder.cache.batch, decoder.cache.capacity) == (rows, capacity)


def test_no_padding_and_length_cut(qwen2):
    """Prompts of one length (decode passes no mask; the static loop masks the unwritten tail) and a
    cut at 1 and 3 tokens."""
    model, prompts, stops, pad = qwen2
    for new in (1, 3, 16):
        params = SamplingParams(max_new_tokens=new)
        (ref, ref_lp, _), (out, out_lp, _) = _both(model, [prompts[2]] * 2, 4, params, stops, pad, 5)
        assert torch.equal(out, ref) and out.shape[1] <= new
        torch.testing.assert_close(out_lp, ref_lp, rtol=0, atol=1e-5)


def test_buckets():
    assert [bucket_of(n, 128) for n in (1, 2, 3, 5, 8, 9, 64, 65, 128)] == [1, 2, 4, 8, 8, 16, 64, 128, 128]
    assert bucket_of(100, 96) == 96


def test_graphs_are_refused_on_cpu_and_the_cpu_path_is_unchanged(tiny):
    """On CPU the engine samples with decode (CUDA graphs need a CUDA device; why_not_graphed says so)."""
    model = tiny[0]
    assert why_not_graphed(model) == "the model is on cpu, CUDA graphs need a CUDA device"
    sample, path = sampler_for(model)
    assert sample is decode and path.startswith("glassrl's decoding loop (preallocated KV cache")


class _Ops(TorchDispatchMode):
    """The ATen ops run inside the block, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


# Ops a CUDA graph cannot hold: a read of a value back to the host (.item(), bool(tensor), int(tensor)
# dispatch _local_scalar_dense), and outputs whose shape depends on the values.
NOT_CAPTURABLE = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_consecutive", "unique_dim"}


@pytest.mark.parametrize("which", ["tiny", "qwen2-sdpa", "qwen2-eager"])
def test_the_step_that_is_captured_reads_nothing_back(request, which, monkeypatch):
    """What a CUDA graph captures (GraphedDecoder._forward, one decoding step) run on CPU under a
    dispatch mode: no op reads a value back to the host or has a value-dependent shape, and the
    step writes the cache in place at the index tensor (index_copy_). The capture itself: tests/gpu."""
    model, prompts, stops, pad = request.getfixturevalue(which.removesuffix("-sdpa").removesuffix("-eager"))
    if which == "qwen2-eager":
        monkeypatch.setattr(model.config, "_attn_implementation", "eager")
    decoder = GraphedDecoder(capture=False)
    step, seen = decoder._forward, set()

    def recorded(model, bucket):
        with _Ops() as ops:
            out = step(model, bucket)
        seen.update(ops.seen)
        return out

    decoder._forward = recorded
    ids, mask = left_pad(prompts, pad)
    g = torch.Generator().manual_seed(0)
    decoder(model, ids, mask, SamplingParams(max_new_tokens=6), stops=StopSet((), ()), pad_id=pad, generator=g)
    assert "index_copy_" in seen and seen & {"mm", "addmm", "bmm"}
    assert not seen & NOT_CAPTURABLE, seen & NOT_CAPTURABLE
    with _Ops() as control:  # the mode sees a read back where there is one
        bool(torch.ones(1).sum() > 0)
        torch.arange(4).nonzero()
    assert {"_local_scalar_dense", "nonzero"} <= control.seen


def test_the_weights_version_of_each_token(qwen2):
    """Asynchronous training's interface (the async branch's decode): ``versions.refresh()`` before
    every forward pass, and each token records the version of the pass that gave its distribution:
    with a counter, token t was sampled from the (t + 1)-th pass, version t; rows that ended keep
    their versions."""

    class Counter:
        calls = 0

        def refresh(self) -> int:
            self.calls += 1
            return self.calls - 1

    model, prompts, stops, pad = qwen2
    ids, mask = left_pad(prompts, pad)
    ids, mask = ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0)
    counter, out = Counter(), torch.full((len(ids), 12), -1)
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(max_new_tokens=12)
    tokens = GraphedDecoder(capture=False)(
        model, ids, mask, params, stops=stops, pad_id=pad, generator=g, versions=counter, versions_out=out
    )
    written = torch.isin(tokens, torch.tensor(stops.ids)).long().cumsum(-1)  # (B, T) stops so far
    valid = (written == 0) | ((written == 1) & torch.isin(tokens, torch.tensor(stops.ids)))  # up to the stop
    T = tokens.shape[1]
    assert counter.calls == T  # the prefill and the T - 1 steps after it
    assert torch.equal(out[:, :T][valid], torch.arange(T).expand(len(ids), T)[valid])
    assert (out[:, :T][~valid] == -1).all()
