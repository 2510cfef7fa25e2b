"""A model named by its Hugging Face hub id loads from the local cache, offline; an id the cache
lacks is one error line, and nothing is downloaded. The cache is one the test builds, in the
layout huggingface_hub writes: models--ORG--NAME/{blobs/<sha256>, snapshots/<commit>/<file> ->
../../blobs/<sha256>, refs/main}."""

from __future__ import annotations

import hashlib
import math
import os
import socket
from pathlib import Path

import pytest
import torch

from glassrl.errors import GlassrlError
from glassrl.models import load_causal_lm, load_tokenizer, resolve_model_path

REPO = "glassrl-test/tiny-chat"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, tiny_model_dir) -> Path:
    """HF_HUB_CACHE pointed at a new cache holding the tiny model as REPO; network connections fail."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    repo = cache / ("models--" + REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    for file in sorted(p for p in tiny_model_dir.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / file.relative_to(tiny_model_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))  # read once at import

    def refuse(*args, **kwargs):
        raise AssertionError(f"a network connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return cache


def _files(root: Path) -> list[Path]:
    return sorted(root.rglob("*"))


def test_a_hub_id_in_the_cache_resolves_to_its_snapshot(hub_cache, tiny_model_dir):
    snapshot = hub_cache / "models--glassrl-test--tiny-chat" / "snapshots" / COMMIT
    assert resolve_model_path(REPO) == snapshot
    assert resolve_model_path(tiny_model_dir) == tiny_model_dir  # a directory is itself
    # the loaders take the id: the same weights and tokenizer as the directory
    ids = torch.tensor([[3, 5, 7, 11]])
    by_id, by_dir = load_causal_lm(REPO, device="cpu"), load_causal_lm(tiny_model_dir, device="cpu")
    with torch.no_grad():
        assert torch.equal(by_id(ids).logits, by_dir(ids).logits)
    assert load_tokenizer(REPO)("1+1=2").input_ids == load_tokenizer(tiny_model_dir)("1+1=2").input_ids


def test_an_id_the_cache_lacks_is_one_line_and_downloads_nothing(hub_cache):
    before = _files(hub_cache)
    with pytest.raises(GlassrlError) as err:
        resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct", "model.actor")
    assert str(err.value) == (
        "model.actor = 'Qwen/Qwen2.5-0.5B-Instruct': neither a directory nor a model in the local Hugging Face "
        f"cache ({hub_cache}); glassrl downloads nothing at run time: fetch it once "
        "(`hf download Qwen/Qwen2.5-0.5B-Instruct`) or give a checkpoint directory"
    )
    with pytest.raises(GlassrlError, match=r"^'Qwen/Qwen2\.5-0\.5B-Instruct': neither a directory nor a model in"):
        load_causal_lm("Qwen/Qwen2.5-0.5B-Instruct")
    assert _files(hub_cache) == before


def test_a_path_that_is_no_hub_id_is_a_missing_directory(tmp_path):
    with pytest.raises(GlassrlError, match=r"^model\.actor = '.*/nowhere/a/b': no such directory$"):
        resolve_model_path(tmp_path / "nowhere" / "a" / "b", "model.actor")


@pytest.mark.slow
def test_train_takes_a_cached_hub_id(hub_cache, prompt_files, tmp_path):
    from helpers import preset_trainer, tiny_run_overrides

    overrides = [*tiny_run_overrides(Path("unused"), prompt_files, tmp_path / "run"), f"model.actor={REPO}", "steps=1"]
    trainer = preset_trainer("grpo", overrides)
    metrics = trainer.train()
    assert trainer.counters.step == 1 and math.isfinite(metrics["reward/mean"])
    assert (tmp_path / "run" / "checkpoints").is_dir()
