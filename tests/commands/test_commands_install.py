"""A non-editable install (what `pip install .` gives a user) carries the presets: `glassrl demo`
and `glassrl train NAME` find them without a source tree; and the bundled models' shipped weights,
every file as pinned."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from glassrl import presets

ROOT = Path(__file__).resolve().parents[2]

# Run inside the installed copy, from a directory with no examples/: every preset loads and
# resolves; `glassrl demo` lists the presets from package data; `glassrl train NAME` reads a
# preset by its name.
CHECK = """
import contextlib, io
import glassrl
from glassrl import presets
from glassrl.cli import main
from glassrl.config import load_config
from glassrl.rl.config import TrainConfig
from glassrl.rl.resolve import resolve
from glassrl.supervised.rm import RMConfig
from glassrl.supervised.sft import SFTConfig

for name in presets.rl_names():
    resolve(load_config(TrainConfig, presets.path(name)))
load_config(SFTConfig, presets.path("sft"))
load_config(RMConfig, presets.path("rm"))

def err(run):
    text = io.StringIO()
    with contextlib.redirect_stderr(text):
        try:
            code = run()
        except SystemExit as exit:
            code = exit.code
    return f"{code} {text.getvalue()}"

from glassrl.builtin import shipped
for version, files in shipped.SHIPPED.items():  # every shipped file installed, as pinned
    for name, pinned in files.items():
        assert shipped.sha256(shipped.WEIGHTS / version / name) == pinned, (version, name)
assert shipped.WEIGHTS.is_relative_to(glassrl.__file__.rsplit("/", 1)[0]) and len(shipped.SHIPPED) == 4

print(glassrl.__file__)
print(" ".join(presets.names()))
print(err(lambda: main(["demo", "--steps", "1", "algo.cispo_eps_is_high=0.3"])), end="")
print(err(lambda: main(["demo", "--algo", "nope"])), end="")
print(err(lambda: main(["train", "grpo", "steps=0"])), end="")
"""


@pytest.mark.slow
def test_installed_package_holds_loadable_presets(tmp_path):
    project = tmp_path / "project"  # a copy, so that the build leaves nothing in the source tree
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-compile", "-q"]
    subprocess.run([*pip, "--target", str(site), str(project)], check=True, capture_output=True, timeout=300)

    installed = sorted(p.stem for p in (site / "glassrl" / "presets").glob("*.yaml"))
    assert installed == presets.names() and "grpo" in installed and "sft" in installed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    checked = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300
    )
    assert checked.returncode == 0, checked.stderr
    where, names, module, demo, train = checked.stdout.splitlines()
    assert Path(where).is_relative_to(site) and names.split() == presets.names()
    assert demo.startswith("2 glassrl demo: error: --algo: unknown preset 'nope'; valid: aspo, ")
    assert "grpo" in demo and "ppo" in demo and "sft" not in demo
    assert train == "2 glassrl train: error: steps = 0: must be >= 1"
    assert module.startswith("2 glassrl demo: error: algo.cispo_eps_is_high = 0.3: ignored")
