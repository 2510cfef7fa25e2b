"""Where responses end (glassrl.rollout.stops): the stop set of a tokenizer and a model's
generation_config, the chat template's end-of-turn token, stop strings; a ChatML model whose EOS
is not <|im_end|> stops at <|im_end|> (issue 13: 8 of 8 responses ran to the length limit), with
the mask True on the stop and False after, on both sampling paths and in the agent's turns."""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers import GenerationConfig, LlamaForCausalLM

from glassrl.agents.loop import HFTurnSampler
from glassrl.data.formatting import format_prompt
from glassrl.rollout.base import SamplingParams
from glassrl.rollout.hf import HFRolloutEngine, decode, generate_with_hf, left_pad
from glassrl.rollout.stops import (
    STRING,
    TOKEN,
    StopSet,
    describe,
    end_of_turn_id,
    generation_eos_ids,
    stop_set,
)
from helpers import QWEN_LIKE, chatml_tokenizer, tiny_llama_config

TEXTS = ["Natalia sold clips to 48 of her friends.", "Weng earns $12 an hour for babysitting."] * 3
CHARS = lambda ids: "".join(chr(i) for i in ids)  # noqa: E731 - a tokenizer of one character per id
EOS = 1


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


# ------------------------------------------------------------------ the rule, by hand


@pytest.mark.parametrize(
    ("tokens", "stops", "expected"),
    [
        (ids("ab") + [EOS] + ids("zz"), StopSet((EOS,)), (3, TOKEN)),  # the stop token is kept
        (ids("ab") + [7] + ids("zz"), StopSet((EOS, 7)), (3, TOKEN)),  # any id of the set
        (ids("abc"), StopSet((EOS,)), (3, None)),  # no stop: all of it
        (ids("x</a>yy") + [EOS], StopSet((EOS,), ("</a>",)), (5, STRING)),  # through the string's last token
        (ids("ab") + [EOS] + ids("</a>"), StopSet((EOS,), ("</a>",)), (3, TOKEN)),  # the token first
        (ids("x</a"), StopSet((EOS,), ("</a>",)), (4, None)),  # not complete
        (ids("xyz"), StopSet((EOS,), ("q", "y")), (2, STRING)),  # the first of several strings
        ([EOS], StopSet((EOS,)), (1, TOKEN)),  # an immediate stop: a 1-token response
    ],
)
def test_end_hand_table(tokens, stops, expected):
    assert stops.end(tokens, CHARS) == expected


def test_a_stop_string_inside_one_token_and_across_tokens():
    vocab = {10: "x", 11: "</a", 12: ">!", 13: "tail", 14: "a</a>b"}
    text = lambda t: "".join(vocab[i] for i in t)  # noqa: E731
    stops = StopSet((EOS,), ("</a>",))
    assert stops.end([10, 11, 12, 13], text) == (3, STRING)  # completed by ">!"
    assert stops.end([10, 14, 13], text) == (2, STRING)  # inside one token
    window = stops.window
    assert window == len("</a>") + 1
    assert stops.completes_string([[10, 11, 12][-window:], [10, 11]], lambda rows: [text(r) for r in rows]) == [
        True,
        False,
    ]


def test_response_mask_hand_table():
    stops = StopSet((2,))
    rows = torch.tensor([[5, 6, 2, 0, 0], [5, 2, 2, 2, 2], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]])
    mask, stopped = stops.response_mask(rows, CHARS)
    assert mask.tolist() == [
        [True, True, True, False, False],  # the stop token trains; after it, padding
        [True, True, False, False, False],  # pad_id == EOS: only the first counts
        [True, True, True, True, True],  # no stop: ended by length
        [True, False, False, False, False],
    ]
    assert stopped.tolist() == [True, True, False, True]
    with_string = StopSet((2,), ("bc",))
    mask, stopped = with_string.response_mask(torch.tensor([ids("abcde"), ids("ab") + [2, 0, 0]]), CHARS)
    assert mask.tolist() == [[True, True, True, False, False], [True, True, True, False, False]]
    assert stopped.tolist() == [True, True]


def test_with_strings_keeps_the_ids_and_adds_each_string_once():
    stops = StopSet((1, 5), ("</a>",)).with_strings(("</call>", "</a>"))
    assert stops == StopSet((1, 5), ("</a>", "</call>"))


@pytest.mark.parametrize(("eos", "expected"), [(None, ()), (7, (7,)), ([7, 9], (7, 9))])
def test_generation_config_eos_is_an_int_or_a_list(eos, expected):
    assert generation_eos_ids(GenerationConfig(eos_token_id=eos)) == expected
    assert generation_eos_ids(None) == ()


# ------------------------------------------------------------------ the stop tokens of a tokenizer


@pytest.fixture(scope="module")
def chatml():
    return chatml_tokenizer(TEXTS)


def test_the_chatml_end_of_turn_token_is_detected(chatml):
    im_end = chatml.convert_tokens_to_ids("<|im_end|>")
    assert chatml.eos_token == "<|endoftext|>" and end_of_turn_id(chatml) == im_end
    stops = stop_set(chatml, GenerationConfig(eos_token_id=[chatml.eos_token_id, 40]), ["</answer>"])
    assert stops == StopSet(tuple(sorted({chatml.eos_token_id, im_end, 40})), ("</answer>",))
    assert describe(chatml, GenerationConfig(eos_token_id=chatml.eos_token_id), ["</answer>"]) == (
        "responses stop at: <|endoftext|> (tokenizer EOS; generation_config), "
        "<|im_end|> (chat template end of turn); stop strings: '</answer>'"
    )


def test_other_templates(chatml):
    from glassrl.models.default_tokenizer import build_tokenizer

    default = build_tokenizer(TEXTS)
    assert end_of_turn_id(default) == default.eos_token_id  # <|eos|> ends its assistant turns
    assert stop_set(default).ids == (default.eos_token_id,)  # the default model stops as it always did
    llama3 = chatml_tokenizer(TEXTS)
    llama3.add_special_tokens({"additional_special_tokens": ["<|eot_id|>"]})
    llama3.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|eot_id|>{% endfor %}"
    assert end_of_turn_id(llama3) == llama3.convert_tokens_to_ids("<|eot_id|>")
    plain = chatml_tokenizer(TEXTS)
    plain.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"  # no special token after
    assert end_of_turn_id(plain) is None
    refusing = chatml_tokenizer(TEXTS)
    refusing.chat_template = "{{ raise_exception('system message first') }}"
    assert end_of_turn_id(refusing) is None
    refusing.chat_template = None
    assert end_of_turn_id(refusing) is None and stop_set(refusing).ids == (refusing.eos_token_id,)
    assert QWEN_LIKE == chatml.chat_template


# ------------------------------------------------------------------ a ChatML model that writes <|im_end|>


class ScriptedLlama(LlamaForCausalLM):
    """A tiny Llama whose next token is scripted: after token t it writes ``script.get(t, first)``
    (that logit raised by 1e4), so sampled and greedy decoding write the same tokens."""

    def __init__(self, config, script: dict[int, int], first: int) -> None:
        super().__init__(config)
        self.script, self.first = script, first

    def forward(self, input_ids=None, **kwargs):
        out = super().forward(input_ids=input_ids, **kwargs)
        forced = [self.script.get(int(t), self.first) for t in input_ids[:, -1]]
        out.logits[torch.arange(len(forced)), -1, forced] += 1e4
        return out

    # The installed release's parameters (its cache is `cache` or `past_key_values`), as the decoding
    # loop reads them (glassrl.rollout.hf.cache_argument).
    forward.__signature__ = inspect.signature(LlamaForCausalLM.forward)


@pytest.fixture(scope="module")
def chat(chatml):
    """(model, tokenizer, (a, b, im_end, c)): the model answers a b <|im_end|> c a b <|im_end|> c …,
    a made-up next turn after each <|im_end|>; its generation_config's EOS is the tokenizer's."""
    a, b, c = chatml.encode(" clips sold hour", add_special_tokens=False)[:3]
    im_end = chatml.convert_tokens_to_ids("<|im_end|>")
    config = tiny_llama_config(len(chatml), eos_token_id=chatml.eos_token_id, bos_token_id=None)
    model = ScriptedLlama(config, {a: b, b: im_end, im_end: c, c: a}, first=a).eval()
    assert generation_eos_ids(model.generation_config) == (chatml.eos_token_id,)
    return model, chatml, (a, b, im_end, c)


def prompts(tokenizer) -> list[list[int]]:
    return [format_prompt(tokenizer, [{"role": "user", "content": q}]) for q in ("What is 3+4?", "Is 2+2=4?")]


SAMPLED, GREEDY = SamplingParams(max_new_tokens=12), SamplingParams(max_new_tokens=12, greedy=True)


def test_stopping_at_eos_alone_runs_through_im_end_to_the_length_limit(chat):
    """The issue's case: the tokenizer's EOS is not <|im_end|>."""
    model, tokenizer, (a, b, im_end, c) = chat
    engine = HFRolloutEngine(model, tokenizer, stops=StopSet((tokenizer.eos_token_id,)))
    batch = engine.generate(prompts(tokenizer), n=2, params=SAMPLED, generator=torch.Generator().manual_seed(0))
    assert batch.finish_reasons == ["length"] * 4
    assert batch.response_ids[0].tolist() == [a, b, im_end, c] * 3  # three <|im_end|>, three made-up turns


@pytest.mark.parametrize("sample", [decode, generate_with_hf], ids=["decode", "generate"])
@pytest.mark.parametrize("params", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
def test_a_chatml_response_ends_at_im_end_which_trains(chat, sample, params):
    model, tokenizer, (a, b, im_end, _) = chat
    engine = HFRolloutEngine(model, tokenizer, sampling_logprobs=True)  # the default stop set
    engine.sample = sample
    batch = engine.generate(prompts(tokenizer), n=2, params=params, generator=torch.Generator().manual_seed(0))
    assert batch.finish_reasons == ["stop"] * 4
    assert batch.response_ids.tolist() == [[a, b, im_end]] * 4
    assert batch.response_mask.tolist() == [[True, True, True]] * 4  # True on <|im_end|>
    assert batch.texts == [tokenizer.decode([a, b])] * 4  # the stop token is no text
    assert bool((batch.rollout_logprobs > -1e-3).all())  # its log-prob is kept: it trains


def test_the_mask_is_false_after_the_stop_in_a_batch_of_other_lengths(chat):
    """Rows that stop at different steps: the batch is as wide as the longest, padding after each stop."""
    model, tokenizer, (a, b, im_end, c) = chat
    engine = HFRolloutEngine(model, tokenizer)
    prompt = prompts(tokenizer)[0]
    batch = engine.generate([prompt, prompt + [a]], n=1, params=SAMPLED, generator=torch.Generator().manual_seed(0))
    pad = engine.pad_id
    assert batch.response_ids.tolist() == [[a, b, im_end], [b, im_end, pad]]
    assert batch.response_mask.tolist() == [[True, True, True], [True, True, False]]


@pytest.mark.parametrize("sample", [decode, generate_with_hf], ids=["decode", "generate"])
def test_a_generation_config_eos_list_is_honoured(chat, sample):
    model, tokenizer, (a, b, _, _) = chat
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, b]  # as Llama 3 Instruct lists two
    try:
        engine = HFRolloutEngine(model, tokenizer)
    finally:
        model.generation_config.eos_token_id = saved
    engine.sample = sample
    batch = engine.generate(prompts(tokenizer), n=1, params=SAMPLED, generator=torch.Generator().manual_seed(0))
    assert batch.response_ids.tolist() == [[a, b]] * 2 and batch.finish_reasons == ["stop"] * 2


@pytest.mark.parametrize("sample", [decode, generate_with_hf], ids=["decode", "generate"])
def test_stop_strings_end_at_the_token_that_completes_them(chat, sample):
    model, tokenizer, (a, b, _, _) = chat
    across = tokenizer.decode([a])[-2:] + tokenizer.decode([b])[:2]  # "ps s": the end of a, the start of b
    for strings, expected in (((across,), [a, b]), (("lip",), [a])):
        engine = HFRolloutEngine(model, tokenizer, stops=stop_set(tokenizer, model.generation_config, strings))
        engine.sample = sample
        batch = engine.generate(prompts(tokenizer), n=1, params=SAMPLED, generator=torch.Generator().manual_seed(0))
        assert batch.response_ids.tolist() == [expected] * 2 and batch.finish_reasons == ["stop"] * 2
        assert batch.response_mask.all() and all(strings[0] in t for t in batch.texts)  # the string stays in the text


def test_the_agents_turns_end_at_im_end_and_at_its_call_strings(chat):
    model, tokenizer, (a, b, im_end, _) = chat
    sampler = HFTurnSampler(model, tokenizer)
    contexts, params = prompts(tokenizer), SamplingParams(max_new_tokens=12)
    turns = sampler.sample(contexts, [12, 12], params, torch.Generator().manual_seed(0), (), False)
    assert [(t.tokens, t.ended) for t in turns] == [([a, b, im_end], "eos")] * 2
    across = tokenizer.decode([a])[-2:] + tokenizer.decode([b])[:2]
    turns = sampler.sample(contexts, [12, 12], params, torch.Generator().manual_seed(0), (across,), False)
    assert [(t.tokens, t.ended) for t in turns] == [([a, b], "stop")] * 2


# ------------------------------------------------------------------ both paths agree with stop strings


def test_decode_and_generate_stop_at_the_same_tokens(tiny_model_dir):
    """The tiny default model answers "是的，等于2！" or "Yes, it equals 4!": stop at the string "等于"
    or at "!" (an id), sampled, rows ending at different steps; same tokens and generator state after."""
    from glassrl.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_causal_lm(tiny_model_dir, device="cpu")
    bang = tokenizer.encode("!", add_special_tokens=False)
    assert len(bang) == 1
    stops = StopSet(tuple(sorted({tokenizer.eos_token_id, bang[0]})), ("等于",))
    prompt_ids = [format_prompt(tokenizer, p) for p in ("请问1+1=2？", "Is 12+34=47?", "请问30+5=35？")]
    ids_, mask = left_pad(prompt_ids, tokenizer.pad_token_id)
    ids_, mask = ids_.repeat_interleave(8, 0), mask.repeat_interleave(8, 0)
    ended = set()
    for seed in range(3):
        out = []
        for sample in (decode, generate_with_hf):
            g = torch.Generator().manual_seed(seed)
            tokens = sample(
                model,
                ids_,
                mask,
                SamplingParams(16),
                stops=stops,
                pad_id=tokenizer.pad_token_id,
                generator=g,
                decode_text=tokenizer.batch_decode,
            )
            out.append((tokens, g.get_state()))
        (fast, g_fast), (ref, g_ref) = out
        assert torch.equal(fast, ref) and torch.equal(g_fast, g_ref), seed
        ended |= {stops.end(row, tokenizer.decode)[1] for row in fast.tolist()}
    assert {TOKEN, STRING} <= ended
