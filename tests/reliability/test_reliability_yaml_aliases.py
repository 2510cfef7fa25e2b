"""YAML aliases are refused wherever glassrl reads YAML (issue 37, item 2): nine levels of nine
aliases in ~2 KB ("billion laughs") name 9⁹ values, and every walk over the loaded tree visited
each, which kept ``glassrl train`` busy for half an hour. As a file, as one override, and as a
run's config.yaml read by ``diff`` and ``--resume``, the answer is one line naming the file and
line. Each command runs in a subprocess with a generous timeout, so that a regression fails the
test instead of hanging it (the outcome is checked, not the time)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from glassrl.config import safe_load

TIMEOUT_S = 300  # far above the seconds each answer takes; the unfixed loader took half an hour


def bomb(levels: int = 9, width: int = 9) -> str:
    """``levels`` anchored lists of ``width`` aliases of the one before, padded to ~2 KB, under ``seed``."""
    lines = [f"level_0_long_name: &level_0_long_name [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels + 1):
        aliases = ", ".join([f"*level_{i - 1}_long_name"] * width)
        lines.append(f"level_{i}_long_name: &level_{i}_long_name [{aliases}]")
    return "\n".join([*lines, f"seed: *level_{levels}_long_name", ""])


def glassrl(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    code = "import sys; from glassrl.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=TIMEOUT_S, env=env
    )


def assert_alias_refused(done: subprocess.CompletedProcess, where: str) -> None:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr[-2000:])
    assert where in lines[0] and "line 2, column" in lines[0], lines[0]
    assert "an alias (*level_0_long_name): glassrl reads no YAML anchors or aliases" in lines[0], lines[0]


def test_the_bomb_is_the_issues_size():
    assert 1500 < len(bomb().encode()) < 2500 and len(yaml.safe_load(bomb())) == 11  # PyYAML itself reads it


def test_the_loader_refuses_an_alias_and_keeps_everything_else():
    with pytest.raises(yaml.YAMLError, match=r"an alias \(\*a\)"):
        safe_load("x: &a 1\ny: *a\n")
    assert safe_load("x: &a 1\ny: 2\n") == {"x": 1, "y": 2}  # an anchor alone names nothing twice
    assert safe_load("base: {a: 1}\nrun:\n  <<: {a: 1, b: 2}\n  b: 3\n") == {"base": {"a": 1}, "run": {"a": 1, "b": 3}}


def test_a_config_file_of_aliases_is_one_line(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb(), encoding="utf-8")
    assert_alias_refused(glassrl("train", str(path)), str(path))


def test_an_override_of_aliases_is_one_line(tmp_path):
    done = glassrl("train", "grpo", f"output_dir={tmp_path / 'run'}", f"seed={bomb()}")
    assert_alias_refused(done, "command line: seed:")
    assert_alias_refused(glassrl("sft", "sft", f"seed={bomb()}"), "command line: seed:")


def _run_with_bomb(root: Path) -> Path:
    run = root / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n', encoding="utf-8")
    (run / "config.yaml").write_text(bomb(), encoding="utf-8")
    return run


def test_resuming_a_run_whose_config_yaml_is_a_bomb_is_one_line(tmp_path):
    run = _run_with_bomb(tmp_path)
    assert_alias_refused(glassrl("train", str(run / "config.yaml"), "--resume"), str(run / "config.yaml"))


def test_diff_of_a_run_whose_config_yaml_is_a_bomb_is_one_line(tmp_path):
    run = _run_with_bomb(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n', encoding="utf-8")
    (other / "config.yaml").write_text("seed: 0\n", encoding="utf-8")
    assert_alias_refused(glassrl("diff", str(other), str(run)), f"{run}: its config is not valid YAML")


def test_the_layout_check_of_a_resumed_run_reads_through_the_one_loader(tmp_path):
    """``glassrl train OTHER.yaml output_dir=RUN --resume`` reads RUN/config.yaml for its layout
    (glassrl.rl.resolve): a bomb there is unreadable (the trainer then writes the file again from the
    checkpoint's config), never expanded."""
    from glassrl.rl.resolve import _saved_model_section

    path = tmp_path / "config.yaml"
    path.write_text(bomb(), encoding="utf-8")
    assert _saved_model_section(path) is None
    path.write_text("model:\n  shared_prefix: true\n", encoding="utf-8")
    assert _saved_model_section(path) == {"shared_prefix": True}
