"""CUDA-graph decoding (glassrl.rollout.graphed) on a GPU: what tests/rollout/test_rollout_graphed.py
checks on CPU without capture, with each decoding step replayed from a CUDA graph.

Skipped where no CUDA device is visible (here, and in CI): ``pytest -m gpu tests/gpu``
(benchmarks/gpu_session.sh runs it). float32 unless a test says bf16 (TF32 off, PyTorch's default).

- the graphed loop gives the preallocated-cache loop's tokens, generator state and log-probs;
- under bf16 autocast, replaying the graphs gives what running the same static steps eagerly gives;
- an in-place weight update is seen by the next replay; replaced weights are captured anew;
- the rollout engine on CUDA samples with the graphs and its start-up line says so.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = "cuda"


def _batch(engine, n: int = 8):
    from glassrl.data.formatting import format_prompt
    from glassrl.rollout.hf import left_pad

    prompts = [
        format_prompt(engine.tokenizer, p) for p in ["请问1+1=2？", "Is 12+34=47?", "请问30+5=35？", "Is 7+8=15?"]
    ]
    ids, mask = left_pad(prompts, engine.pad_id)
    return ids.repeat_interleave(n, 0).to(CUDA), mask.repeat_interleave(n, 0).to(CUDA)


def _sample(sample, engine, ids, mask, params, seed: int = 3):
    g = torch.Generator(CUDA).manual_seed(seed)
    logprobs = torch.zeros(len(ids), params.max_new_tokens, device=CUDA)
    tokens = sample(
        engine.model, ids, mask, params, stops=engine.stops, pad_id=engine.pad_id, generator=g, logprobs_out=logprobs
    )
    return tokens, logprobs, g.get_state()


@pytest.mark.parametrize("greedy", [True, False])
def test_graphed_steps_give_decodes_tokens_on_cuda(engine, greedy):
    """GraphedDecoder (captured) against glassrl.rollout.hf.decode, same CUDA generator: the same
    tokens and generator state after, log-probs to 1e-4 (attention over the static capacity sums in
    another order); two calls, so the second replays graphs captured by the first."""
    from glassrl.rollout.base import SamplingParams
    from glassrl.rollout.graphed import GraphedDecoder
    from glassrl.rollout.hf import decode

    params = SamplingParams(max_new_tokens=24, greedy=greedy)
    ids, mask = _batch(engine)
    graphed = GraphedDecoder()
    for seed in (3, 4):
        ref, ref_lp, g_ref = _sample(decode, engine, ids, mask, params, seed)
        out, out_lp, g_out = _sample(graphed, engine, ids, mask, params, seed)
        assert out.shape == ref.shape and torch.equal(out, ref)
        assert torch.equal(g_out, g_ref)
        torch.testing.assert_close(out_lp, ref_lp, rtol=0, atol=1e-4)
    assert graphed.graphs  # captured, and kept between calls


def test_replayed_graphs_equal_eager_static_steps_under_bf16(engine):
    """bf16 autocast (autocast's weight cache off during capture): the replayed graphs give the tokens
    and log-probs of the same static steps run eagerly (capture=False), to 1e-3."""
    from glassrl.models.precision import compute_precision
    from glassrl.rollout.base import SamplingParams
    from glassrl.rollout.graphed import GraphedDecoder

    params = SamplingParams(max_new_tokens=24)
    ids, mask = _batch(engine)
    with compute_precision(CUDA, torch.bfloat16):
        eager, eager_lp, _ = _sample(GraphedDecoder(capture=False), engine, ids, mask, params)
        graphed = GraphedDecoder()
        for _ in range(2):
            out, out_lp, _ = _sample(graphed, engine, ids, mask, params)
            assert torch.equal(out, eager)
            torch.testing.assert_close(out_lp, eager_lp, rtol=0, atol=1e-3)
    assert graphed.cache.layers[0].key_buffer.dtype == torch.bfloat16


def test_graphs_follow_the_weights(tiny_model_dir):
    """An optimiser-style in-place update is read by the next replay (no capture); weights replaced
    by new tensors are noticed and the graphs captured anew. Each time: decode's tokens."""
    from glassrl.models import load_causal_lm, load_tokenizer
    from glassrl.rollout.base import SamplingParams
    from glassrl.rollout.graphed import GraphedDecoder
    from glassrl.rollout.hf import HFRolloutEngine, decode

    engine = HFRolloutEngine(
        load_causal_lm(tiny_model_dir, dtype="float32", device=CUDA), load_tokenizer(tiny_model_dir)
    )
    params = SamplingParams(max_new_tokens=16)
    ids, mask = _batch(engine, n=4)
    graphed = GraphedDecoder()
    _sample(graphed, engine, ids, mask, params)
    first = dict(graphed.graphs)
    with torch.no_grad():
        for p in engine.model.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)  # in place: the same addresses
    ref, _, _ = _sample(decode, engine, ids, mask, params)
    out, _, _ = _sample(graphed, engine, ids, mask, params)
    assert torch.equal(out, ref)
    assert all(graphed.graphs.get(b) is g for b, g in first.items())  # replayed, not captured anew
    state = {k: v.clone() * 0.9 for k, v in engine.model.state_dict().items()}
    engine.model.load_state_dict(state, assign=True)  # new tensors, new addresses
    ref, _, _ = _sample(decode, engine, ids, mask, params)
    out, _, _ = _sample(graphed, engine, ids, mask, params)
    assert torch.equal(out, ref)
    assert not any(graphed.graphs.get(b) is g for b, g in first.items())


def test_the_engine_on_cuda_samples_with_graphs(engine):
    """The start-up line names the graphed loop; a model on CUDA that the graphs cannot run (its
    attention takes no 4D mask tensor) keeps the decoding loop and the line says why."""
    from glassrl.rollout.graphed import GraphedDecoder
    from glassrl.rollout.hf import sampler_for

    assert isinstance(engine.sample, GraphedDecoder)
    assert engine.path.startswith("glassrl's decoding loop, each step a CUDA graph")
    config = engine.model.config
    kept = config._attn_implementation
    try:
        config._attn_implementation = "flex_attention"
        sample, path = sampler_for(engine.model)
    finally:
        config._attn_implementation = kept
    assert not isinstance(sample, GraphedDecoder)
    assert "; no CUDA graphs: its attention (flex_attention) takes no 4D mask tensor" in path


@pytest.mark.parametrize("extra", [[], ["rollout.overlap=true"]], ids=["sync", "overlap"])
def test_grpo_on_cuda_samples_with_graphs(tiny_model_dir, prompt_files, tmp_path, extra):
    """A 4-step GRPO run on CUDA under bf16 autocast samples with the graphed loop (captured on the
    first step, replayed after, the weights updated in place between): every logged number finite.
    With rollout.overlap the copy's engine captures and replays in the sampling thread while the
    main thread trains."""
    import math

    from glassrl.rollout.graphed import GraphedDecoder
    from helpers import preset_trainer, tiny_run_overrides
    from run_helpers import logged_metrics

    overrides = [
        *tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path),
        "model.device=cuda",
        "model.compute_dtype=bfloat16",
        "steps=4",
        "logging.report=false",
        *extra,
    ]
    trainer = preset_trainer("grpo", overrides)
    trainer.train()
    engines = (
        [trainer.workers.rollout.engine]
        if not extra
        else [trainer.workers.rollout.live.engine, trainer.workers.rollout.engine]
    )
    for engine in engines:
        assert isinstance(engine.sample, GraphedDecoder)
    assert any(engine.sample.graphs for engine in engines)
    rows = logged_metrics(tmp_path)
    assert [row["step"] for row in rows if "reward/mean" in row][-1] == 4
    for row in rows:
        bad = {k: v for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, bad
