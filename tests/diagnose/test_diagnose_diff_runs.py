"""glassrl diff on real tiny runs: one knob apart, the first divergence is named exactly; a run and
its resume do not differ."""

from __future__ import annotations

import re

import pytest

from glassrl.cli import main
from glassrl.diagnose.diff import diff_runs
from glassrl.ledger import read_jsonl
from helpers import preset_trainer, tiny_run_overrides
from run_helpers import KillAt, Killed


@pytest.mark.slow
def test_one_knob_apart_names_the_first_token_that_differs(tiny_model_dir, prompt_files, tmp_path, capsys):
    base = tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "a")
    preset_trainer("ppo", base).train()
    preset_trainer("ppo", [*base, f"output_dir={tmp_path / 'b'}", "algo.gamma=0.5"]).train()

    # γ enters at phase 5: δ_0 = r_0 + γ·V(s_1) − V(s_0) of the first response's first token is the first
    # number of the run that it changes (phases 1–4 of step 1 do not read it)
    first_a = read_jsonl(tmp_path / "a" / "ledgers" / "step_000001.jsonl").responses[0].tokens[0]
    first_b = read_jsonl(tmp_path / "b" / "ledgers" / "step_000001.jsonl").responses[0].tokens[0]
    assert first_a.deltas != first_b.deltas
    result = diff_runs(tmp_path / "a", tmp_path / "b")
    assert result.config == [("algo.gamma", 1.0, 0.5)]
    first = result.first
    assert (first.step, first.phase, first.where, first.column) == (
        1,
        5,
        f"response 0, token 0 ({first_a.token!r})",
        "deltas",
    )
    assert (first.a, first.b) == (first_a.deltas, first_b.deltas)
    assert [s.step for s in result.after] == [1, 2]

    capsys.readouterr()
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert f"first divergence: step 1, phase 5, response 0, token 0 ({first_a.token!r}): deltas " in out
    assert out.splitlines()[2].endswith("; the configs differ in algo.gamma")
    # a tolerance wider than every difference leaves only the config
    assert diff_runs(tmp_path / "a", tmp_path / "b", atol=1e9).first is None


@pytest.mark.slow
def test_a_run_and_its_resume_do_not_differ(tiny_model_dir, prompt_files, tmp_path, capsys):
    common = [
        *tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "straight"),
        "steps=3",
        "logging.checkpoint_every=1",
    ]
    preset_trainer("grpo", common).train()
    resumed = [*common, f"output_dir={tmp_path / 'resumed'}"]
    victim = preset_trainer("grpo", resumed)
    victim.sinks.sinks.append(KillAt(2))
    with pytest.raises(Killed):
        victim.train()
    preset_trainer("grpo", resumed, resume=True).train()

    capsys.readouterr()
    assert main(["diff", str(tmp_path / "straight"), str(tmp_path / "resumed")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "no difference in metrics, ledgers or checkpoints"
    # every part of both runs was compared: the same counts on each side
    compared = re.fullmatch(r"compared \S+ \((.*)\) with \S+ \((.*)\)", out[1])
    assert compared and compared[1] == compared[2] and "0 ledgers" not in compared[1], out[1]
    assert out[2].startswith("not compared, measurements of the machine: perf/…")
