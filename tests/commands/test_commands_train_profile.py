"""``glassrl train --profile``: the per-phase table is printed and one step's trace is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import EXAMPLES, tiny_run_overrides


@pytest.mark.slow
def test_profile_prints_the_phase_table_and_writes_a_trace(tiny_model_dir, prompt_files, tmp_path, capsys):
    from glassrl.cli import main

    run = tmp_path / "run"
    overrides = tiny_run_overrides(tiny_model_dir, prompt_files, run)
    assert main(["train", str(EXAMPLES / "grpo.yaml"), *overrides, "steps=2", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "time per phase, 2 steps" in out
    for phase in ("generate", "score", "logprobs", "rewards", "advantages", "update", "other", "step"):
        assert f"│ {phase} " in out, phase
    assert "tokens_per" not in out  # seconds only
    trace = run / "profile" / "step_000002.trace.json"  # the second step: the first pays one-time costs
    assert f"profiler trace: {trace}" in out.replace("\n", "")
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"phase/generate", "phase/update"} <= names  # PhaseTimer's ranges
    assert any(str(name).startswith("aten::") for name in names)  # the operators themselves
    assert not list(Path(run / "profile").glob("step_000001*"))  # one step only
