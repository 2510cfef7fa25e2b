"""HFRolloutEngine: batch layout, EOS convention, finish reasons, seeded sampling, greedy decoding;
the preallocated-cache decoding loop against ``model.generate``, token for token."""

from __future__ import annotations

import pytest
import torch

from glassrl.rollout.base import RolloutBatch, SamplingParams, concat_rollouts
from glassrl.rollout.hf import (
    HFRolloutEngine,
    PreallocatedCache,
    cache_argument,
    decode,
    distinct_rows,
    generate_with_hf,
    generation_kwargs,
    left_pad,
    why_not_decode,
)

PROMPTS = ["请问1+1=2？", "Is 12+34=47?", "请问30+5=35？"]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from glassrl.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    return HFRolloutEngine(load_causal_lm(tiny_model_dir, device="cpu"), tokenizer)


def _ids(engine):
    from glassrl.data.formatting import format_prompt

    return [format_prompt(engine.tokenizer, p) for p in PROMPTS]


def test_left_pad():
    ids, mask = left_pad([[7, 8, 9], [4]], pad_id=0)
    assert ids.tolist() == [[7, 8, 9], [0, 0, 4]]
    assert mask.tolist() == [[True, True, True], [False, False, True]]


def test_layout_and_eos_convention(engine):
    n, params = 3, SamplingParams(max_new_tokens=16)
    batch = engine.generate(_ids(engine), n=n, params=params, generator=torch.Generator().manual_seed(0))
    B, T = batch.response_ids.shape
    assert B == len(PROMPTS) * n and T <= 16
    assert batch.group_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    prompts = _ids(engine)
    for b in range(B):
        prompt = prompts[b // n]
        row = batch.prompt_ids[b][batch.prompt_mask[b]].tolist()
        assert row == prompt and batch.prompt_mask[b, -len(prompt) :].all()  # left-padded
        mask = batch.response_mask[b]
        length = int(mask.sum())
        assert mask[:length].all() and not mask[length:].any()  # contiguous from token 0
        valid = batch.response_ids[b, :length].tolist()
        assert (batch.response_ids[b, length:] == engine.pad_id).all()
        if batch.finish_reasons[b] == "stop":
            assert valid[-1] in engine.stops.ids and not set(valid[:-1]) & set(engine.stops.ids)
        else:
            assert batch.finish_reasons[b] == "length" and length == 16 and not set(valid) & set(engine.stops.ids)
        assert batch.texts[b] == engine.tokenizer.decode(valid, skip_special_tokens=True)
    assert "stop" in batch.finish_reasons  # the tiny model learnt to end its answers
    assert batch.attention_mask.shape == (B, batch.prompt_ids.shape[1] + T)


def test_length_finish(engine):
    batch = engine.generate(
        _ids(engine), n=2, params=SamplingParams(max_new_tokens=3), generator=torch.Generator().manual_seed(0)
    )
    assert batch.finish_reasons == ["length"] * 6
    assert batch.response_mask.all() and batch.response_ids.shape[1] == 3


def test_sampling_is_reproducible_from_the_generator_and_leaves_the_global_rng(engine):
    params = SamplingParams(max_new_tokens=16)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    g1 = torch.Generator().manual_seed(7)
    a = engine.generate(_ids(engine), n=4, params=params, generator=g1)
    assert torch.equal(torch.get_rng_state(), before)  # global RNG untouched
    g2 = torch.Generator().manual_seed(7)
    b = engine.generate(_ids(engine), n=4, params=params, generator=g2)
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    assert torch.equal(g1.get_state(), g2.get_state())
    assert not torch.equal(g1.get_state(), torch.Generator().manual_seed(7).get_state())  # it advanced
    c = engine.generate(_ids(engine), n=4, params=params, generator=g1)  # continues the stream
    assert not torch.equal(a.response_ids, c.response_ids) or a.texts != c.texts


def test_greedy_is_argmax_decoding(engine):
    """Greedy with the KV cache equals a step-by-step argmax over full forward passes."""
    ids = _ids(engine)[1]
    batch = engine.generate(
        [ids], n=1, params=SamplingParams(max_new_tokens=16, greedy=True), generator=torch.Generator()
    )
    seq, out = list(ids), []
    with torch.no_grad():
        for _ in range(16):
            logits = engine.model(input_ids=torch.tensor([seq])).logits[0, -1]
            token = int(logits.argmax())
            out.append(token)
            seq.append(token)
            if token in engine.stops.ids:
                break
    assert batch.response_ids[0, : len(out)].tolist() == out
    # top-k = 1 sampling is greedy too
    top1 = engine.generate(
        [ids], n=2, params=SamplingParams(max_new_tokens=16, top_k=1), generator=torch.Generator().manual_seed(3)
    )
    assert top1.response_ids[0, : len(out)].tolist() == out == top1.response_ids[1, : len(out)].tolist()


def test_select_and_concat(engine):
    params = SamplingParams(max_new_tokens=16)
    a = engine.generate(_ids(engine)[:1], n=2, params=params, generator=torch.Generator().manual_seed(1))
    b = engine.generate(
        _ids(engine)[1:], n=1, params=SamplingParams(max_new_tokens=3), generator=torch.Generator().manual_seed(1)
    )
    both = concat_rollouts([a, b], engine.pad_id)
    assert isinstance(both, RolloutBatch) and len(both) == 4
    assert both.texts == a.texts + b.texts and both.finish_reasons == a.finish_reasons + b.finish_reasons
    for i, (src, row) in enumerate([(a, 0), (a, 1), (b, 0), (b, 1)]):
        assert (
            both.response_ids[i][both.response_mask[i]].tolist()
            == src.response_ids[row][src.response_mask[row]].tolist()
        )
        assert both.prompt_ids[i][both.prompt_mask[i]].tolist() == src.prompt_ids[row][src.prompt_mask[row]].tolist()
    picked = both.select(torch.tensor([3, 0]))
    assert picked.texts == [both.texts[3], both.texts[0]]
    assert torch.equal(picked.response_ids[1], both.response_ids[0])


# --------------------------------------------------------------- decode against model.generate

SAMPLINGS = {
    "sampled": SamplingParams(max_new_tokens=16),
    "greedy": SamplingParams(max_new_tokens=16, greedy=True),
    "top-k 5": SamplingParams(max_new_tokens=16, top_k=5),
    "top-p 0.9, T 1.5": SamplingParams(max_new_tokens=16, temperature=1.5, top_p=0.9),
}


def _both(engine, prompts, n, params, seed):
    """decode's and generate's tokens for the same prompts and generator state, and the generators after."""
    ids, mask = left_pad(prompts, engine.pad_id)
    ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
    out = []
    for sample in (decode, generate_with_hf):
        g = torch.Generator().manual_seed(seed)
        tokens = sample(engine.model, ids, mask, params, stops=engine.stops, pad_id=engine.pad_id, generator=g)
        out.append((tokens, g.get_state()))
    return out


@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_decode_gives_generates_tokens(engine, name):
    """Same tokens (pads after EOS included), same width, same generator state after: for
    padded prompts whose rows end at different steps, so ended rows leave the batch mid-way."""
    params = SAMPLINGS[name]
    for seed in range(3):
        (fast, g_fast), (ref, g_ref) = _both(engine, _ids(engine), 8, params, seed)
        assert fast.shape == ref.shape and torch.equal(fast, ref), (name, seed)
        assert torch.equal(g_fast, g_ref)
        lengths = engine.stops.response_mask(fast, engine.tokenizer.decode)[0].sum(-1)
        if not params.greedy:
            assert lengths.min() < lengths.max()  # rows ended at different steps: the batch shrank


def test_decode_without_padding_and_at_length(engine):
    """Prompts of one length (generate drops the all-ones mask) and a length cut at 3 tokens."""
    prompt = _ids(engine)[0]
    for params in (SamplingParams(max_new_tokens=16), SamplingParams(max_new_tokens=3)):
        (fast, g_fast), (ref, g_ref) = _both(engine, [prompt, prompt], 4, params, seed=5)
        assert torch.equal(fast, ref) and torch.equal(g_fast, g_ref)
    assert fast.shape[1] == 3


class _CacheNamed(torch.nn.Module):
    """A causal LM whose forward takes its KV cache under ``name``, as one transformers release or
    another writes it (``past_key_values`` before 5.24, ``cache`` since), passing it on to the real
    model under the name the installed release uses."""

    def __init__(self, model, name: str) -> None:
        super().__init__()
        self.model, self.config, self.name = model, model.config, name

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, use_cache=None, logits_to_keep=0, **cache
    ):
        (given,) = cache.values()
        assert list(cache) == [self.name]  # decode passed the cache under the name this forward declares
        kwargs = dict(attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache)
        return self.model(
            input_ids=input_ids, logits_to_keep=logits_to_keep, **kwargs, **{cache_argument(self.model): given}
        )


class _PastKeyValues(_CacheNamed):
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        use_cache=None,
        logits_to_keep=0,
    ):
        return super().forward(
            input_ids, attention_mask, position_ids, use_cache, logits_to_keep, past_key_values=past_key_values
        )


class _Cache(_CacheNamed):
    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None, logits_to_keep=0
    ):
        return super().forward(input_ids, attention_mask, position_ids, use_cache, logits_to_keep, cache=cache)


@pytest.mark.parametrize("wrapper, name", [(_PastKeyValues, "past_key_values"), (_Cache, "cache")])
def test_decode_takes_either_name_of_the_cache(engine, wrapper, name):
    """transformers 5.24 renamed forward's ``past_key_values`` to ``cache``; the decoding loop runs
    under both names (the locked release and the newest one may differ) with the same tokens."""
    named = wrapper(engine.model, name).eval()
    assert cache_argument(named) == name and why_not_decode(named) is None
    ids, mask = left_pad(_ids(engine), engine.pad_id)
    ids, mask = ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0)
    out = []
    for model in (engine.model, named):
        g = torch.Generator().manual_seed(3)
        params = SamplingParams(max_new_tokens=16)
        out.append(
            (decode(model, ids, mask, params, stops=engine.stops, pad_id=engine.pad_id, generator=g), g.get_state())
        )
    (plain, g_plain), (renamed, g_renamed) = out
    assert torch.equal(plain, renamed) and torch.equal(g_plain, g_renamed)


def test_why_not_decode_names_what_is_missing(engine):
    class NoPositions(torch.nn.Module):
        config = engine.model.config

        def forward(self, input_ids=None, past_key_values=None, logits_to_keep=0):
            raise AssertionError

    assert why_not_decode(NoPositions()) == "NoPositions.forward takes no position_ids"


def test_engine_uses_decode_and_falls_back_to_generate(engine):
    from transformers import MistralConfig, MistralForCausalLM

    assert why_not_decode(engine.model) is None and engine.sample is decode
    assert engine.path.startswith("glassrl's decoding loop")
    sliding = MistralForCausalLM(
        MistralConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            sliding_window=4,
        )
    )
    assert "sliding window" in why_not_decode(sliding)  # a sliding-window cache: model.generate's own
    fallback = HFRolloutEngine(sliding, engine.tokenizer)
    assert fallback.sample is generate_with_hf and "cannot run this model: its attention" in fallback.path


def test_preallocated_cache_hand_table():
    """Writes land after the filled positions; views show rows × filled; keep_rows compacts."""
    cache = PreallocatedCache(num_layers=1, capacity=4)
    k = torch.arange(3 * 2, dtype=torch.float32).view(3, 1, 2, 1)  # (B=3, H=1, 2 positions, D=1)
    keys, _ = cache.update(k, -k, 0)
    assert keys.tolist() == [[[[0.0], [1.0]]], [[[2.0], [3.0]]], [[[4.0], [5.0]]]]
    assert cache.get_seq_length() == 2
    cache.take_rows(torch.tensor([0, 2]))
    keys, values = cache.update(torch.tensor([10.0, 12.0]).view(2, 1, 1, 1), torch.zeros(2, 1, 1, 1), 0)
    assert keys.tolist() == [[[[0.0], [1.0], [10.0]]], [[[4.0], [5.0], [12.0]]]]
    assert values[:, 0, :2, 0].tolist() == [[-0.0, -1.0], [-4.0, -5.0]]
    assert cache.get_seq_length() == 3
    with pytest.raises(ValueError, match="capacity"):
        cache.update(torch.zeros(2, 1, 2, 1), torch.zeros(2, 1, 2, 1), 0)


def test_move_rows_fills_ended_slots_from_the_back():
    """Rows 0 and 2 of 5 ended: rows 3 and 4 move into their slots; rows 1 stays; 3 rows in use."""
    cache = PreallocatedCache(num_layers=1, capacity=3)
    cache.update(torch.arange(5.0).view(5, 1, 1, 1), -torch.arange(5.0).view(5, 1, 1, 1), 0)
    cache.move_rows(torch.tensor([0, 2]), torch.tensor([3, 4]), 3)
    keys, values = cache.update(torch.tensor([7.0, 8.0, 9.0]).view(3, 1, 1, 1), torch.zeros(3, 1, 1, 1), 0)
    assert keys[:, 0, :, 0].tolist() == [[3.0, 7.0], [1.0, 8.0], [4.0, 9.0]]
    assert values[:, 0, 0, 0].tolist() == [-3.0, -1.0, -4.0]


def test_prefill_rows_copied_to_samples():
    """A cache for 4 rows prefilled with 2 prompts; take_rows copies each to its samples."""
    cache = PreallocatedCache(num_layers=1, capacity=3, batch=4)
    cache.update(torch.tensor([1.0, 2.0]).view(2, 1, 1, 1), torch.zeros(2, 1, 1, 1), 0)
    cache.take_rows(torch.tensor([0, 0, 1, 1]))
    keys, _ = cache.update(torch.tensor([5.0, 6.0, 7.0, 8.0]).view(4, 1, 1, 1), torch.zeros(4, 1, 1, 1), 0)
    assert keys[:, 0, :, 0].tolist() == [[1.0, 5.0], [1.0, 6.0], [2.0, 7.0], [2.0, 8.0]]
    with pytest.raises(ValueError, match="rows"):
        cache.take_rows(torch.zeros(5, dtype=torch.long))


def test_distinct_rows_hand_table():
    ids = torch.tensor([[0, 7], [0, 7], [5, 6], [0, 7], [5, 6], [0, 7]])
    mask = torch.tensor([[0, 1], [0, 1], [1, 1], [0, 1], [1, 1], [1, 1]], dtype=torch.bool)
    first, inverse = distinct_rows(ids, mask)
    assert first.tolist() == [0, 2, 5]  # the last row: same ids, but its 0 is a real token
    assert inverse.tolist() == [0, 0, 1, 0, 1, 2]


def test_decode_gives_generates_tokens_under_bf16_autocast(engine):
    """model.compute_dtype = bfloat16 samples under autocast (glassrl.models.precision): still equal."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (fast, g_fast), (ref, g_ref) = _both(engine, _ids(engine), 4, SAMPLINGS["sampled"], seed=11)
    assert torch.equal(fast, ref) and torch.equal(g_fast, g_ref)


TRL_SAMPLINGS = {
    "repetition penalty 1.5": SamplingParams(max_new_tokens=16, repetition_penalty=1.5),
    "min-p 0.2, T 1.5": SamplingParams(max_new_tokens=16, temperature=1.5, min_p=0.2),
    "all four": SamplingParams(
        max_new_tokens=16, temperature=0.8, top_k=20, top_p=0.95, min_p=0.05, repetition_penalty=1.2
    ),
    "greedy, repetition penalty 2": SamplingParams(max_new_tokens=16, greedy=True, repetition_penalty=2.0),
}


@pytest.mark.parametrize("name", list(TRL_SAMPLINGS))
def test_decode_applies_repetition_penalty_and_min_p_as_generate(engine, name):
    """The loop's repetition penalty and min-p are transformers' processors in generate's order:
    the same tokens and generator state as generate (the reference), and not the tokens without them."""
    from glassrl.data.formatting import format_prompt

    params = TRL_SAMPLINGS[name]
    plain = SamplingParams(params.max_new_tokens, params.temperature, params.top_p, params.top_k, params.greedy)
    # the prompts hold the answer's tokens, which the penalty then pushes down
    prompts = [*_ids(engine), *(format_prompt(engine.tokenizer, "是的，等于2！不，等于5！" + p) for p in PROMPTS)]
    differs = False
    for seed in range(3):
        (fast, g_fast), (ref, g_ref) = _both(engine, prompts, 8, params, seed)
        assert fast.shape == ref.shape and torch.equal(fast, ref), (name, seed)
        assert torch.equal(g_fast, g_ref)
        (without, _), _ = _both(engine, prompts, 8, plain, seed)
        differs |= without.shape != fast.shape or not torch.equal(without, fast)
    assert differs, "the processor changed nothing: the test would not see it missing"


def test_generation_kwargs_carry_the_processors():
    kwargs = generation_kwargs(SamplingParams(8, min_p=0.1, repetition_penalty=1.3))
    assert kwargs["min_p"] == 0.1 and kwargs["repetition_penalty"] == 1.3 and kwargs["do_sample"]
    off = generation_kwargs(SamplingParams(8))
    assert off["min_p"] is None and off["repetition_penalty"] == 1.0


def test_the_config_checks_the_new_knobs():
    from glassrl.config import load_config
    from glassrl.errors import GlassrlError
    from glassrl.rl.config import TrainConfig

    cfg = load_config(TrainConfig, None, ["rollout.min_p=0.1", "rollout.repetition_penalty=1.1"])
    assert cfg.rollout.sampling(greedy=True) == SamplingParams(16, 1.0, 1.0, 0, True, 1.1, 0.1)
    with pytest.raises(GlassrlError, match=r"rollout.min_p = 1.0: must lie in \[0, 1\)"):
        load_config(TrainConfig, None, ["rollout.min_p=1.0"])
    with pytest.raises(GlassrlError, match=r"rollout.repetition_penalty = 0.0: must be > 0"):
        load_config(TrainConfig, None, ["rollout.repetition_penalty=0"])
