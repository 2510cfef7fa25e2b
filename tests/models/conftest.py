"""Tiny checkpoints built in the test session, never downloaded.

A 2-layer Llama (hidden 32, vocabulary 100) saved with ``save_pretrained``; its
initializer_range is raised so that next-token distributions are far from
uniform (log-prob and entropy checks then have something to compare).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from helpers import tiny_llama_config

VOCAB = 100


@pytest.fixture(scope="session")
def tiny_lm_path(tmp_path_factory):
    """Directory of a saved tiny LlamaForCausalLM (the 'actor' checkpoint)."""
    path = tmp_path_factory.mktemp("tiny_lm")
    torch.manual_seed(0)
    config = tiny_llama_config(
        VOCAB,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        initializer_range=0.3,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer_path(tmp_path_factory):
    """Directory of a word-level tokenizer with an eos token and no pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    path = tmp_path_factory.mktemp("tiny_tok")
    fast.save_pretrained(path)
    return path


def _left_right_batch(prompts: list[list[int]], responses: list[list[int]], pad: int = 0):
    """Left-pad prompts to P, right-pad responses to T -> input_ids, attention_mask (B, P+T), P, T."""
    P = max(len(p) for p in prompts)
    T = max(len(r) for r in responses)
    ids, mask = [], []
    for p, r in zip(prompts, responses):
        ids.append([pad] * (P - len(p)) + p + r + [pad] * (T - len(r)))
        mask.append([0] * (P - len(p)) + [1] * (len(p) + len(r)) + [0] * (T - len(r)))
    return torch.tensor(ids), torch.tensor(mask), P, T


@pytest.fixture
def make_batch():
    """The batch layout every model module uses (COMMON brief): see ``_left_right_batch``."""
    return _left_right_batch
