"""The top-level ``threads`` of the trainers' configs: its checks, the start-up line, the count recorded
in the run (checkpoint part "threads", environment.json) and reused by --resume under ``auto``."""

from __future__ import annotations

import io
import json

import pytest
import torch
from rich.console import Console

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.models import threads
from glassrl.rl.config import TrainConfig
from glassrl.run.checkpoint import CheckpointManager, Part
from glassrl.supervised.rm import RMConfig
from glassrl.supervised.sft import SFTConfig, train_sft
from helpers import preset_trainer
from run_helpers import remove_checkpoint_part


@pytest.fixture(autouse=True)
def torch_threads():
    """Start each test on 2 threads (so that a choice of 1 shows), and leave torch as it was."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def auto_chooses(monkeypatch, n: int) -> None:
    """``threads: auto`` on a fresh run now gives ``n`` (whatever the load and the environment)."""
    monkeypatch.setattr(threads, "auto_threads", lambda environ=None: (n, f"auto: stub, {n} free"))


def console() -> tuple[Console, io.StringIO]:
    text = io.StringIO()
    return Console(file=text, width=300), text


def recorded(run, step: int) -> dict:
    checkpoints = CheckpointManager(run / "checkpoints", keep=1)
    return checkpoints.load_part(run / "checkpoints" / f"step_{step:08d}", "threads")


@pytest.mark.parametrize("cls", [TrainConfig, SFTConfig, RMConfig])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "threads = 0: must be auto or a whole number of threads >= 1"),
        ("-2", "threads = -2: must be auto or a whole number of threads >= 1"),
        ("1.5", "command line: threads must be an integer, got 1.5"),
        ("two", "command line: threads must be an integer, got 'two'"),
    ],
)
def test_bad_threads_are_one_error_line_naming_the_key(cls, value, message):
    with pytest.raises(GlassrlError) as err:
        load_config(cls, None, [f"threads={value}"])
    assert str(err.value) == message


@pytest.mark.parametrize("cls", [TrainConfig, SFTConfig, RMConfig])
def test_auto_and_a_count_are_accepted(cls):
    assert load_config(cls, None, []).threads == "auto"
    assert load_config(cls, None, ["threads=3"]).threads == 3


def test_resume_reuses_the_recorded_count(fast, tmp_path, monkeypatch):
    run = tmp_path / "run"
    auto_chooses(monkeypatch, 1)
    screen, text = console()
    trainer = preset_trainer("grpo", [*fast, "steps=1"], console=screen)
    assert torch.get_num_threads() == 1
    assert "threads: 1 (auto: stub, 1 free)" in text.getvalue().splitlines()
    trainer.train()
    assert recorded(run, 1) == {"count": 1}
    environment = json.loads((run / "environment.json").read_text(encoding="utf-8"))
    assert (environment["threads"], environment["threads_why"]) == (1, "auto: stub, 1 free")

    auto_chooses(monkeypatch, 2)  # the load has changed: a fresh choice would be 2
    torch.set_num_threads(2)
    screen, text = console()
    resumed = preset_trainer("grpo", [*fast, "steps=2"], resume=True, console=screen)
    assert resumed.threads.count == 1 and torch.get_num_threads() == 1
    line = "threads: 1 (auto: recorded by the run in its checkpoint (auto would choose 2 now))"
    assert line in text.getvalue().splitlines()
    resumed.train()
    assert recorded(run, 2) == {"count": 1}

    # an explicit count wins, and says that the numbers may differ from the run's
    screen, text = console()
    again = preset_trainer("grpo", [*fast, "steps=3", "threads=2"], resume=True, console=screen)
    assert again.threads.count == 2 and torch.get_num_threads() == 2
    assert "threads: 2 (threads = 2; the run recorded 1: its numbers may differ" in text.getvalue()
    again.close()
    last = json.loads((run / "resumes.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    assert last["changed"] == {"steps": [2, 3], "threads": ["auto", 2]}


def test_a_checkpoint_without_a_recorded_count_resumes_with_a_fresh_choice(fast, tmp_path, monkeypatch):
    run = tmp_path / "run"
    auto_chooses(monkeypatch, 1)
    preset_trainer("grpo", [*fast, "steps=1"], console=console()[0]).train()
    remove_checkpoint_part(run / "checkpoints" / "step_00000001", "threads")  # as written before glassrl recorded it
    auto_chooses(monkeypatch, 2)
    resumed = preset_trainer("grpo", [*fast, "steps=2"], resume=True, console=console()[0])
    assert resumed.threads.count == 2 and torch.get_num_threads() == 2
    resumed.train()
    assert recorded(run, 2) == {"count": 2}


def test_sft_applies_threads_and_says_why(tiny_model_dir, tmp_path, monkeypatch):
    auto_chooses(monkeypatch, 1)
    cfg = SFTConfig(model=str(tiny_model_dir), data="task:add", steps=1, batch_size=4, output_dir=str(tmp_path / "sft"))
    screen, text = console()
    train_sft(cfg, console=screen)
    assert torch.get_num_threads() == 1
    assert text.getvalue().splitlines()[0] == "threads: 1 (auto: stub, 1 free)"


def test_load_part_reads_one_verified_part(tmp_path):
    manager = CheckpointManager(tmp_path, keep=1)
    path = manager.save(1, {"threads": Part("json", {"count": 2}), "counters": Part("json", {"step": 1})})
    assert manager.load_part(path, "threads") == {"count": 2}
    assert manager.load_part(path, "kl_controller") is None
    file = path / "threads.json"
    file.write_bytes(file.read_bytes().replace(b"2", b"3"))  # same size, other bytes
    with pytest.raises(GlassrlError, match="file threads.json is corrupt"):
        manager.load_part(path, "threads")
