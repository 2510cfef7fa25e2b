"""`glassrl config show` and `glassrl config docs`: every option with its type, default and help;
docs/config.md kept in sync with the dataclasses."""

from __future__ import annotations

from pathlib import Path

import pytest

from glassrl.cli import main
from glassrl.commands.config import CONFIGS, config_class, config_markdown
from glassrl.config import describe

ROOT = Path(__file__).resolve().parents[2]


def test_docs_config_md_is_generated_from_the_dataclasses():
    """Regenerate with: glassrl config docs --output docs/config.md"""
    assert (ROOT / "docs" / "config.md").read_text(encoding="utf-8") == config_markdown(), (
        "docs/config.md is stale: run `glassrl config docs --output docs/config.md`"
    )


@pytest.mark.parametrize("command", list(CONFIGS))
def test_every_option_has_a_one_line_help(command):
    missing = [row.key for row in describe(config_class(command)) if not row.help.strip()]
    assert not missing, f"give these fields their help, option(default, help=...): {missing}"


def test_show_prints_every_option_with_a_presets_values(capsys):
    assert main(["config", "show", "grpo"]) == 0
    out = capsys.readouterr().out
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") >= 5}
    assert set(lines) >= {row.key for row in describe(config_class("train"))}
    # value, then the default where the preset changes it, then the help
    cells = [c.strip() for c in lines["steps"].split("│")[1:-1]]
    assert cells == ["steps", "int", "60", "100", "training steps (each: generate, score, advantages, update)"]
    cells = [c.strip() for c in lines["algo.kl.coef"].split("│")[1:-1]]
    assert cells[:4] == ["algo.kl.coef", "float", "0.001", ""]


def test_show_gives_the_placement_the_run_takes(capsys):
    """Sampling ahead on Ray samples apart unless the placement is written (glassrl.rl.resolve): the
    value shown is where π_θ samples, beside the default it differs from."""
    assert main(["config", "show", "grpo", "trainer.backend=ray", "rollout.max_staleness=1"]) == 0
    lines = {line.split("│")[1].strip(): line for line in capsys.readouterr().out.splitlines() if "│" in line}
    assert [c.strip() for c in lines["ray.rollout.placement"].split("│")[1:-1]][2:4] == ["apart", "with_actor"]


def test_show_without_a_config_prints_the_defaults_and_knows_sft_and_rm(capsys):
    assert main(["config", "show"]) == 0
    out = capsys.readouterr().out
    assert "glassrl train: (TrainConfig)" in out and "logging.report_every" in out
    assert main(["config", "show", "sft", "optim.lr=0.5"]) == 0
    out = capsys.readouterr().out
    assert "(SFTConfig)" in out and "│ 0.5 " in out and "│ 0.001 " in out
    assert main(["config", "show", str(ROOT / "examples" / "rm.yaml"), "--command", "rm"]) == 0
    assert "(RMConfig)" in capsys.readouterr().out


def test_a_typo_on_the_command_line_is_reported_as_one(capsys):
    assert main(["config", "show", "grpo", "algo.lamm=0.9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("glassrl config: error: command line: unknown key algo.lamm (did you mean algo.lam?)")
    assert main(["train", "grpo", "algo.lamm=0.9"]) == 2
    assert "error: command line: unknown key algo.lamm (did you mean algo.lam?)" in capsys.readouterr().err


def test_docs_writes_the_file(tmp_path, capsys):
    out = tmp_path / "config.md"
    assert main(["config", "docs", "--output", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == config_markdown()
    assert main(["config", "docs"]) == 0
    assert capsys.readouterr().out.endswith(config_markdown())


@pytest.mark.slow
def test_a_finished_run_is_extended_from_its_own_config(tiny_model_dir, prompt_files, tmp_path, capsys):
    """glassrl train RUN_DIR/config.yaml --resume steps=N: the saved file holds every key (so a
    knob the algorithm ignores, written at its default, is no error) and steps may change."""
    import json

    from helpers import preset_trainer, tiny_run_overrides

    out = tmp_path / "run"
    preset_trainer("grpo", [*tiny_run_overrides(tiny_model_dir, prompt_files, out), "steps=1"]).train()
    assert main(["train", str(out / "config.yaml"), "--resume", "steps=2"]) == 0
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]
    (resumed,) = [json.loads(line) for line in (out / "resumes.jsonl").read_text().splitlines()]
    assert resumed["step"] == 1 and resumed["changed"] == {"steps": [1, 2]}
    capsys.readouterr()
    assert main(["train", str(out / "config.yaml"), "--resume", "steps=3", "algo.clip_high=0.3"]) == 2
    assert "algo.clip_high" in capsys.readouterr().err
