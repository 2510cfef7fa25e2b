"""The embedded default model: its tokenizer, architecture, cache directory and build marker.

The build recipe is tested in tests/builtin/test_builtin_default_model.py.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from glassrl.data.tasks import TASKS, sft_pairs
from glassrl.models.default_model import (
    DEFAULT_SPEC,
    MARKER,
    default_model_dir,
    is_built,
    llama_config,
    spec_json,
)
from glassrl.models.default_tokenizer import SPECIAL_TOKENS, build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer([p + a for task in TASKS for p, a in sft_pairs(task, "train")])


def test_reference_example_tokenises_like_the_reference_documents(tokenizer):
    """dialogue-c, question 1: the response "是的，等于2！" is [是, 的, ，, 等于, 2, ！]."""
    ids = tokenizer("是的，等于2！", add_special_tokens=False)["input_ids"]
    assert [tokenizer.decode([i]) for i in ids] == ["是", "的", "，", "等于", "2", "！"]


def test_numbers_are_read_digit_by_digit(tokenizer):
    ids = tokenizer("Yes, it equals 146!", add_special_tokens=False)["input_ids"]
    assert [tokenizer.decode([i]) for i in ids] == ["Yes", ",", " it", " equals", " ", "1", "4", "6", "!"]


def test_special_tokens_and_round_trip(tokenizer):
    assert tokenizer.convert_ids_to_tokens(list(range(5))) == list(SPECIAL_TOKENS)
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert 280 < len(tokenizer) <= 512
    for prompt, answer in sft_pairs("arith-verify", "test")[:50]:
        for text in (prompt, answer):
            assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_llama_config_follows_the_spec_and_the_tokenizer(tokenizer):
    config = llama_config(DEFAULT_SPEC, tokenizer)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (128, 4, 4)
    assert config.vocab_size == len(tokenizer) and config.tie_word_embeddings
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (1, 2, 0)


def test_default_dir_follows_glassrl_home(monkeypatch, tmp_path):
    monkeypatch.setenv("GLASSRL_HOME", str(tmp_path))
    assert default_model_dir() == tmp_path / "models" / "default-v2"
    monkeypatch.delenv("GLASSRL_HOME")
    assert default_model_dir().parts[-4:] == (".cache", "glassrl", "models", "default-v2")


def test_is_built_needs_the_marker_with_the_same_seed_and_spec(tmp_path):
    assert not is_built(tmp_path, 0)  # no marker
    (tmp_path / MARKER).write_text("{not json")
    assert not is_built(tmp_path, 0)
    (tmp_path / MARKER).write_text(json.dumps({"seed": 0, "spec": spec_json(DEFAULT_SPEC)}))
    assert is_built(tmp_path, 0) and not is_built(tmp_path, 1)
    assert not is_built(tmp_path, 0, replace(DEFAULT_SPEC, sft_steps=1))
