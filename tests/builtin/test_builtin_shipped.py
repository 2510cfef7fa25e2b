"""The embedded models' shipped weights (glassrl.builtin.shipped): pinned, current, installed in place of
a build, refused when damaged; ``init-model --force`` builds and sets its figures beside the shipped ones."""

from __future__ import annotations

import hashlib
import io
import json
import shutil

import pytest
from rich.console import Console

from glassrl.builtin import agent_model, default_model, research_model, shipped
from glassrl.builtin.default_model import ensure_default_model
from glassrl.builtin.reasoning_gym_model import RG_SPEC, RG_VERSION
from glassrl.errors import GlassrlError
from glassrl.models.default_model import (
    AGENT_SPEC,
    AGENT_VERSION,
    DEFAULT_SPEC,
    MARKER,
    RESEARCH_SPEC,
    RESEARCH_VERSION,
    VERSION,
    default_model_dir,
    spec_json,
)
from glassrl.models.loading import load_causal_lm, load_tokenizer

QUIET = Console(file=io.StringIO())
SPECS = {VERSION: DEFAULT_SPEC, AGENT_VERSION: AGENT_SPEC, RESEARCH_VERSION: RESEARCH_SPEC, RG_VERSION: RG_SPEC}


def _no_build(out_dir, *, seed, console):
    raise AssertionError("built, though the shipped weights are the model asked for")


@pytest.mark.parametrize("version", sorted(SPECS))
def test_each_model_is_shipped_pinned_and_of_the_current_spec(version):
    folder = shipped.WEIGHTS / version
    assert sorted(p.name for p in folder.iterdir()) == sorted(shipped.SHIPPED[version])
    for name, pinned in shipped.SHIPPED[version].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == pinned, name
    info = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    # a changed spec must ship new weights: tools/ship_models.py after glassrl init-model
    assert (info["version"], info["seed"], info["spec"]) == (version, 0, spec_json(SPECS[version]))
    assert shipped.shipped_dir(version, 0, SPECS[version]) == folder
    assert shipped.shipped_dir(version, 1, SPECS[version]) is None  # another seed is built


def test_the_shipped_weights_are_installed_not_built(monkeypatch, tmp_path):
    monkeypatch.setenv("GLASSRL_HOME", str(tmp_path))
    for module, name in ((default_model, "build_default_model"), (agent_model, "build_agent_model")):
        monkeypatch.setattr(module, name, _no_build)
    monkeypatch.setattr(research_model, "build_research_model", _no_build)
    console = Console(file=io.StringIO())
    path = ensure_default_model(console=console)
    assert path == default_model_dir() and shipped.is_shipped(VERSION, path)
    assert "the shipped model default-v2 (sha256 checked)" in console.file.getvalue()
    rows = (path / shipped.SFT_DATA).read_text(encoding="utf-8").splitlines()
    assert len(rows) > 1000 and json.loads(rows[0])  # what the model was trained on, unzipped
    model, tokenizer = load_causal_lm(path, device="cpu"), load_tokenizer(path)
    assert model.config.vocab_size == len(tokenizer)
    assert research_model.ensure_research_model(console=QUIET) == default_model_dir(RESEARCH_VERSION)
    assert agent_model.ensure_agent_model(console=QUIET) == default_model_dir(AGENT_VERSION)


def test_a_damaged_copy_is_refused_in_one_line(monkeypatch, tmp_path):
    copy = tmp_path / "weights"
    shutil.copytree(shipped.WEIGHTS / VERSION, copy / VERSION)
    weights = copy / VERSION / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(shipped, "WEIGHTS", copy)
    monkeypatch.setattr(default_model, "build_default_model", _no_build)
    with pytest.raises(GlassrlError, match=r"model\.safetensors: sha256 \w+… is not the pinned \w+…: the package's"):
        ensure_default_model(out_dir=tmp_path / "m", console=QUIET)
    # nothing half-installed (the lock file beside the model stays: removing it could split two waiting callers)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.build-lock", "weights"]


def test_init_model_says_shipped_and_force_compares(monkeypatch, tmp_path, capsys):
    from glassrl.cli import main

    monkeypatch.setenv("GLASSRL_HOME", str(tmp_path))
    assert main(["init-model"]) == 0
    out = capsys.readouterr().out
    assert "seed 0, 1,087,104 parameters, 800 SFT steps" in out and "the shipped weights, built in" in out
    assert "arith-verify test (500 prompts, greedy): exact 33.2%" in out

    def stub(out_dir, *, seed, console):  # a build here that came out otherwise
        shutil.copytree(shipped.WEIGHTS / VERSION, out_dir)
        info = json.loads((out_dir / MARKER).read_text(encoding="utf-8"))
        info["heldout_arith_verify"]["exact"] = 0.25
        (out_dir / MARKER).write_text(json.dumps(info), encoding="utf-8")
        (out_dir / "model.safetensors").write_bytes(b"other")

    monkeypatch.setattr(default_model, "build_default_model", stub)
    assert main(["init-model", "--force"]) == 0
    out = capsys.readouterr().out
    assert "the shipped build took 2 min on one thread of a 2-core machine; expect about as long" in out
    assert "built in" in out and "the shipped weights, built" not in out
    assert "the shipped weights: other bytes than this build (the float sums of SFT differ by CPU)" in out
    assert "heldout_arith_verify (shipped → this build): exact 0.332 → 0.25, verdict 0.37 → 0.37" in out


def test_two_processes_that_start_at_once_build_once_and_read_the_same_model(tmp_path):
    """ensure_built takes a lock beside the model: the second caller waits and finds the first's model,
    instead of moving it away while it is read (two first runs on a fresh machine, or parallel tests)."""
    import json
    import threading
    import time

    from rich.console import Console

    from glassrl.builtin.default_model import ensure_built
    from glassrl.models.default_model import DEFAULT_SPEC, MARKER, spec_json

    builds: list[int] = []

    def build(tmp):
        builds.append(1)
        tmp.mkdir(parents=True)
        time.sleep(0.5)  # long enough for the other caller to arrive while this one builds
        (tmp / MARKER).write_text(json.dumps({"seed": 7, "spec": spec_json(DEFAULT_SPEC)}), encoding="utf-8")
        return {}

    out, got = tmp_path / "model", []

    def call():
        got.append(ensure_built(out, 7, DEFAULT_SPEC, "none", build, rebuild=False, console=Console(quiet=True)))

    callers = [threading.Thread(target=call) for _ in range(2)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert got == [out, out] and len(builds) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.build-lock", "model"]  # no copy left behind
