"""HFRolloutEngine: batch layout, EOS convention, finish reasons, seeded sampling, greedy decoding."""

from __future__ import annotations

import pytest
import torch

from glassrl.rollout.base import RolloutBatch, SamplingParams, concat_rollouts
from glassrl.rollout.hf import HFRolloutEngine, left_pad, response_mask_from_eos

PROMPTS = ["请问1+1=2？", "Is 12+34=47?", "请问30+5=35？"]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from glassrl.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    return HFRolloutEngine(load_causal_lm(tiny_model_dir, device="cpu"), tokenizer)


def _ids(engine):
    from glassrl.data.formatting import format_prompt

    return [format_prompt(engine.tokenizer, p) for p in PROMPTS]


def test_response_mask_from_eos_hand_table():
    eos = 2
    ids = torch.tensor([[5, 6, 2, 0, 0], [5, 2, 2, 2, 2], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]])
    mask, ended = response_mask_from_eos(ids, eos)
    assert mask.tolist() == [
        [True, True, True, False, False],  # EOS itself trains; after it, padding
        [True, True, False, False, False],  # pad_id == eos: only the first EOS counts
        [True, True, True, True, True],  # no EOS: stopped by length
        [True, False, False, False, False],  # an immediate EOS is a 1-token response
    ]
    assert ended.tolist() == [True, True, False, True]


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
            assert valid[-1] == engine.eos_id and engine.eos_id not in valid[:-1]
        else:
            assert batch.finish_reasons[b] == "length" and length == 16 and engine.eos_id not in valid
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
            if token == engine.eos_id:
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
