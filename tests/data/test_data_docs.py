"""docs/data.md: every YAML config on the page is a valid TrainConfig, and its verl example row reads
with the page's keys."""

from __future__ import annotations

import json
import re

import pytest

from glassrl.config import load_config
from glassrl.data.datasets import load_prompts
from glassrl.rl.config import TrainConfig
from helpers import ROOT

PAGE = (ROOT / "docs" / "data.md").read_text(encoding="utf-8")
CONFIGS = re.findall(r"```yaml\n(.*?)```", PAGE, flags=re.S)


def test_the_page_has_its_three_configs():
    assert len(CONFIGS) == 3


@pytest.mark.parametrize("text", CONFIGS)
def test_every_config_on_the_page_loads(text, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    cfg = load_config(TrainConfig, path)
    assert cfg.data.train


def test_the_verl_row_on_the_page_reads_with_its_answer_key(tmp_path):
    (row,) = re.findall(r"```json\n(.*?)```", PAGE, flags=re.S)
    record = json.loads(row.replace("...", "x"))
    (tmp_path / "train.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
    (read,) = load_prompts(tmp_path / "train.jsonl", answer_key="reward_model.ground_truth")
    assert read.answer == "72" and read.metadata["data_source"] == "openai/gsm8k"
