"""One rendering rule for every command (issue 44, item 4): ``rm`` and ``dpo`` (and KTO) render text
prompts as ``train`` and ``sft`` do — the tokenizer's chat template under ``chat_template: auto``,
``system_prompt`` first — where before they fed them raw."""

from __future__ import annotations

import json

import pytest
import torch

from glassrl.config import load_config
from glassrl.data.formatting import as_chat, format_prompt
from glassrl.errors import GlassrlError
from glassrl.models import load_tokenizer
from glassrl.rl.config import TrainConfig
from glassrl.rl.prompts import build_prompts
from glassrl.supervised.preference import PreferenceObjective
from glassrl.supervised.preference_config import PreferenceConfig
from glassrl.supervised.rm import RMConfig, RMObjective
from glassrl.supervised.sft import SFTConfig, load_pairs, render_pairs, tokenize_pairs
from helpers import tiny_qwen2_dir

CPU = torch.device("cpu")
QUESTIONS = ["what is two plus two", "hello world 1+1=2"]
# a Qwen2 tokenizer with a pad token of its own (transformers adds <|endoftext|> as unk, beyond the embedding:
# issue 44, item 2) and the ChatML template QWEN_LIKE (tiny_qwen2_dir)
TOKENIZER = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("rendering")
    model = tiny_qwen2_dir(root / "qwen2", QUESTIONS * 10, TOKENIZER)
    pairs = root / "pairs.jsonl"
    rows = [{"prompt": q, "chosen": "two", "rejected": "one", "response": "two"} for q in QUESTIONS]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return model, str(pairs)


def _train_ids(files, tmp_path, system: str | None) -> list[list[int]]:
    """The ids glassrl train gives the same text prompts."""
    model, pairs = files
    overrides = ["data.eval_size=0", f"data.train={pairs}", f"model.actor={model}"]
    cfg = load_config(TrainConfig, None, overrides + ([f"data.system_prompt={system}"] if system else []))
    prompts = build_prompts(cfg, load_tokenizer(model), model)
    return prompts.ids(prompts.sources[0].records)


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_rm_dpo_kto_and_sft_render_text_prompts_as_train_does(files, tmp_path, system):
    model, pairs = files
    expected = _train_ids(files, tmp_path, system)
    tok = load_tokenizer(model)
    assert expected[0] == format_prompt(tok, as_chat(QUESTIONS[0], system)) != format_prompt(tok, QUESTIONS[0])
    common = dict(model=str(model), data=pairs, eval_data=pairs, max_length=256, system_prompt=system)
    rm = RMObjective.build(RMConfig(**common, output_dir=str(tmp_path / "rm")), CPU)
    assert [p for p, _, _, _ in rm.train] == expected == [p for p, _, _, _ in rm.evals]
    dpo = PreferenceObjective.build(PreferenceConfig(**common, output_dir=str(tmp_path / "dpo")), CPU)
    assert [p for _, (p, _, _, _) in dpo.train] == expected == [p for p, _, _, _ in dpo.evals]
    kto = PreferenceObjective.build(PreferenceConfig(**common, loss="kto", output_dir=str(tmp_path / "kto")), CPU)
    assert [e.prompt for _, e in kto.train] == [ids for ids in expected for _ in ("chosen", "rejected")]
    sft = SFTConfig(model=str(model), data=pairs, max_length=256, system_prompt=system)
    assert [p for p, _ in tokenize_pairs(tok, render_pairs(tok, sft, load_pairs(pairs), "data"), 256)] == expected


def test_none_keeps_text_prompts_plain_and_refuses_a_system_prompt(files, tmp_path):
    model, pairs = files
    tok = load_tokenizer(model)
    common = dict(model=str(model), data=pairs, eval_data=pairs, max_length=256, chat_template="none")
    rm = RMObjective.build(RMConfig(**common, output_dir=str(tmp_path / "rm")), CPU)
    assert rm.train[0][0] == format_prompt(tok, QUESTIONS[0])
    with pytest.raises(GlassrlError, match=r"^system_prompt: the text prompts of (data|eval_data) stay plain text"):
        PreferenceObjective.build(PreferenceConfig(**common, system_prompt="Hi", output_dir=str(tmp_path / "d")), CPU)
