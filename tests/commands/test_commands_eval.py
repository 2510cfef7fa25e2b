"""`glassrl eval` and `glassrl generate`: a run's own evaluation, or a model's, without training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glassrl.cli import main
from glassrl.rl.evaluation import pass_at_k
from helpers import preset_trainer, tiny_run_overrides


def _metrics(out):
    return json.loads((out / "metrics.json").read_text()), [
        json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()
    ]


def test_eval_of_a_run_is_its_own_final_evaluation(tiny_model_dir, prompt_files, tmp_path, capsys):
    """Greedy (logging.eval_k = 1): the run's last eval/accuracy, from its checkpoint, with no training."""
    run = tmp_path / "run"
    preset_trainer("grpo", tiny_run_overrides(tiny_model_dir, prompt_files, run)).train()
    logged = [
        row for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "eval/accuracy" in row
    ]
    assert main(["eval", str(run), "--out", str(tmp_path / "ev")]) == 0
    metrics, samples = _metrics(tmp_path / "ev")
    for key in ("eval/accuracy", "eval/reward/mean"):
        assert metrics[key] == pytest.approx(logged[-1][key]), key
    assert len(samples) == 8 and {s["prompt_index"] for s in samples} == set(range(8))
    assert "accuracy (greedy, 8 prompts)" in capsys.readouterr().out


def test_eval_of_a_model_with_data_a_user_reward_k_samples_and_groups(tiny_model_dir, prompt_files, tmp_path):
    """mean@k, pass@k and the per-group accuracy follow from the samples written."""
    (tmp_path / "rewards.py").write_text(
        "def score(prompt, response, answer, metadata):\n    return 1.0 if '5' in response else 0.0\n"
    )
    argv = ["eval", str(tiny_model_dir), str(prompt_files[1]), "rewards.py:score"]
    argv += ["logging.eval_k=4", "logging.eval_group_by=lang", "rollout.max_new_tokens=16", "--out", "ev"]
    import os

    here = os.getcwd()
    os.chdir(tmp_path)  # the reward file relative to the working directory
    try:
        assert main(argv) == 0
    finally:
        os.chdir(here)
    metrics, samples = _metrics(tmp_path / "ev")
    assert len(samples) == 8 * 4
    by_prompt: dict[int, list[bool]] = {}
    for s in samples:
        by_prompt.setdefault(s["prompt_index"], []).append(s["correct"])
        assert s["reward"] == (1.0 if "5" in s["response"] else 0.0)
    flags = list(by_prompt.values())
    assert metrics["eval/accuracy"] == pytest.approx(sum(sum(f) / 4 for f in flags) / 8)
    assert metrics["eval/pass_at_2"] == pytest.approx(sum(pass_at_k(4, sum(f), 2) for f in flags) / 8)
    assert metrics["eval/reward/mean"] == pytest.approx(sum(s["reward"] for s in samples) / 32)
    langs = {s["metadata"]["lang"] for s in samples}
    assert {f"eval/accuracy/{lang}" for lang in langs} <= set(metrics)


def test_eval_takes_a_prompts_per_step_the_default_mini_batch_does_not_divide(tiny_model_dir, prompt_files, tmp_path):
    """Evaluation does not train: batch.prompts_per_step=3 and rollout.n=3 are not refused for the mini- and
    micro-batch sizes (8 prompts, 32 responses) that only training uses."""
    argv = ["eval", str(tiny_model_dir), str(prompt_files[1]), "numeric", "batch.prompts_per_step=3", "rollout.n=3"]
    assert main([*argv, "rollout.max_new_tokens=4", "--out", str(tmp_path / "ev")]) == 0
    assert len(_metrics(tmp_path / "ev")[1]) == 8


def test_generate_prints_a_few_answers(tiny_model_dir, capsys):
    assert (
        main(["generate", str(tiny_model_dir), "Is 1+1=2?", "请问2+2=4？", "--greedy", "rollout.max_new_tokens=12"])
        == 0
    )
    out = capsys.readouterr().out
    assert "> Is 1+1=2?" in out and "> 请问2+2=4？" in out
    assert out.count("[stop]") + out.count("[length]") == 2
    assert main(["generate", str(tiny_model_dir), "nope.key=1"]) == 2
    assert "give at least one PROMPT" in capsys.readouterr().err


def test_eval_without_prompts_is_one_line(tiny_model_dir, capsys):
    assert main(["eval", str(tiny_model_dir), "data.train=" + str(tiny_model_dir / "none.jsonl")]) == 2
    assert "no prompts to evaluate" in capsys.readouterr().err


def test_eval_without_out_writes_beside_the_policy_s_name_not_over_the_last(
    tiny_model_dir, prompt_files, tmp_path, monkeypatch
):
    """Issue 44: every evaluation went to runs/eval, the previous one overwritten; now runs/eval/NAME
    (a checkpoint's: RUN-step_N), or output_dir=DIR (TRL's word) as --out."""
    from glassrl.commands.eval import default_out

    run = tmp_path / "runs" / "grpo"
    (run / "checkpoints" / "step_00000004").mkdir(parents=True)
    assert default_out(str(run), []) == Path("runs/eval/grpo")
    assert default_out(str(run / "checkpoints" / "step_00000004"), []) == Path("runs/eval/grpo-step_00000004")
    assert default_out("default", ["data.eval_size=2"]) == Path("runs/eval/default")
    assert default_out(str(run), ["output_dir=mine", "logging.eval_k=2"]) == Path("mine")
    monkeypatch.chdir(tmp_path)
    argv = ["eval", str(tiny_model_dir), str(prompt_files[1]), "data.eval_size=2", "rollout.max_new_tokens=4"]
    assert main([*argv, "output_dir=mine"]) == 0 and (tmp_path / "mine" / "metrics.json").is_file()
    assert main(argv) == 0
    assert (tmp_path / "runs" / "eval" / Path(tiny_model_dir).name / "metrics.json").is_file()
