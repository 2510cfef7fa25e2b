"""What a user reads is glassrl's own output: no Hugging Face progress bars ("Loading weights",
"Writing model shards"), no library FutureWarnings on a LoRA export or a DDP replica."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging

from glassrl.cli import main
from glassrl.models.loading import load_causal_lm
from glassrl.models.lora import LoraSettings, apply_lora
from glassrl.run.checkpoint import CheckpointManager, Part
from glassrl.workers.data_parallel import DataParallelModel, free_port, init_group
from helpers import HfPolicy

NOISE = ("Loading weights", "Writing model shards", "it/s]")


@pytest.fixture
def fresh_process_bars(monkeypatch):
    """Progress bars on, as a fresh process has them (the variable restored afterwards)."""
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS")
    hf_logging.enable_progress_bar()
    yield
    hf_logging.disable_progress_bar()


def test_sft_and_a_lora_export_print_only_glassrl_lines(tiny_model_dir, tmp_path, capfd, fresh_process_bars):
    argv = ["sft", f"model={tiny_model_dir}", "steps=1", "batch_size=4", "eval_data=task:add/test"]
    assert main([*argv, f"output_dir={tmp_path / 'sft'}", "device=cpu"]) == 0
    out, err = capfd.readouterr()
    assert "model written to" in out
    assert not [n for n in NOISE if n in out + err], err[-500:]

    actor = apply_lora(load_causal_lm(tiny_model_dir, dtype="float32", device="cpu"), LoraSettings(r=4), tiny_model_dir)
    run = tmp_path / "run"
    policy = HfPolicy(actor, AutoTokenizer.from_pretrained(tiny_model_dir))
    CheckpointManager(run / "checkpoints", keep=1).save(1, {"actor": Part("hf", policy)})
    capfd.readouterr()
    hf_logging.enable_progress_bar()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["export", str(run), "--out", str(tmp_path / "merged")]) == 0
    out, err = capfd.readouterr()
    assert not [n for n in NOISE if n in out + err], err[-500:]
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]


def test_a_ddp_replica_is_built_without_warnings(tiny_model_dir):
    ctx = init_group("actor", 0, 1, "127.0.0.1", free_port())
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            DataParallelModel(load_causal_lm(tiny_model_dir, dtype="float32", device="cpu"), ctx)
        assert not [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, UserWarning))]
    finally:
        dist.destroy_process_group()
    assert torch.distributed.is_initialized() is False
