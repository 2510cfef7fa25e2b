"""benchmarks/bench_gpu.py's smoke path (a tiny Qwen2 on the CPU, glassrl's run alone: TRL is no
glassrl dependency and CI has no TRL environment), end to end: the model and its tokenizer built
here with the configuration's vocabulary, a fixed response length, the phase split, the JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_byte_level_tokenizer_has_the_configurations_vocabulary():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from bench_gpu import SMOKE, byte_level_tokenizer
    finally:
        sys.path.remove(str(BENCHMARKS))
    tokenizer = byte_level_tokenizer(SMOKE["vocab_size"])
    assert len(tokenizer) == SMOKE["vocab_size"]
    text = "请问1+1=2？ Is 12+34=47?"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text.encode()) and tokenizer.decode(ids) == text  # one token per byte
    assert tokenizer.decode([SMOKE["vocab_size"] - 1])  # a filler id the model may sample decodes


@pytest.mark.slow
def test_smoke_run(tmp_path):
    out = tmp_path / "bench.json"
    command = [sys.executable, str(BENCHMARKS / "bench_gpu.py"), "--smoke", "--sides", "glassrl", "--steps", "2"]
    done = subprocess.run(
        [*command, "--threads", "1", "--out", str(tmp_path), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "device: CPU" in done.stdout and "| glassrl | " in done.stdout
    record = json.loads(out.read_text())
    (glassrl,) = record["summaries"].values()
    assert record["new_tokens"] == 8 and glassrl["response tokens (mean)"] == 8.0  # no stop: fixed length
    assert {"generate", "score", "logprobs", "update"} <= set(glassrl["phases"])
    assert glassrl["steps"] == 2 and not record["failed"]
    # generation alone: generate, the decoding loop, the static steps (no capture on CPU), same tokens
    assert set(record["generation"]) == {"model.generate", "decoding loop", "static steps, no capture"}
    assert all(figures["rows identical"] == 128 for figures in record["generation"].values())
