"""`glassrl demo` (make demo) on the tiny default-format model: train, before/after, the ledger."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from glassrl.cli import main
from glassrl.commands import demo

ROOT = Path(__file__).resolve().parents[1]


def tiny(model: Path, prompts: tuple[Path, Path]) -> list[str]:
    """Overrides making the demo a seconds-long run of the tiny model on 8 prompts."""
    train, test = prompts
    return [
        f"model.actor={model}",
        f"data.train={train}",
        f"data.test={test}",
        "data.eval_size=8",
        "rollout.n=4",
        "batch.prompts_per_step=2",
        "batch.mini_batch_prompts=2",
        "batch.micro_batch_responses=8",
    ]


def figures(run: Path) -> list[dict]:
    """metrics.jsonl without the timings."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


@pytest.mark.slow
def test_demo_prints_before_after_run_dir_and_ledger(tiny_model_dir, prompt_files, tmp_path, capsys):
    # a path longer than a terminal line: the commands and paths printed stay whole, to be copied
    out = tmp_path / ("a-run-directory-" * 6) / "demo-grpo"
    argv = ["demo", "--algo", "grpo", "--steps", "2", "--out", str(out), *tiny(tiny_model_dir, prompt_files)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    rows = figures_before = figures(out)
    assert [r["step"] for r in rows] == [0, 1, 2]  # evaluated before the first and after the last step only
    before, after = rows[0]["eval/accuracy"], rows[-1]["eval/accuracy"]
    cells = [f"{100 * before:.1f}%", f"{100 * after:.1f}%", f"{100 * (after - before):+.1f} points"]
    assert re.search(r"\s+│\s+".join(map(re.escape, cells)) + r" │", text)
    assert f"run directory: {out}" in text
    assert f"report: {out / 'report.html'}" in text and (out / "report.html").is_file()
    command = f"$ glassrl explain --model {out} --prompt '请问1+1=2？' --response '是的，等于2！' --sample 3"
    assert command in text
    assert f"run {out} · checkpoint step_00000002 (step 2)" in text
    # the ledger of the reference example: its tokens, then EOS, its score on EOS, the group baseline
    assert "response 0 · prompt '请问1+1=2？' · score 1.0000 · group 0 · 7 tokens · finish stop" in text
    assert "<|eos|>" in text and "group 0: S = Σ_i r_i per response" in text
    assert "demo finished in" in text

    # A second demo in the same directory starts afresh and prints the same figures (seeded).
    assert main(argv) == 0
    again = capsys.readouterr().out
    assert figures(out) == figures_before
    table = lambda t: t.split("3. held-out accuracy")[1].split("run directory")[0]  # noqa: E731
    assert table(again) == table(text)


def test_demo_control_sets_a_random_reward_run_beside_the_real_one(tiny_model_dir, prompt_files, tmp_path, capsys):
    out = tmp_path / "demo-grpo"
    argv = ["demo", "--steps", "2", "--out", str(out), "--control", "random", *tiny(tiny_model_dir, prompt_files)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    control = tmp_path / "demo-grpo-control-random"
    real_rows, control_rows = figures(out), figures(control)
    assert control_rows[0]["eval/accuracy"] == real_rows[0]["eval/accuracy"]  # the same model before training
    assert "reward/control/real_mean" in control_rows[1] and "reward/control/real_mean" not in real_rows[1]
    before, after, control_after = (
        real_rows[0]["eval/accuracy"],
        real_rows[-1]["eval/accuracy"],
        control_rows[-1]["eval/accuracy"],
    )
    cells = [f"{100 * before:.1f}%", f"{100 * after:.1f}%", f"{100 * control_after:.1f}%"]
    assert re.search(r"\s+│\s+".join(map(re.escape, cells)), text.split("3b. the control")[1])
    assert "reward: control random (reward.control)" in text and ", control " in text.split("demo finished in")[1]
    assert main(["demo", "--task", "research", "--control", "random"]) == 2
    assert "--control: only with --algo or --task tool-add" in capsys.readouterr().err


def test_accuracies_reads_the_first_and_last_evaluation(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        '{"step": 0, "eval/accuracy": 0.25}\n{"step": 1, "reward/mean": 0.5}\n'
        '{"step": 2, "eval/accuracy": 0.5, "reward/mean": 0.7}\n'
    )
    assert demo.accuracies(metrics) == {"all": (0.25, 0.5)}
    metrics.write_text(
        '{"step": 0, "eval/accuracy": 0.25, "eval/accuracy/en": 0.0, "eval/accuracy/zh": 0.5}\n'
        '{"step": 2, "eval/accuracy": 0.5, "eval/accuracy/en": 0.5, "eval/accuracy/zh": 0.5}\n'
    )
    assert demo.accuracies(metrics) == {"all": (0.25, 0.5), "en": (0.0, 0.5), "zh": (0.5, 0.5)}
    metrics.write_text('{"step": 1, "reward/mean": 0.5}\n')
    with pytest.raises(demo.GlassrlError, match="no evaluation before the first step"):
        demo.accuracies(metrics)


def test_demo_errors(tmp_path, capsys):
    assert main(["demo", "--algo", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("glassrl demo: error: --algo: unknown preset 'nope'; valid: ") and "grpo" in err
    assert "ppo" in err and "sft" not in err
    assert main(["demo", "algo.lam=0.9"]) == 2  # a knob GRPO ignores: one line, before any model is built
    assert capsys.readouterr().err == (
        "glassrl demo: error: algo.lam = 0.9: ignored: algo.advantage = grpo does not read it (only gae); remove it\n"
    )
    (tmp_path / "mine.txt").write_text("keep me")
    assert main(["demo", "--out", str(tmp_path), "model.actor=/nonexistent"]) == 2
    assert capsys.readouterr().err == (
        f"glassrl demo: error: --out: {tmp_path} is not empty and not a glassrl run directory; choose another --out\n"
    )
    assert (tmp_path / "mine.txt").read_text() == "keep me"
