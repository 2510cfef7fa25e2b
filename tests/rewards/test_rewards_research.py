"""The research rubric with a criterion switched to a model judge: a stub causal LM that always
answers the same verdict, its verdict and reason kept per criterion and logged."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaForCausalLM

from glassrl.data.tasks import research
from glassrl.models.default_tokenizer import build_tokenizer
from glassrl.rewards import RewardRequest, build_reward_source
from glassrl.rewards.research import QUESTIONS, research_rubric
from helpers import tiny_llama_config


@pytest.fixture(scope="module")
def judge_path(tmp_path_factory):
    """A judge that answers "0" at every step, whatever the question (the residual stream is a
    constant: embeddings and attention zeroed, the MLP's bias gives ones; only the "0" row of the
    output layer is not zero)."""
    tokenizer = build_tokenizer(["Verdict: 0 or 1", research.report(research.DIALOGUE)] * 5)
    path = tmp_path_factory.mktemp("judge")
    model = LlamaForCausalLM(
        tiny_llama_config(
            len(tokenizer), hidden_size=16, intermediate_size=32, mlp_bias=True, tie_word_embeddings=False
        )
    )
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.layers[0].mlp.down_proj.bias.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight[tokenizer.convert_tokens_to_ids("0")] = 1.0
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_judged_criterion_takes_the_models_verdict_and_keeps_its_reason(judge_path, tmp_path):
    record = research.record(research.DIALOGUE, "dialogue")
    requests = [RewardRequest(record.prompt, record.answer, record)]  # the official report: 2.5 by the rules
    assert research_rubric().score(requests)[0].score == 2.5
    rubric = build_reward_source(
        "research_rubric",
        judge_model=str(judge_path),
        judged=["temporal"],
        judge_log="judgements.jsonl",
        judge_device="cpu",
        base_dir=str(tmp_path),
    )
    (result,) = rubric.score(requests)
    # the judge said 0 on temporal; accuracy and citation are still the rules' 1 and 1
    assert result.status == "ok" and result.score == 1.0 * 1 + 1.0 * 0 + 0.5 * 1
    assert result.details["criteria"] == {"accuracy": 1.0, "temporal": 0.0, "citation": 1.0}
    verdict = result.details["judges"]["temporal"]
    assert verdict["verdict"] == 0.0 and verdict["reason"].startswith("0")
    (logged,) = [json.loads(line) for line in (tmp_path / "judgements.jsonl").read_text(encoding="utf-8").splitlines()]
    assert logged == {
        "criterion": "temporal",
        "prompt": record.prompt,
        "report": record.answer,
        "status": "ok",
        "verdict": 0.0,
        "reason": verdict["reason"],
    }


def test_every_criterion_has_a_question_with_the_report_and_the_reference():
    assert set(QUESTIONS) == {name for name, _, _ in research.CRITERIA}
    for question in QUESTIONS.values():
        assert "{response}" in question and "{answer}" in question and question.endswith("Verdict:")
