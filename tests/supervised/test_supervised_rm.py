"""Reward-model trainer on a tiny Llama built in the test session (nothing downloaded)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import glassrl.supervised.rm as rm
from glassrl.cli import main as cli_main
from glassrl.data.preferences import preference_pairs
from glassrl.errors import GlassrlError
from glassrl.models import load_scalar_model, load_tokenizer
from glassrl.optim import OptimConfig
from glassrl.supervised.rm import RMConfig, encode_pairs, evaluate, pairwise_accuracy, train_rm

CPU = torch.device("cpu")


def _write_pairs(path, pairs, margins=True):
    rows = [
        {"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} | ({"margin": p.margin} if margins else {})
        for p in pairs
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A 2-layer Llama (hidden 32) and a character-level tokenizer (BOS added to every text),
    saved together like a Hugging Face checkpoint."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors

    texts = [t for p in preference_pairs("train", size=200) for t in (p.prompt, p.chosen, p.rejected)]
    chars = sorted(set("".join(texts)) | set("0123456789"))
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<s>", "</s>", "<unk>", *chars])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    path = tmp_path_factory.mktemp("tiny_rm_base")
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm_pairs")
    train = _write_pairs(root / "train.jsonl", preference_pairs("train", size=8))
    test = _write_pairs(root / "test.jsonl", preference_pairs("test", size=12))
    bare = _write_pairs(root / "bare.jsonl", preference_pairs("train", size=4), margins=False)
    return {"train": str(train), "test": str(test), "bare": str(bare)}


def _cfg(tiny_model, pair_files, tmp_path, **kw) -> RMConfig:
    base = dict(
        model=str(tiny_model),
        data=pair_files["train"],
        eval_data=pair_files["test"],
        optim=OptimConfig(lr=3e-3, warmup_steps=2, decay="cosine"),
        steps=30,
        batch_size=8,
        max_length=40,
        log_every=1,
        output_dir=str(tmp_path / "rm"),
        device="cpu",
    )
    return RMConfig(**(base | kw))


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# --- tier 1: hand-made cases -------------------------------------------------------------


def test_pairwise_accuracy_by_hand():
    chosen = torch.tensor([1.0, 2.0, 3.0, 0.5])
    rejected = torch.tensor([0.0, 2.0, 4.0, -1.0])  # right, tie (wrong), wrong, right
    assert pairwise_accuracy(chosen, rejected) == 0.5


def _fake_scores(model, input_ids, attention_mask):
    """Score = number of real tokens: the longer response of a pair wins."""
    return attention_mask.sum(-1).float()  # (2B,)


@pytest.mark.parametrize("use_margin", [False, True])
def test_evaluate_by_hand(monkeypatch, use_margin):
    """Pairs whose (chosen, rejected) lengths differ by +2, 0, -1: accuracy 1/3, gap 1/3,
    loss the mean of −log σ(gap − m) with margins (1, 2, 1) when used."""
    monkeypatch.setattr(rm, "sequence_scores", _fake_scores)
    examples = [
        ([1, 5], [6, 7, 8, 2], [6, 2], 1.0),
        ([1, 5, 5], [6, 2], [7, 2], 2.0),
        ([1], [6, 2], [6, 7, 2], 1.0),
    ]
    got = evaluate(torch.nn.Identity(), examples, batch_size=2, pad_id=0, device=CPU, use_margin=use_margin)
    gaps, margins = [2.0, 0.0, -1.0], ([1.0, 2.0, 1.0] if use_margin else [0.0, 0.0, 0.0])
    loss = sum(math.log1p(math.exp(-(g - m))) for g, m in zip(gaps, margins)) / 3
    assert got["eval/accuracy"] == pytest.approx(1 / 3)
    assert got["eval/reward_gap"] == pytest.approx(1 / 3)
    assert got["eval/loss"] == pytest.approx(loss)
    # by hand: no margin (0.1269 + 0.6931 + 1.3133) / 3;
    # margin (log(1+e^-1) + 2 log(1+e^2)) / 3 = (0.3133 + 2 × 2.1269) / 3
    assert got["eval/loss"] == pytest.approx(1.5224 if use_margin else 0.7111, abs=1e-4)


# --- end to end on the tiny model --------------------------------------------------------


@pytest.mark.slow
def test_loss_falls_and_outputs_load_back(tiny_model, pair_files, tmp_path):
    cfg = _cfg(tiny_model, pair_files, tmp_path)
    result = train_rm(cfg)
    rows = _metrics(tmp_path / "rm")
    losses = [r["train/loss"] for r in rows]
    assert len(losses) == cfg.steps
    # a fresh head scores near 0, so the first loss is near log 2; memorising 8 pairs drives it down
    assert losses[0] == pytest.approx(math.log(2), abs=0.1)
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0]
    # most of the 8 train pairs ordered right (single-digit prompts differ by a token or two, so not all)
    assert rows[-1]["train/accuracy"] >= 0.75
    assert "eval/accuracy" in rows[-1] and 0.0 <= result["eval/accuracy"] <= 1.0

    out = tmp_path / "rm"
    info = json.loads((out / "glassrl.json").read_text())
    assert info["held_out_accuracy"] == result["eval/accuracy"] and info["held_out_pairs"] == 12
    # the checkpoint loads back with the models loader and scores the held-out pairs exactly as trained
    model = load_scalar_model(out, head=cfg.head, device="cpu")
    tokenizer = load_tokenizer(out)
    examples = encode_pairs(tokenizer, rm.load_preferences(pair_files["test"]), cfg.max_length)
    again = evaluate(model, examples, batch_size=5, pad_id=tokenizer.pad_token_id, device=CPU, use_margin=False)
    for key in ("eval/accuracy", "eval/loss", "eval/reward_gap"):
        assert again[key] == pytest.approx(result[key], abs=1e-5)


def test_value_head_and_margin(tiny_model, pair_files, tmp_path):
    """The other head trains and saves too; with margins the first loss is mean log(1 + e^m)."""
    cfg = _cfg(tiny_model, pair_files, tmp_path, head="value-head", use_margin=True, steps=3)
    train_rm(cfg)
    first = _metrics(tmp_path / "rm")[0]["train/loss"]
    margins = [p.margin for p in preference_pairs("train", size=8)]
    assert first == pytest.approx(sum(math.log1p(math.exp(m)) for m in margins) / 8, abs=0.1)
    assert (tmp_path / "rm" / "value_head.safetensors").is_file()
    load_scalar_model(tmp_path / "rm", head="value-head", device="cpu")


def test_config_errors(tiny_model, pair_files, tmp_path):
    with pytest.raises(GlassrlError, match="use_margin=true, but some pairs of data have no margin"):
        train_rm(_cfg(tiny_model, pair_files, tmp_path, data=pair_files["bare"], use_margin=True))
    with pytest.raises(GlassrlError, match="eval_data = None: needed when data is a file"):
        train_rm(_cfg(tiny_model, pair_files, tmp_path, eval_data=None))
    with pytest.raises(GlassrlError, match=r"train\.jsonl:1: prompt\+response is \d+ tokens, more than max_length=8"):
        train_rm(_cfg(tiny_model, pair_files, tmp_path, max_length=8))


def test_cli(tiny_model, pair_files, tmp_path, capsys):
    config = tmp_path / "rm.yaml"
    config.write_text(f"model: {tiny_model}\ndata: {pair_files['train']}\neval_data: {pair_files['test']}\n")
    code = cli_main(["rm", str(config), "steps=2", "batch_size=4", f"output_dir={tmp_path / 'cli'}", "device=cpu"])
    out = capsys.readouterr().out
    assert code == 0
    assert "held-out pairwise accuracy:" in out and "(12 pairs" in out and str(tmp_path / "cli") in out
    assert "glassrl rm: resolved" in out and "sequences per step" in out  # the table printed at start
    assert cli_main(["rm", str(config), "nope=1"]) == 2
    capsys.readouterr()
    assert cli_main(["rm", str(config), "batch_size=0"]) == 2  # checked before any model is loaded
    assert capsys.readouterr().err == "glassrl rm: error: batch_size = 0: must be >= 1\n"


def test_margin_error_names_the_pair_and_the_way_on(tiny_model, pair_files, tmp_path):
    """The preset rm sets use_margin (its bundled pairs have margins): on pairs without one the
    error names the first such pair and says what to set."""
    with pytest.raises(GlassrlError, match=r"no margin \(first: .*bare\.jsonl:1\); .* or set use_margin=false"):
        train_rm(_cfg(tiny_model, pair_files, tmp_path, data=pair_files["bare"], use_margin=True))


def test_cli_from_overrides_alone(tiny_model, pair_files, tmp_path, capsys):
    """No config file: RMConfig's defaults (use_margin false) and the key=value given."""
    out = tmp_path / "bare-cli"
    argv = ["rm", f"model={tiny_model}", f"data={pair_files['bare']}", f"eval_data={pair_files['test']}"]
    code = cli_main([*argv, "steps=2", "batch_size=4", "max_length=40", f"output_dir={out}", "device=cpu"])
    assert code == 0, capsys.readouterr().err
    assert "held-out pairwise accuracy:" in capsys.readouterr().out
    assert (out / "glassrl.json").is_file()


def test_a_fresh_head_is_said_in_our_line_not_transformers_missing_notice(tiny_model, pair_files, tmp_path, capfd):
    """Issue 44: rm printed transformers' LOAD REPORT ("score.weight | MISSING ... Consider training
    on your downstream task") for the head it is about to train."""
    from rich.console import Console

    rm.RMObjective.build(_cfg(tiny_model, pair_files, tmp_path), torch.device("cpu"), Console(width=400))
    out, err = capfd.readouterr()
    assert "MISSING" not in out + err and "LOAD REPORT" not in out + err
    assert "rm: a new scalar head (token-classification: Linear(hidden, 1))" in out and "seed 0" in out
    from transformers.utils import logging as hf_logging

    assert hf_logging.get_verbosity() == hf_logging.WARNING  # transformers' own warnings are back on
