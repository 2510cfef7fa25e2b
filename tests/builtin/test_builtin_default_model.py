"""The default model's build recipe: deterministic build, SFT mix, evaluation, atomic cache.

The real default model takes minutes to build; these tests build a tiny one (``TINY``) with
the same code path.
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from transformers import AutoModelForCausalLM, AutoTokenizer

from glassrl.builtin import default_model, shipped
from glassrl.builtin.default_model import build_default_model, ensure_default_model
from glassrl.data.tasks import load_task
from glassrl.errors import GlassrlError
from glassrl.models.default_model import DEFAULT_SPEC, MARKER, DefaultModelSpec, default_model_dir, spec_json

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
def tiny_build(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_default")
    return path, build_default_model(path, seed=0, spec=TINY, console=QUIET)


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


@pytest.mark.slow
def test_same_seed_gives_bit_identical_weights(tiny_build, tmp_path):
    path, _ = tiny_build
    build_default_model(tmp_path / "again", seed=0, spec=TINY, console=QUIET)
    build_default_model(tmp_path / "other", seed=1, spec=TINY, console=QUIET)
    first = (path / "model.safetensors").read_bytes()
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == first
    assert (tmp_path / "other" / "model.safetensors").read_bytes() != first


def test_heldout_accuracy_scores_greedy_answers_with_the_tasks_evaluation(monkeypatch):
    """Hand-made answers: one exact, one right verdict with a wrong sum, one malformed, one unfinished."""
    records = load_task("arith-verify", "test", size=4)
    answers = [(records[0].answer, True), ("?", True), (records[2].answer, False), (records[3].answer, True)]
    monkeypatch.setattr(default_model, "greedy_answers", lambda *a, **k: answers)
    acc = default_model.heldout_accuracy(None, None, records)
    assert acc == {"n": 4, "exact": 0.5, "verdict": 0.75, "format": 0.5}


def test_ensure_builds_once_atomically(monkeypatch, tmp_path):
    monkeypatch.setenv("GLASSRL_HOME", str(tmp_path))
    monkeypatch.setattr(shipped, "SHIPPED", {})  # the build path (the shipped one: test_builtin_shipped.py)
    calls = []

    def stub(out_dir, *, seed, console):  # the real build is tested above; this tests the caching
        calls.append(seed)
        out_dir.mkdir()
        (out_dir / MARKER).write_text(json.dumps({"seed": seed, "spec": spec_json(DEFAULT_SPEC)}))

    monkeypatch.setattr(default_model, "build_default_model", stub)
    path = ensure_default_model(console=QUIET)
    assert path == default_model_dir() and (path / MARKER).is_file()
    assert ensure_default_model(console=QUIET) == path and calls == [0]  # cached
    ensure_default_model(seed=1, console=QUIET)  # another seed replaces it
    assert calls == [0, 1] and json.loads((path / MARKER).read_text())["seed"] == 1
    assert sorted(p.name for p in path.parent.iterdir()) == [
        ".default-v2.build-lock",
        "default-v2",
    ]  # no temporary left
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
    monkeypatch.setattr(shipped, "SHIPPED", {})  # the build path (the shipped one: test_builtin_shipped.py)
    with pytest.raises(RuntimeError):
        ensure_default_model(out_dir=tmp_path / "m", console=QUIET)
    assert [p.name for p in tmp_path.iterdir()] == [".m.build-lock"]  # the lock file only


def test_init_model_command_prints_path_and_accuracies(monkeypatch, tmp_path, capsys):
    from glassrl.cli import main

    def stub(out_dir, *, seed, console):  # the real build is tested above; this tests the command
        out_dir.mkdir()
        info = {
            "seed": seed,
            "spec": spec_json(DEFAULT_SPEC),
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
