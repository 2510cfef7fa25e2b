"""The embedded default model: tokenizer, prompt format, deterministic build, atomic cache.

The real default model takes minutes to build; these tests build a tiny one (``TINY``) with
the same code path.
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from transformers import AutoModelForCausalLM, AutoTokenizer

from glassrl.data.tasks import TASKS, load_task, sft_pairs
from glassrl.errors import GlassrlError
from glassrl.models import default_model
from glassrl.models.default_model import (
    DEFAULT_SPEC,
    MARKER,
    DefaultModelSpec,
    build_default_model,
    default_model_dir,
    ensure_default_model,
    format_prompt,
)
from glassrl.models.default_tokenizer import SPECIAL_TOKENS, build_tokenizer

TINY = DefaultModelSpec(
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    intermediate_size=64,
    tasks=("arith-verify",),
    sft_steps=6,
    batch_size=32,
    lr=1e-2,
    warmup_steps=2,
)
QUIET = Console(file=io.StringIO())


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer([p + a for task in TASKS for p, a in sft_pairs(task, "train")])


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_default")
    return path, build_default_model(path, seed=0, spec=TINY, console=QUIET)


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


def test_format_prompt_plain_text_is_bos_then_text(tokenizer):
    text_ids = tokenizer("请问1+1=2？", add_special_tokens=False)["input_ids"]
    assert format_prompt(tokenizer, "请问1+1=2？") == [tokenizer.bos_token_id, *text_ids]


def test_format_prompt_messages_use_the_chat_template(tokenizer):
    text_ids = tokenizer("请问1+1=2？", add_special_tokens=False)["input_ids"]
    bos, user, assistant = (tokenizer.convert_tokens_to_ids(t) for t in ("<|bos|>", "<|user|>", "<|assistant|>"))
    messages = ({"role": "user", "content": "请问1+1=2？"},)
    assert format_prompt(tokenizer, messages) == [bos, user, *text_ids, assistant]


def test_format_prompt_messages_without_template_is_an_error(tokenizer):
    tokenizer = build_tokenizer(["1+1=2"])
    tokenizer.chat_template = None
    with pytest.raises(GlassrlError, match="no chat template"):
        format_prompt(tokenizer, [{"role": "user", "content": "hi"}])


def test_build_loads_back_with_from_pretrained(tiny_build):
    path, info = tiny_build
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert (path / "model.safetensors").is_file()
    assert model.config.model_type == "llama" and model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tokenizer) == info["vocab_size"]
    assert sum(p.numel() for p in model.parameters()) == info["parameters"]
    # The loaded model answers the held-out prompts exactly as the in-memory one did in the build.
    records = load_task("arith-verify", "test")
    assert default_model.heldout_accuracy(model, tokenizer, records) == info["heldout_arith_verify"]


def test_build_records_parameters_and_accuracies(tiny_build):
    path, info = tiny_build
    assert json.loads((path / MARKER).read_text(encoding="utf-8")) == info
    assert info["seed"] == 0 and info["sft_steps"] == TINY.sft_steps and info["spec"]["hidden_size"] == 32
    for acc in (info["heldout_arith_verify"], info["train_arith_verify"]):
        assert acc["n"] == 500 and all(0.0 <= acc[k] <= 1.0 for k in ("exact", "verdict", "format"))
        assert acc["exact"] <= min(acc["verdict"], acc["format"])
    assert info["train_loss"] > 0 and (path / "metrics.jsonl").is_file()


def test_sft_mix_answers_a_seeded_share_of_english_questions_in_chinese(tiny_build):
    """Only English arith-verify answers change, only their language: the verdict and sum stay."""
    path, _ = tiny_build
    records = load_task("arith-verify", "train")
    rows = default_model.sft_rows(DEFAULT_SPEC, seed=0)
    assert [r["prompt"] for r in rows] == [r.prompt for task in DEFAULT_SPEC.tasks for r in load_task(task, "train")]
    switched = english = 0
    for record, row in zip(records, rows):
        if record.metadata["lang"] == "zh":
            assert row["response"] == record.answer
            continue
        english += 1
        chinese = f"{'是的' if record.metadata['is_true'] else '不是'}，等于{record.metadata['sum']}！"
        assert row["response"] in (record.answer, chinese)
        switched += row["response"] == chinese
    assert abs(switched / english - DEFAULT_SPEC.english_answered_in_chinese) < 0.03  # ~4000 English rows
    assert rows == default_model.sft_rows(DEFAULT_SPEC, seed=0) != default_model.sft_rows(DEFAULT_SPEC, seed=1)
    # the build trains on exactly these rows, and leaves them readable next to the weights
    written = [json.loads(line) for line in (path / "sft_data.jsonl").read_text(encoding="utf-8").splitlines()]
    assert written == [{"prompt": r["prompt"], "response": r["response"]} for r in default_model.sft_rows(TINY, seed=0)]


def test_same_seed_gives_bit_identical_weights(tiny_build, tmp_path):
    path, _ = tiny_build
    build_default_model(tmp_path / "again", seed=0, spec=TINY, console=QUIET)
    build_default_model(tmp_path / "other", seed=1, spec=TINY, console=QUIET)
    first = (path / "model.safetensors").read_bytes()
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == first
    assert (tmp_path / "other" / "model.safetensors").read_bytes() != first


def test_heldout_accuracy_scores_exact_verdict_and_format(monkeypatch, tokenizer):
    """Hand-made answers: one exact, one right verdict with a wrong sum, one malformed, one unfinished."""
    from glassrl.data.records import PromptRecord

    meta = {"lang": "zh", "is_true": True}
    records = [PromptRecord("请问1+1=2？", "是的，等于2！", meta)] * 4
    answers = [("是的，等于2！", True), ("是的，等于3！", True), ("是的等于2", True), ("是的，等于2！", False)]
    monkeypatch.setattr(default_model, "greedy_answers", lambda *a, **k: answers)
    acc = default_model.heldout_accuracy(None, tokenizer, records)
    assert acc == {"n": 4, "exact": 0.25, "verdict": 1.0, "format": 0.5}


def test_default_dir_follows_glassrl_home(monkeypatch, tmp_path):
    monkeypatch.setenv("GLASSRL_HOME", str(tmp_path))
    assert default_model_dir() == tmp_path / "models" / "default-v2"
    monkeypatch.delenv("GLASSRL_HOME")
    assert default_model_dir().parts[-4:] == (".cache", "glassrl", "models", "default-v2")


def test_ensure_builds_once_atomically(monkeypatch, tmp_path):
    monkeypatch.setenv("GLASSRL_HOME", str(tmp_path))
    calls = []

    def stub(out_dir, *, seed, console):  # the real build is tested above; this tests the caching
        calls.append(seed)
        out_dir.mkdir()
        (out_dir / MARKER).write_text(json.dumps({"seed": seed, "spec": default_model._spec_json(DEFAULT_SPEC)}))

    monkeypatch.setattr(default_model, "build_default_model", stub)
    path = ensure_default_model(console=QUIET)
    assert path == default_model_dir() and (path / MARKER).is_file()
    assert ensure_default_model(console=QUIET) == path and calls == [0]  # cached
    ensure_default_model(seed=1, console=QUIET)  # another seed replaces it
    assert calls == [0, 1] and json.loads((path / MARKER).read_text())["seed"] == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["default-v2"]  # no temporary left
    (path / MARKER).write_text(json.dumps({"seed": 1, "spec": {"hidden_size": 1}}))  # another spec: stale
    ensure_default_model(seed=1, console=QUIET)
    assert calls == [0, 1, 1]


def test_ensure_never_replaces_a_foreign_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(GlassrlError, match="not a glassrl default model"):
        ensure_default_model(out_dir=tmp_path, console=QUIET)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_failed_build_leaves_nothing(monkeypatch, tmp_path):
    def broken(out_dir, *, seed, console):
        out_dir.mkdir()
        (out_dir / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(default_model, "build_default_model", broken)
    with pytest.raises(RuntimeError):
        ensure_default_model(out_dir=tmp_path / "m", console=QUIET)
    assert list(tmp_path.iterdir()) == []


def test_init_model_command_prints_path_and_accuracies(monkeypatch, tmp_path, capsys):
    from glassrl.cli import main

    def stub(out_dir, *, seed, console):  # the real build is tested above; this tests the command
        out_dir.mkdir()
        info = {
            "seed": seed,
            "spec": default_model._spec_json(DEFAULT_SPEC),
            "parameters": 1234,
            "sft_steps": 5,
            "train_loss": 0.5,
            "build_time_s": 1.0,
            "heldout_arith_verify": {"n": 500, "exact": 0.25, "verdict": 0.5, "format": 1.0},
            "train_arith_verify": {"n": 500, "exact": 0.75, "verdict": 0.5, "format": 1.0},
        }
        (out_dir / MARKER).write_text(json.dumps(info))

    monkeypatch.setattr(default_model, "build_default_model", stub)
    assert main(["init-model", "--out", str(tmp_path / "m"), "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "m") in out and "seed 3" in out and "1,234 parameters" in out
    assert "test (500 prompts, greedy): exact 25.0%, verdict 50.0%, format 100.0%" in out
    assert "train (500 prompts, greedy): exact 75.0%" in out
