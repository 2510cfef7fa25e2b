"""CheckpointManager: round trips of every part kind, crash safety, pruning, verification."""

from __future__ import annotations

import fractions
import random
import re

import numpy as np
import pytest
import torch

from glassrl.errors import GlassrlError
from glassrl.run import checkpoint as ckpt
from glassrl.run.checkpoint import CheckpointManager, Part, read_manifest


def _small_parts(step: int) -> dict[str, Part]:
    return {
        "weights": Part("safetensors", {"w": torch.full((2, 3), float(step))}),
        "optimizer": Part("torch", {"step": step}),
        "trainer": Part("json", {"step": step}),
    }


REQUIRED = {"weights", "optimizer", "trainer"}


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(config)


def test_round_trip_of_every_part_kind(tmp_path):
    from transformers import LlamaForCausalLM

    model = _tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5**s)
    ids = torch.tensor([[1, 2, 3, 4]])
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    base = torch.arange(12.0).reshape(3, 4)
    tensors = {"base": base, "view": base[1:], "transposed": base.t()}  # shared storage, non-contiguous
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    expected_draws = (random.random(), np.random.rand(), torch.rand(1).item())
    manager = CheckpointManager(tmp_path / "ckpt", keep=2)

    path = manager.save(
        7,
        {
            "actor": Part("hf", model),
            "optimizer": Part("torch", optimizer.state_dict()),
            "scheduler": Part("torch", scheduler.state_dict()),
            "rng": Part("torch", rng),
            "buffer": Part("safetensors", tensors),
            "trainer": ("json", {"step": 7, "kl": [0.5, None]}),
        },
    )

    assert path == tmp_path / "ckpt" / "step_00000007" and manager.latest() == path
    parts = manager.load(path, {"actor", "optimizer", "scheduler", "rng", "buffer", "trainer"})
    assert parts["trainer"] == {"step": 7, "kl": [0.5, None]}
    for key, tensor in tensors.items():
        assert torch.equal(parts["buffer"][key], tensor)
    reloaded = LlamaForCausalLM.from_pretrained(parts["actor"])
    for (name, a), (_, b) in zip(model.state_dict().items(), reloaded.state_dict().items()):
        assert torch.equal(a, b), name
    fresh_opt = torch.optim.AdamW(reloaded.parameters(), lr=1e-2)
    fresh_opt.load_state_dict(parts["optimizer"])
    for state, fresh in zip(optimizer.state.values(), fresh_opt.state.values()):
        assert set(state) == set(fresh) == {"step", "exp_avg", "exp_avg_sq"}
        assert all(torch.equal(state[k], fresh[k]) for k in state)
    assert parts["scheduler"] == scheduler.state_dict()
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    random.setstate(parts["rng"]["python"])
    np.random.set_state(parts["rng"]["numpy"])
    torch.set_rng_state(parts["rng"]["torch"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected_draws


def test_manifest_lists_every_file_with_size_and_hash(tmp_path):
    path = CheckpointManager(tmp_path, keep=1).save(3, _small_parts(3))
    manifest = read_manifest(path)
    assert manifest["step"] == 3 and manifest["format"] == 2 and "glassrl_version" in manifest
    assert manifest["finite"] is True
    assert {n: [f["path"] for f in e["files"]] for n, e in manifest["parts"].items()} == {
        "weights": ["weights.safetensors"],
        "optimizer": ["optimizer.json", "optimizer.safetensors"],
        "trainer": ["trainer.json"],
    }
    entry = manifest["parts"]["trainer"]["files"][0]
    assert entry["size"] == (path / "trainer.json").stat().st_size and len(entry["sha256"]) == 64
    assert (tmp_path / "latest").read_text() == "step_00000003\n"


def test_crash_mid_save_keeps_latest_on_the_previous_checkpoint(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path, keep=3)
    first = manager.save(1, _small_parts(1))
    real_torch_writer = ckpt._WRITERS["torch"]

    def crash_after_writing(directory, name, value):
        real_torch_writer(directory, name, value)
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setitem(ckpt._WRITERS, "torch", crash_after_writing)
    with pytest.raises(KeyboardInterrupt):
        manager.save(2, _small_parts(2))  # weights written, optimizer written, then killed
    monkeypatch.undo()

    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith("tmp-")]
    assert len(leftovers) == 1 and leftovers[0].startswith("tmp-step_00000002-")
    assert not (tmp_path / leftovers[0] / "manifest.json").exists()
    assert manager.latest() == first and manager.checkpoints() == [first]
    assert manager.load(manager.latest(), REQUIRED)["trainer"] == {"step": 1}

    second = manager.save(2, _small_parts(2))
    assert manager.latest() == second
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("tmp-")]


def test_orphan_checkpoint_from_a_kill_before_latest_moved_is_replaced(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path, keep=3)
    first = manager.save(1, _small_parts(1))
    real_write = ckpt.write_durably

    def kill_at_pointer(tmp, data, final=None):
        if final is not None and final.name == "latest":
            raise KeyboardInterrupt("killed before latest moved")
        real_write(tmp, data, final)

    monkeypatch.setattr(ckpt, "write_durably", kill_at_pointer)
    with pytest.raises(KeyboardInterrupt):
        manager.save(2, _small_parts(2))
    monkeypatch.undo()
    assert manager.latest() == first  # the complete but unannounced step 2 is not taken
    assert [p.name for p in manager.checkpoints()] == ["step_00000001", "step_00000002"]

    manager.save(2, {**_small_parts(2), "trainer": Part("json", {"step": 2, "again": True})})
    assert manager.load(manager.latest(), REQUIRED)["trainer"] == {"step": 2, "again": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000001", "step_00000002"]


def test_pruning_keeps_the_newest(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    for step in (5, 10, 15, 20):
        manager.save(step, _small_parts(step))
    assert [p.name for p in manager.checkpoints()] == ["step_00000015", "step_00000020"]
    assert manager.latest().name == "step_00000020"


def test_pruning_spares_checkpoints_newer_than_latest(tmp_path):
    manager = CheckpointManager(tmp_path, keep=1)
    manager.save(30, _small_parts(30))
    (tmp_path / "latest").write_text("step_00000010\n")  # as if resumed from an older checkpoint
    manager.save(20, _small_parts(20))
    assert [p.name for p in manager.checkpoints()] == ["step_00000020", "step_00000030"]


def test_corrupt_and_truncated_files_are_named(tmp_path):
    manager = CheckpointManager(tmp_path, keep=1)
    path = manager.save(10, _small_parts(10))
    data = bytearray((path / "optimizer.json").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / "optimizer.json").write_bytes(bytes(data))
    with pytest.raises(GlassrlError, match=r"step_00000010: file optimizer\.json is corrupt"):
        manager.load(path, REQUIRED)

    path = manager.save(11, _small_parts(11))
    with (path / "weights.safetensors").open("r+b") as f:
        f.truncate(10)
    with pytest.raises(GlassrlError, match=r"file weights\.safetensors has 10 bytes.*truncated"):
        manager.load(path, REQUIRED)

    path = manager.save(12, _small_parts(12))
    (path / "trainer.json").unlink()
    with pytest.raises(GlassrlError, match=r"file trainer\.json is missing"):
        manager.load(path, REQUIRED)


def test_missing_and_unexpected_parts_are_errors(tmp_path):
    manager = CheckpointManager(tmp_path, keep=1)
    path = manager.save(10, _small_parts(10))
    with pytest.raises(GlassrlError, match=r"^checkpoint step_00000010 has no part 'critic_optimizer' "):
        manager.load(path, REQUIRED | {"critic_optimizer"})
    with pytest.raises(GlassrlError, match=r"checkpoint step_00000010 has unexpected part 'weights'"):
        manager.load(path, REQUIRED - {"weights"})


def test_incomplete_directories_are_never_returned(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    assert manager.latest() is None and manager.checkpoints() == []
    (tmp_path / "step_00000005").mkdir()  # no manifest
    assert manager.checkpoints() == []
    with pytest.raises(GlassrlError, match="no manifest.json"):
        manager.load(tmp_path / "step_00000005", REQUIRED)
    (tmp_path / "latest").write_text("step_00000005\n")
    with pytest.raises(
        GlassrlError,
        match=r"latest names 'step_00000005', which is not a complete checkpoint.*"
        r"no checkpoint in .* verifies",
    ):
        manager.latest()
    saved = manager.save(6, _small_parts(6))
    saved.rename(tmp_path / "step_00000007")  # a directory renamed by hand
    with pytest.raises(GlassrlError, match="records step 6, but the directory is step_00000007"):
        manager.load(tmp_path / "step_00000007", REQUIRED)


def test_bad_parts_are_rejected(tmp_path):
    manager = CheckpointManager(tmp_path, keep=1)
    with pytest.raises(ValueError, match="unknown checkpoint part kind 'pickle'.*valid: json, torch, safetensors, hf"):
        manager.save(1, {"x": Part("pickle", 1)})
    for bad in ("../x", "a.b", "manifest"):
        with pytest.raises(ValueError, match=f"invalid checkpoint part name '{re.escape(bad)}'"):
            manager.save(1, {bad: Part("json", 1)})
    with pytest.raises(TypeError, match="dict\\[str, Tensor\\]"):
        manager.save(1, {"x": Part("safetensors", {"a": 1})})
    with pytest.raises(ValueError, match="keep must be >= 1"):
        CheckpointManager(tmp_path, keep=0)
    assert manager.latest() is None


def test_a_value_the_encoding_cannot_hold_is_refused_at_save(tmp_path):
    """Nothing is pickled: an object outside the encoding (glassrl.run.codec) is an error
    naming the part and where in it, and no checkpoint is written."""
    manager = CheckpointManager(tmp_path, keep=1)
    with pytest.raises(
        GlassrlError, match=r"checkpoint part 'odd': groups\[0\]\.x: cannot store a fractions\.Fraction"
    ):
        manager.save(1, {"odd": Part("torch", {"groups": [{"x": fractions.Fraction(1, 3)}]})})
    with pytest.raises(GlassrlError, match=r"part 'plain': t: a tensor, which this part cannot hold"):
        manager.save(1, {"plain": Part("json", {"t": torch.zeros(1)})})
    assert manager.latest() is None and not list(tmp_path.iterdir())


def test_a_part_that_does_not_read_back_is_refused(tmp_path, monkeypatch):
    """Verified at save time: the part is decoded and compared with what was given."""
    real = ckpt._READERS["json"]
    monkeypatch.setitem(ckpt._READERS, "json", lambda path, name: {**real(path, name), "step": -1})
    with pytest.raises(GlassrlError, match="part 'trainer' of kind 'json' does not read back as written"):
        CheckpointManager(tmp_path, keep=1).save(1, _small_parts(1))
    assert not (tmp_path / "latest").exists()


@pytest.mark.parametrize("kind", ["torch", "safetensors"])
def test_a_tensor_written_wrong_is_refused_at_save(tmp_path, monkeypatch, kind):
    """The read-back compares the tensor file one tensor at a time: one value off in the file is caught."""
    real = ckpt.save_file

    def off_by_one(tensors, filename, *args, **kwargs):
        key = sorted(tensors)[0]
        return real({**tensors, key: tensors[key] + 1}, filename, *args, **kwargs)

    monkeypatch.setattr(ckpt, "save_file", off_by_one)
    part = Part(kind, {"w": torch.zeros(3)} if kind == "safetensors" else {"exp_avg": torch.zeros(3), "step": 2})
    with pytest.raises(GlassrlError, match=f"part 'optimizer' of kind '{kind}' does not read back as written"):
        CheckpointManager(tmp_path, keep=1).save(1, {"optimizer": part})


def test_a_deleted_latest_falls_back_to_the_newest_checkpoint_that_verifies(tmp_path):
    manager = CheckpointManager(tmp_path, keep=3)
    for step in (1, 2, 3):
        manager.save(step, _small_parts(step))
    (tmp_path / "latest").unlink()
    with (tmp_path / "step_00000003" / "weights.safetensors").open("r+b") as f:
        f.truncate(10)  # the newest no longer verifies
    found = manager.find_latest()
    assert found.path == tmp_path / "step_00000002"
    assert "latest is missing; resuming from step_00000002, the newest checkpoint whose files verify" in found.note
    (tmp_path / "latest").write_text("step_00000009\n")  # dangling
    assert manager.find_latest().path.name == "step_00000002"
    (tmp_path / "latest").write_text("step_00000001\n")
    assert manager.find_latest() == (tmp_path / "step_00000001", None)


def test_the_last_finite_checkpoint_survives_pruning(tmp_path):
    manager = CheckpointManager(tmp_path, keep=1)
    manager.save(1, _small_parts(1))
    bad = {**_small_parts(2), "weights": Part("safetensors", {"w": torch.full((2, 3), float("nan"))})}
    assert read_manifest(manager.save(2, bad))["finite"] is False
    manager.save(3, {**bad, "trainer": Part("json", {"step": 3})})
    assert [p.name for p in manager.checkpoints()] == ["step_00000001", "step_00000003"]
    manager.save(4, _small_parts(4))  # finite again: the old good one may go
    assert [p.name for p in manager.checkpoints()] == ["step_00000004"]


def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path, keep=2)
    first = manager.save(1, _small_parts(1))

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setitem(ckpt._WRITERS, "safetensors", full)
    with pytest.raises(
        GlassrlError,
        match=r"^checkpoint step_00000002: cannot write under .*: No space left on device; a checkpoint takes about "
        r"\d+ B \(step_00000001 does\), [\d.]+ [kMGT]?B is free there$",  # issue 32: the space needed
    ):
        manager.save(2, _small_parts(2))
    assert manager.latest() == first and not [p for p in tmp_path.iterdir() if p.name.startswith("tmp-")]


def test_optimiser_state_is_written_without_a_copy_and_shared_storage_reads_back(tmp_path):
    """A "torch" part's tensors are written as they are (no clone: Adam's two moments are twice the weights),
    except a tensor on a storage already written, which safetensors refuses and so is copied; both read back."""
    from glassrl.run import codec

    moment, base = torch.arange(6.0), torch.arange(10.0)
    state = {"exp_avg": moment, "head": base[:4], "tail": base[4:], "step": torch.tensor(3.0)}
    _, tensors = codec.encode(state)
    stored = dict(zip(state, tensors.values()))
    assert stored["exp_avg"].data_ptr() == moment.data_ptr() and stored["head"].data_ptr() == base.data_ptr()
    assert stored["tail"].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    manager = CheckpointManager(tmp_path, keep=1)
    manager.save(1, {"optimizer": Part("torch", state)})
    loaded = manager.load(manager.latest(), {"optimizer"})["optimizer"]
    assert codec.same(loaded, state)


def test_finiteness_is_read_in_chunks_and_sees_the_last_value(tmp_path):
    """_finite checks a tensor 4 Mi values at a time: a non-finite value in the last chunk is still seen,
    and a written file is read back tensor by tensor with the same verdict."""
    big = torch.zeros(5 * 2**20)
    assert ckpt._finite(big)
    big[-1] = float("inf")
    assert not ckpt._finite(big) and not ckpt._finite({"m": [torch.ones(2), big]})
    from safetensors.torch import save_file

    save_file({"a": torch.ones(3, dtype=torch.bfloat16), "b": big, "n": torch.arange(4)}, tmp_path / "w.safetensors")
    assert not ckpt._streamed_finite(tmp_path / "w.safetensors")
    read = dict(ckpt._tensors_in(tmp_path / "w.safetensors"))
    assert (
        read["a"].dtype == torch.bfloat16 and torch.equal(read["n"], torch.arange(4)) and read["b"].shape == big.shape
    )
