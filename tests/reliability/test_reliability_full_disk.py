"""A disk that really fills up (issue 32): a tmpfs mounted for the test, sized so that a run's second
checkpoint does not fit. The save ends in one line naming the directory, the space a checkpoint
takes and the space free; the half-written checkpoint is removed, the previous one stays
``latest`` and verifies, and the run resumes once there is room. The same for ``sft``'s weights.

Mounting needs root (or CAP_SYS_ADMIN); elsewhere the tests skip and say why. The ENOSPC raised
by a stand-in function is tested in test_reliability_faults.py (everywhere).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from harness import assert_one_error_line, run_cli

from glassrl.run.checkpoint import CheckpointManager, read_manifest
from helpers import tiny_run_overrides

DATA = Path(__file__).resolve().parent / "data"
PAIRS = DATA / "sft_pairs.jsonl"
PAGE = 4096


def _mount(path: Path, size: int, remount: bool = False) -> subprocess.CompletedProcess:
    options = f"{'remount,' if remount else ''}size={size}"
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)


class SmallDisk:
    """A tmpfs mounted at ``path``; ``resize(bytes)`` makes it that size (whole pages)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def resize(self, size: int) -> None:
        done = _mount(self.path, -(-size // PAGE) * PAGE, remount=True)
        assert done.returncode == 0, done.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A fresh 64 MiB tmpfs under tmp_path, unmounted afterwards; skipped where mounting is refused."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = _mount(disk, 64 << 20)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip() or mounted.returncode}")
    yield SmallDisk(disk)
    subprocess.run(["umount", "-l", str(disk)], check=False)


def _used(path: Path) -> int:
    stat = os.statvfs(path)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def _checkpoint_bytes(checkpoint: Path) -> int:
    return sum(f["size"] for part in read_manifest(checkpoint)["parts"].values() for f in part["files"])


def test_a_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_last(
    capsys, small_disk, tiny_model_dir, prompt_files
):
    run = small_disk.path / "run"
    argv = ["train", "grpo", *tiny_run_overrides(tiny_model_dir, prompt_files, run)]
    argv += ["logging.checkpoint_every=1", "logging.keep_checkpoints=1", "logging.ledger_every=0"]
    argv += ["logging.report=false", "data.test=null"]
    rc, _, err = run_cli(capsys, *argv, "steps=1")
    assert rc == 0, err
    checkpoints = run / "checkpoints"
    first = checkpoints / "step_00000001"
    size = _checkpoint_bytes(first)
    small_disk.resize(_used(small_disk.path) + size // 2)  # room for the step's metrics, not for its checkpoint

    line = assert_one_error_line(
        capsys,
        [*argv, "steps=2", "--resume"],
        rf"checkpoint step_00000002: cannot write under {checkpoints}: No space left on device; a checkpoint "
        r"takes about [\d.]+ [kM]B \(step_00000001 does\), [\d.]+ [kM]?B is free there",
    )
    assert "Traceback" not in line
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_00000001"]  # no tmp-* left
    assert (checkpoints / "latest").read_text() == "step_00000001\n"
    manager = CheckpointManager(checkpoints, keep=1)
    manager.load(first, set(read_manifest(first)["parts"]))  # every file as its manifest says

    small_disk.resize(64 << 20)
    rc, _, err = run_cli(capsys, *argv, "steps=2", "--resume")
    assert rc == 0, err
    assert (checkpoints / "latest").read_text() == "step_00000002\n"


def test_a_full_disk_during_sft_weights_is_one_line_and_keeps_the_old_outputs(capsys, small_disk, tiny_model_dir):
    out = small_disk.path / "sft"
    argv = ["sft", "sft", f"model={tiny_model_dir}", f"data={PAIRS}", f"eval_data={PAIRS}", f"output_dir={out}"]
    rc, _, err = run_cli(capsys, *argv, "steps=2")
    assert rc == 0, err
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    weights = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    small_disk.resize(_used(small_disk.path) + weights // 2)
    assert_one_error_line(capsys, [*argv, "steps=2"], rf"output_dir = {out}: cannot write under .*No space left")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in small_disk.path.iterdir()] == ["sft"]  # no staging directory, no lock left
