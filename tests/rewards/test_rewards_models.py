"""Model-backed sources on tiny checkpoints built here: the reward model and the generative judge."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForTokenClassification, LlamaForCausalLM

from glassrl.data.collate import encode_response
from glassrl.data.formatting import format_prompt
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.models import load_scalar_model, load_tokenizer, sequence_scores
from glassrl.models.default_tokenizer import build_tokenizer
from glassrl.rewards import JudgeSource, RewardModelSource, RewardRequest
from helpers import tiny_llama_config

TEXTS = ["请问1+1=2？是的，等于2！", "Is 3+4=8? No, it equals 7!", "Rate the answer from 0 to 10. Score: 7"]


def tiny_config(vocab_size: int, **extra):
    return tiny_llama_config(
        vocab_size,
        hidden_size=16,
        intermediate_size=32,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        **extra,
    )


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(TEXTS * 5)


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("rm")
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_config(tiny_config(len(tokenizer), num_labels=1))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def judge_path(tmp_path_factory, tokenizer):
    """A judge that always answers "7": the residual stream is a constant (embeddings and
    attention output zeroed, the MLP's bias gives ones), and only the "7" row of lm_head
    is non-zero, so greedy decoding picks "7" at every step whatever the question."""
    path = tmp_path_factory.mktemp("judge")
    model = LlamaForCausalLM(tiny_config(len(tokenizer), mlp_bias=True))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.layers[0].mlp.down_proj.bias.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight[tokenizer.convert_tokens_to_ids("7")] = 1.0
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def req(prompt, response: str) -> RewardRequest:
    text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
    return RewardRequest(text, response, PromptRecord(prompt, "是的，等于2！", {}, "t#0"))


# ---------------------------------------------------------------- reward model


def test_reward_model_scores_match_one_at_a_time_reads(rm_path):
    source = RewardModelSource(str(rm_path), batch_size=2, device="cpu")
    batch = [req("请问1+1=2？", "是的，等于2！"), req("请问1+1=2？", "不是"), req("Is 3+4=8?", "No, it equals 7!")]
    results = source.score(batch)
    assert [r.status for r in results] == ["ok"] * 3
    # Reference: each sequence alone, unpadded, encoded as the reward-model trainer encodes its
    # pairs (glassrl.supervised.rm: format_prompt(x) ⊕ tokens(y) ⊕ EOS, the score read at EOS).
    tok, model = load_tokenizer(rm_path), load_scalar_model(rm_path, device="cpu")
    for request, result in zip(batch, results):
        ids = torch.tensor([format_prompt(tok, request.record.prompt) + encode_response(tok, request.response)])
        with torch.no_grad():
            expected = sequence_scores(model, ids, torch.ones_like(ids)).item()
        assert result.score == pytest.approx(expected, abs=1e-5)
    assert len({r.score for r in results}) == 3  # a random head still tells the texts apart


def test_reward_model_renders_chat_prompts_with_the_template(rm_path):
    source = RewardModelSource(str(rm_path), device="cpu")
    messages = ({"role": "user", "content": "请问1+1=2？"},)
    (result,) = source.score([req(messages, "是的，等于2！")])
    tok, model = source.tokenizer, source.model
    text = tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|bos|><|user|>") and text.endswith("<|assistant|>")
    ids = tok(text, add_special_tokens=False)["input_ids"] + encode_response(tok, "是的，等于2！")
    ids = torch.tensor([ids])
    with torch.no_grad():
        assert result.score == pytest.approx(sequence_scores(model, ids, torch.ones_like(ids)).item(), abs=1e-5)


def test_reward_model_too_long_is_an_error_not_a_truncation(rm_path):
    source = RewardModelSource(str(rm_path), max_length=8, device="cpu")
    short, long = source.score([req("1+1=", "2"), req("请问1+1=2？", "是的，等于2！是的，等于2！")])
    assert short.status == "ok"
    assert long.status == "error" and "longer than max_length=8" in long.message


def test_reward_model_bad_path(tmp_path):
    with pytest.raises(GlassrlError, match="no config.json"):
        RewardModelSource(str(tmp_path))


# ---------------------------------------------------------------- judge

QUESTION = "Question: {prompt}\nAnswer: {response}\nRate the answer from 0 to 100. Score:"


def test_judge_parses_the_models_answer(judge_path):
    source = JudgeSource(str(judge_path), QUESTION, max_score=100, max_new_tokens=2, device="cpu")
    results = source.score([req("1+1=", "2"), req("Is 3+4=8?", "No, it equals 7!")])
    assert [(r.status, r.score) for r in results] == [("ok", 0.77), ("ok", 0.77)]
    assert results[0].details == {"judge_text": "77", "judge_score": 77.0}


def test_judge_unparseable_or_out_of_range_answer_is_an_error_with_the_text(judge_path):
    strict = JudgeSource(str(judge_path), QUESTION, parse=r"Score: (\d+)", max_new_tokens=2, device="cpu")
    (unparsed,) = strict.score([req("q", "r")])
    assert unparsed.status == "error" and unparsed.score is None and "'77'" in unparsed.message
    assert unparsed.details["judge_text"] == "77"
    out_of_ten = JudgeSource(str(judge_path), QUESTION, max_score=10, max_new_tokens=2, device="cpu")
    (too_big,) = out_of_ten.score([req("q", "r")])
    assert too_big.status == "error" and "outside [0, 10]" in too_big.message


def test_judge_out_of_time_is_a_timeout(judge_path):
    # max_time is checked after each token: with a 1 ns budget the answer stops after one token of four.
    source = JudgeSource(str(judge_path), QUESTION, max_new_tokens=4, timeout_s=1e-9, device="cpu")
    (result,) = source.score([req("q", "r")])
    assert result.status == "timeout" and result.details["judge_text"] == "7"


@pytest.mark.parametrize(
    "template, parse, fragment",
    [
        ("Rate {response} for {user}", r"\d", r"\{user\}"),
        ("Rate {prompt}", r"\d", r"must contain \{response\}"),
        ("Rate {response}", r"(\d", "not a regular expression"),
    ],
)
def test_judge_misconfigured(judge_path, template, parse, fragment):
    with pytest.raises(GlassrlError, match=fragment):
        JudgeSource(str(judge_path), template, parse=parse, device="cpu")
