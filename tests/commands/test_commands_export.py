"""`glassrl export`: a run's LoRA policy merged into a model that from_pretrained loads."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from glassrl.cli import main
from glassrl.models.loading import load_causal_lm
from glassrl.models.lora import LoraSettings, apply_lora, merge
from glassrl.run.checkpoint import CheckpointManager, Part
from helpers import HfPolicy


@pytest.fixture
def lora_run(tiny_model_dir, tmp_path):
    """A run directory whose latest checkpoint holds a LoRA actor with non-zero adapters; and that actor."""
    actor = apply_lora(load_causal_lm(tiny_model_dir, dtype="float32", device="cpu"), LoraSettings(r=4), tiny_model_dir)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in actor.named_parameters():
            if "lora_B" in name:  # B = 0 at initialisation: merged would equal the base
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    run = tmp_path / "run"
    CheckpointManager(run / "checkpoints", keep=2).save(3, {"actor": Part("hf", HfPolicy(actor, tokenizer))})
    return run, actor


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_export_merges_adapters_into_a_loadable_model(lora_run, tiny_model_dir, tmp_path):
    run, actor = lora_run
    out = tmp_path / "exported"
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert not (out / "adapter_config.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.randint(3, loaded.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    merged = merge(copy.deepcopy(actor)).eval()
    torch.testing.assert_close(_logits(loaded, ids), _logits(merged, ids), rtol=0, atol=1e-5)
    base = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu")
    assert (_logits(loaded, ids) - _logits(base, ids)).abs().max() > 1e-2  # the adapters are in it
    assert (
        AutoTokenizer.from_pretrained(out)("是的").input_ids
        == AutoTokenizer.from_pretrained(tiny_model_dir)("是的").input_ids
    )


def test_export_of_a_checkpoint_directory(lora_run, tmp_path):
    run, _ = lora_run
    assert main(["export", str(run / "checkpoints" / "step_00000003"), "--out", str(tmp_path / "a")]) == 0
    assert (tmp_path / "a" / "config.json").is_file()


def test_export_errors_are_one_line(lora_run, tmp_path, capsys):
    run, _ = lora_run
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert main(["export", str(run), "--out", str(tmp_path / "full")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "b")]) == 2
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty_run" / "checkpoints").mkdir(parents=True)
    assert main(["export", str(tmp_path / "empty_run"), "--out", str(tmp_path / "c")]) == 2
    assert "has no checkpoint yet" in capsys.readouterr().err


def test_export_during_training_goes_to_the_new_checkpoint_and_writes_whole(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """`glassrl export` during training failed 2 times in 150, leaving a half-copied output that blocked a
    retry: the run saved a new checkpoint and pruned the one being copied. The export now restarts from the
    new latest checkpoint, and the output appears whole, equal to what that checkpoint's manifest records."""
    import hashlib
    import json
    import shutil

    import glassrl.models.lora as lora

    model = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu")
    policy = HfPolicy(model, AutoTokenizer.from_pretrained(tiny_model_dir))
    manager = CheckpointManager(tmp_path / "run" / "checkpoints", keep=1)
    manager.save(2, {"actor": Part("hf", policy)})
    real, calls = shutil.copytree, []

    def copy_while_the_run_prunes(src, dst, **kwargs):
        calls.append(src)
        if len(calls) == 1:  # half a copy, then the run saves step 3 and prunes step 2 under it
            shutil.copy2(next(p for p in sorted(src.iterdir()) if p.is_file()), dst)
            manager.save(3, {"actor": Part("hf", policy)})
            raise FileNotFoundError(2, "No such file or directory", str(src / "model.safetensors"))
        return real(src, dst, **kwargs)

    monkeypatch.setattr(lora.shutil, "copytree", copy_while_the_run_prunes)
    out = tmp_path / "exported"
    assert main(["export", str(tmp_path / "run"), "--out", str(out)]) == 0
    assert [p.parent.name for p in calls] == ["step_00000002", "step_00000003"]
    manifest = json.loads((tmp_path / "run" / "checkpoints" / "step_00000003" / "manifest.json").read_text())
    for file in manifest["parts"]["actor"]["files"]:
        data = (out / file["path"].removeprefix("actor/")).read_bytes()
        assert hashlib.sha256(data).hexdigest() == file["sha256"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "run"]  # no staging left


def test_an_export_whose_checkpoint_vanishes_leaves_nothing(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The checkpoint named on the command line is pruned mid-export: one line, no output, a retry is free."""
    import shutil

    import glassrl.models.lora as lora

    model = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu")
    manager = CheckpointManager(tmp_path / "run" / "checkpoints", keep=1)
    checkpoint = manager.save(2, {"actor": Part("hf", HfPolicy(model, AutoTokenizer.from_pretrained(tiny_model_dir)))})

    def pruned(src, dst, **kwargs):
        shutil.copy2(next(p for p in sorted(src.iterdir()) if p.is_file()), dst)
        shutil.rmtree(checkpoint)
        raise FileNotFoundError(2, "No such file or directory", str(src))

    monkeypatch.setattr(lora.shutil, "copytree", pruned)
    assert main(["export", str(checkpoint), "--out", str(tmp_path / "out")]) == 2
    assert "step_00000002 was removed or changed while it was exported" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_an_export_retries_when_the_checkpoint_is_pruned_while_it_is_verified(tiny_model_dir, tmp_path, monkeypatch):
    """`glassrl export` during training still failed 4 times in 269 (issue 37, item 11): the run pruned the
    checkpoint between the listing (``latest``) and the verification of its files, before the export's
    retry loop began. Injected here at the first file verified: the export goes to the new latest."""
    import glassrl.run.checkpoint as checkpoint_module

    model = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu")
    policy = HfPolicy(model, AutoTokenizer.from_pretrained(tiny_model_dir))
    manager = CheckpointManager(tmp_path / "run" / "checkpoints", keep=1)
    manager.save(2, {"actor": Part("hf", policy)})
    real, verified = checkpoint_module._verify_file, []

    def verify_while_the_run_prunes(checkpoint, entry):
        verified.append(checkpoint.name)
        if len(verified) == 1:  # listed step 2; the run saves step 3 and prunes step 2 before it is verified
            manager.save(3, {"actor": Part("hf", policy)})
        return real(checkpoint, entry)

    monkeypatch.setattr(checkpoint_module, "_verify_file", verify_while_the_run_prunes)
    out = tmp_path / "exported"
    assert main(["export", str(tmp_path / "run"), "--out", str(out)]) == 0
    assert verified[0] == "step_00000002" and set(verified[1:]) == {"step_00000003"}
    assert (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "run"]
