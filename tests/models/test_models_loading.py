"""Loading the four roles from a tiny local checkpoint; dtype/device resolution; value-head save/load."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from glassrl.data.collate import encode_response
from glassrl.data.formatting import format_prompt
from glassrl.errors import GlassrlError
from glassrl.models import (
    CausalLMWithValueHead,
    load_causal_lm,
    load_scalar_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
    scalar_outputs,
)
from glassrl.models.loading import fit_special_tokens
from glassrl.models.value_head import VALUE_HEAD_MARKER, VALUE_HEAD_WEIGHTS
from helpers import QWEN_LIKE, tiny_qwen2_dir

IDS = torch.tensor([[5, 17, 42, 8, 99, 3], [7, 7, 61, 2, 30, 11]])
MASK = torch.ones_like(IDS)


def _assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _decoder(model) -> torch.nn.Module:
    """The decoder (embeddings, layers, final norm) of any of our model types."""
    if isinstance(model, CausalLMWithValueHead):
        model = model.backbone
    return model.get_decoder()


def _backbone_state(model) -> dict:
    return _decoder(model).state_dict()


def _head(model) -> torch.nn.Linear:
    return model.v_head if isinstance(model, CausalLMWithValueHead) else model.score


# --- dtype and device -------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "device", "expected"),
    [
        ("auto", "cpu", torch.float32),
        ("auto", "cuda", torch.bfloat16),
        ("auto", torch.device("cuda:0"), torch.bfloat16),
        ("float32", "cuda", torch.float32),
        ("bfloat16", "cpu", torch.bfloat16),
        ("float16", "cpu", torch.float16),
    ],
)
def test_resolve_dtype_table(name, device, expected):
    assert resolve_dtype(name, device) == expected


def test_resolve_dtype_unknown_lists_valid():
    with pytest.raises(GlassrlError, match=r"dtype: unknown 'fp8'; valid: auto, float32, bfloat16, float16"):
        resolve_dtype("fp8", "cpu")


def test_resolve_device():
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(GlassrlError, match="device: 'gpu0'"):
        resolve_device("gpu0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised when no CUDA device is visible")
def test_resolve_device_cuda_without_gpu():
    with pytest.raises(GlassrlError, match="no CUDA device"):
        resolve_device("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_loads_bfloat16_on_gpu(tiny_lm_path):
    model = load_causal_lm(tiny_lm_path)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert next(model.parameters()).device.type == "cuda"


# --- tokenizer ----------------------------------------------------------------


def test_load_tokenizer_pads_with_eos_and_says_so(tiny_tokenizer_path, caplog):
    """Issue 44: a tokenizer without a pad token (Llama's) padded with EOS without the line the README promises."""
    with caplog.at_level(logging.WARNING):
        tok = load_tokenizer(tiny_tokenizer_path)
    assert tok.pad_token == "</s>" == tok.eos_token
    assert tok("w5 w6")["input_ids"] == [5, 6]
    assert caplog.messages == [
        f"{tiny_tokenizer_path}: the tokenizer has no pad_token; padding with eos_token '</s>' (id 2), "
        "masked out of every number"
    ]


def test_load_tokenizer_missing_path_names_it(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(GlassrlError, match="no-such-model"):
        load_tokenizer(missing)


# --- actor and reference --------------------------------------------------------


def test_load_causal_lm_matches_saved_weights(tiny_lm_path):
    model = load_causal_lm(tiny_lm_path, dtype="auto", device="cpu")
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    direct = AutoModelForCausalLM.from_pretrained(tiny_lm_path)
    _assert_same_tensors(model.state_dict(), direct.state_dict())


def test_load_causal_lm_dtype(tiny_lm_path):
    model = load_causal_lm(tiny_lm_path, dtype="bfloat16", device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_load_causal_lm_missing_path_names_it(tmp_path):
    with pytest.raises(GlassrlError, match=r"missing-dir': no such directory$"):
        load_causal_lm(tmp_path / "missing-dir", device="cpu")
    (tmp_path / "empty-dir").mkdir()
    with pytest.raises(GlassrlError, match=r"empty-dir.*config\.json"):
        load_causal_lm(tmp_path / "empty-dir", device="cpu")


# --- critic and reward model ------------------------------------------------------


@pytest.mark.parametrize("head", ["token-classification", "value-head"])
def test_critic_from_actor_copies_backbone(tiny_lm_path, head):
    actor = load_causal_lm(tiny_lm_path, device="cpu")
    torch.manual_seed(1)
    critic = load_scalar_model(tiny_lm_path, head=head, device="cpu")
    _assert_same_tensors(_backbone_state(critic), actor.get_decoder().state_dict())
    assert _head(critic).weight.shape == (1, 32)
    assert not critic.training
    out = scalar_outputs(critic, IDS, MASK)
    assert out.shape == IDS.shape and out.dtype == torch.float32


@pytest.mark.parametrize("head", ["token-classification", "value-head"])
def test_fresh_head_follows_torch_seed(tiny_lm_path, head):
    heads = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        heads.append(_head(load_scalar_model(tiny_lm_path, head=head, device="cpu")).weight.detach().clone())
    assert torch.equal(heads[0], heads[1])
    assert not torch.equal(heads[0], heads[2])
    # HF's rule for a fresh Linear: normal(0, initializer_range = 0.3); 32 draws, so a loose bound.
    assert 0.1 < heads[0].std().item() < 0.6


def test_token_classification_head_has_no_dropout(tiny_lm_path):
    critic = load_scalar_model(tiny_lm_path, device="cpu").train()
    assert critic.dropout.p == 0.0
    torch.testing.assert_close(scalar_outputs(critic, IDS, MASK), scalar_outputs(critic, IDS, MASK), rtol=0, atol=0)


@pytest.mark.parametrize("head", ["token-classification", "value-head"])
def test_critic_from_reward_model_copies_backbone_and_head(tiny_lm_path, tmp_path, head):
    torch.manual_seed(5)
    rm = load_scalar_model(tiny_lm_path, head=head, device="cpu")
    with torch.no_grad():  # make the RM differ from any fresh initialisation
        _head(rm).weight.add_(1.0)
        _head(rm).bias.fill_(0.25)
        _decoder(rm).embed_tokens.weight.mul_(1.5)
    rm.save_pretrained(tmp_path / "rm")
    torch.manual_seed(6)
    critic = load_scalar_model(tmp_path / "rm", head=head, device="cpu")
    _assert_same_tensors(_backbone_state(critic), _backbone_state(rm))
    _assert_same_tensors(_head(critic).state_dict(), _head(rm).state_dict())
    assert torch.equal(scalar_outputs(critic, IDS, MASK), scalar_outputs(rm, IDS, MASK))


def test_value_head_round_trip(tiny_lm_path, tmp_path):
    torch.manual_seed(7)
    model = load_scalar_model(tiny_lm_path, head="value-head", device="cpu")
    model.save_pretrained(tmp_path / "vh")
    names = {p.name for p in (tmp_path / "vh").iterdir()}
    assert {"config.json", "model.safetensors", VALUE_HEAD_WEIGHTS, VALUE_HEAD_MARKER} <= names
    marker = json.loads((tmp_path / "vh" / VALUE_HEAD_MARKER).read_text())
    assert marker["head"] == "value-head" and marker["hidden_size"] == 32

    loaded = load_scalar_model(tmp_path / "vh", head="value-head", device="cpu")
    assert torch.equal(scalar_outputs(loaded, IDS, MASK), scalar_outputs(model, IDS, MASK))
    # The backbone directory is a plain HF causal-LM checkpoint.
    lm = load_causal_lm(tmp_path / "vh", device="cpu")
    _assert_same_tensors(lm.state_dict(), model.backbone.state_dict())


def test_head_mismatch_is_an_error(tiny_lm_path, tmp_path):
    load_scalar_model(tiny_lm_path, head="value-head", device="cpu").save_pretrained(tmp_path / "vh")
    with pytest.raises(GlassrlError, match="holds a 'value-head' scalar model"):
        load_scalar_model(tmp_path / "vh", head="token-classification", device="cpu")
    load_scalar_model(tiny_lm_path, device="cpu").save_pretrained(tmp_path / "tc")
    with pytest.raises(GlassrlError, match="holds a 'token-classification' scalar model"):
        load_scalar_model(tmp_path / "tc", head="value-head", device="cpu")


def test_unknown_head_lists_valid(tiny_lm_path):
    with pytest.raises(GlassrlError, match="head: unknown 'mlp'; valid: token-classification, value-head"):
        load_scalar_model(tiny_lm_path, head="mlp", device="cpu")


@pytest.mark.parametrize("head", ["token-classification", "value-head"])
def test_scalar_outputs_ignore_left_padding(tiny_lm_path, head):
    """Default position ids come from the mask: a left-padded row scores like the unpadded one."""
    torch.manual_seed(8)
    model = load_scalar_model(tiny_lm_path, head=head, device="cpu")
    row = torch.tensor([[5, 17, 42, 8]])
    padded = torch.tensor([[0, 0, 5, 17, 42, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        alone = scalar_outputs(model, row, torch.ones_like(row))
        batched = scalar_outputs(model, padded, mask)
    torch.testing.assert_close(batched[:, 2:], alone, rtol=1e-5, atol=1e-5)


# --- a tokenizer's special tokens against the model's embedding (issue 31, item 2) -----------

QWEN2_TEXTS = ["hello world 1+1=2 what is two plus two"] * 10


def test_a_pad_token_outside_the_embedding_pads_with_eos_and_says_so(tmp_path, caplog):
    # transformers gives Qwen2Tokenizer without a pad <|endoftext|>, id = its vocabulary size
    path = tiny_qwen2_dir(
        tmp_path / "qwen2", QWEN2_TEXTS, {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>"}
    )
    rows = load_causal_lm(path).get_input_embeddings().num_embeddings
    with caplog.at_level(logging.WARNING):
        tok = load_tokenizer(path)
    assert tok.pad_token == tok.eos_token == "<|im_end|>" and tok.pad_token_id < rows
    assert caplog.messages == [
        f"{path}: pad_token '<|endoftext|>' has id {rows}, but the model's embedding has {rows} rows; "
        f"padding with eos_token '<|im_end|>' (id {tok.eos_token_id}) instead"
    ]
    model = load_causal_lm(path)
    batch = tok(["hello", "what is two plus two"], return_tensors="pt", padding=True, padding_side="left")
    out = model.generate(**batch, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[0] == 2  # before: IndexError inside generate, the pad id outside the embedding


def test_an_eos_or_special_token_outside_the_embedding_is_one_line(tmp_path):
    eos_outside = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|endoftext|>"}
    path = tiny_qwen2_dir(tmp_path / "eos", QWEN2_TEXTS, eos_outside)
    with pytest.raises(GlassrlError, match=r"eos_token '<\|endoftext\|>' has id \d+, but the model's embedding"):
        load_tokenizer(path)
    extra = {
        "tokenizer_class": "Qwen2Tokenizer",
        **dict.fromkeys(("eos_token", "pad_token", "unk_token"), "<|im_end|>"),
    }
    # a special token the chat template writes reaches the model: refused (one no input reaches is not: below)
    template = {"chat_template": QWEN_LIKE + "<tool>", "additional_special_tokens": ["<tool>"]}
    path = tiny_qwen2_dir(tmp_path / "extra", QWEN2_TEXTS, {**extra, **template})
    with pytest.raises(
        GlassrlError, match=r"special token '<tool>' has id \d+, but the model's embedding has \d+ rows, and the chat "
    ):
        load_tokenizer(path)


def test_a_qwen2_tokenizer_with_a_pad_token_loads(tmp_path, caplog):
    """Issue 44, item 2: transformers 5.24 adds <|endoftext|> to a Qwen2 tokenizer as its unk token, id =
    the vocabulary size; with a pad token of its own the tokenizer was refused, without one it trained.
    No input reaches that token (data text is read as text, the template does not write it, byte-level
    BPE has no unknown token): it is left unused, with a line that says so."""
    config = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}
    path = tiny_qwen2_dir(tmp_path / "qwen2", QWEN2_TEXTS, config)
    rows = load_causal_lm(path).get_input_embeddings().num_embeddings
    with caplog.at_level(logging.WARNING):
        tok = load_tokenizer(path)
    assert tok.unk_token == "<|endoftext|>" and tok.unk_token_id == rows  # what transformers gave it
    assert tok.pad_token == "<|im_end|>" and tok.pad_token_id < rows  # its own pad, kept
    assert caplog.messages == [
        f"{path}: unk_token '<|endoftext|>' (id {rows}) lies beyond the model's {rows} embedding rows, but no "
        "input reaches it (data text is read as text, the chat template does not write it, the tokenizer's "
        "model never emits it): left unused"
    ]
    # what the model sees: the template's tokens and data text holding the token's text, all inside the embedding
    ids = format_prompt(tok, ({"role": "user", "content": "what is <|endoftext|> two"},))
    assert max(ids) < rows and max(encode_response(tok, "two <|endoftext|>")) < rows
    # and the same run as without a pad: a batch pads and generates
    model = load_causal_lm(path)
    batch = tok(["hello", "what is two plus two"], return_tensors="pt", padding=True, padding_side="left")
    assert model.generate(**batch, max_new_tokens=2, do_sample=False, pad_token_id=tok.pad_token_id).shape[0] == 2


def test_an_unknown_token_the_tokenizer_can_emit_is_refused(tmp_path):
    """The control: a tokenizer whose model emits its unk token for text it lacks: that id can reach the model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1, **{f"w{i}": i for i in range(2, 100)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>", pad_token="</s>")
    assert tok.unk_token_id == 100
    with pytest.raises(GlassrlError, match=r"special token '<unk>' has id 100, but .* and the tokenizer may emit it"):
        fit_special_tokens(tok, 100, "tok")
