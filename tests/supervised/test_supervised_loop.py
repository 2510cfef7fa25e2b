"""The supervised trainers' one loop (glassrl.supervised.loop), driven by a toy objective: what a
new trainer (DPO, KTO) supplies is enough for rows, evaluation, the non-finite policy and outputs."""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import yaml
from rich.console import Console

from glassrl.errors import GlassrlError
from glassrl.optim import OptimConfig
from glassrl.supervised.loop import Tally, model_dir, train_supervised, window_means


def test_window_means_by_hand():
    """SFT weighs a step by its tokens: (6 + 1) / (3 + 1); the reward model by 1: (0.5 + 1.5) / 2."""
    tokens = [Tally(3, {"train/loss": 6.0}), Tally(1, {"train/loss": 1.0})]
    assert window_means(tokens, ("train/loss",)) == {"train/loss": 1.75}
    steps = [Tally(1, {"train/loss": 0.5, "train/accuracy": 1.0}), Tally(1, {"train/loss": 1.5, "train/accuracy": 0.0})]
    assert window_means(steps, ("train/loss", "train/accuracy")) == {"train/loss": 1.0, "train/accuracy": 0.5}
    empty = window_means([], ("train/loss", "train/accuracy"))  # every step skipped: null in metrics.jsonl
    assert list(empty) == ["train/loss", "train/accuracy"] and all(math.isnan(v) for v in empty.values())


@dataclass
class ToyConfig:
    seed: int = 0
    batch_size: int = 2
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=0.1, warmup_steps=0, decay="constant"))
    output_dir: str = "toy"
    eval_every: int = 1
    log_every: int = 2
    device: str = "cpu"
    threads: int | str = "auto"
    on_nonfinite: str = "skip"

    def validate(self, written=None) -> None:
        pass


class Line(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))

    def save_pretrained(self, path: Path) -> None:
        (Path(path) / "w.json").write_text(json.dumps(self.w.item()))


class Words:
    def save_pretrained(self, path: Path) -> None:
        (Path(path) / "words.txt").write_text("toy")


class ToyObjective:
    """Fits y = 2x by a weight w; its second step's loss is NaN."""

    name = "toy"
    train_keys = ("train/loss",)

    def __init__(self) -> None:
        self.model, self.tokenizer, self.train, self.steps, self.calls = Line(), Words(), [1.0, 2.0, 3.0, 4.0], 3, 0
        self.sizes = {"examples": len(self.train)}

    def loss(self, examples):
        self.calls += 1
        x = torch.tensor(examples)
        loss = ((self.model.w * x - 2 * x) ** 2).mean() * (math.nan if self.calls == 2 else 1.0)
        return loss, Tally(1, {"train/loss": loss.item()})

    def evaluate(self):
        return {"eval/w": self.model.w.item()}

    def finish(self, out, result):
        (out / "toy.json").write_text(json.dumps({"steps": result["steps"]}))

    def summary(self, result):
        return ", ".join(f"{key} {result[key]:.4f}" for key in ("train/loss", "eval/w") if key in result)


def test_a_new_objective_gets_rows_evaluation_skips_and_staged_outputs(tmp_path):
    out, screen = tmp_path / "toy", io.StringIO()
    cfg = ToyConfig(output_dir=str(out))
    result = train_supervised(cfg, lambda device: ToyObjective(), Console(file=screen))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # step 1: an eval row before any train row; step 2 skipped (NaN), so its window holds step 1 only
    assert [sorted(r) for r in rows] == [
        ["eval/w", "step"],
        ["eval/w", "step", "train/grad_norm", "train/loss", "train/lr", "train/skipped_steps"],
        ["eval/w", "step", "train/grad_norm", "train/loss", "train/lr"],
    ]
    assert rows[1]["train/skipped_steps"] == 1 and rows[1]["train/grad_norm"] is None
    assert rows[0]["eval/w"] == rows[1]["eval/w"] != rows[2]["eval/w"]  # the skipped step left w as it was
    assert result["steps"] == 3 and result["examples"] == 4 and result["eval/w"] == rows[2]["eval/w"]
    written = ["metrics.jsonl", "toy.json", "toy_config.yaml", "w.json", "words.txt"]  # loop's, objective's, model's
    assert sorted(p.name for p in out.iterdir()) == written
    assert yaml.safe_load((out / "toy_config.yaml").read_text())["log_every"] == 2
    assert json.loads((out / "w.json").read_text()) == result["eval/w"]
    assert f"toy: 3 steps in {result['time_s']:.1f}s, train/loss" in screen.getvalue()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["toy"]  # no staging or lock left behind


def test_stop_leaves_no_output(tmp_path):
    cfg = ToyConfig(output_dir=str(tmp_path / "toy"), on_nonfinite="stop")
    with pytest.raises(GlassrlError, match=r"toy step 2: train/loss = nan"):
        train_supervised(cfg, lambda device: ToyObjective(), Console(file=io.StringIO()))
    assert list(tmp_path.iterdir()) == []


def test_the_default_model_must_be_built(tmp_path, monkeypatch):
    monkeypatch.setenv("GLASSRL_HOME", str(tmp_path))
    with pytest.raises(GlassrlError, match="model: default: the default model is not built yet in .*run glassrl init"):
        model_dir("default")
    assert model_dir(str(tmp_path)) == tmp_path
