"""A checkpoint edited by hand, its manifest resealed, never trains (issue 37, item 7).

Before: a step counter of −5 trained steps −4…3 and rewrote the first metric rows, 10²⁰ exited 0
having trained nothing, 1.5 was accepted; deep nesting, an overflowing timedelta, a wrong type, a
wrong-size RNG state and a crafted safetensors file were tracebacks; a NaN KL coefficient was
trained with and saved again. Now every restored value is checked against the manifest and the
shape of the state the run holds (glassrl.run.validate), weights are finite, and each case is one
GlassrlError line naming the file and the field — in the one-process loader (glassrl.run.state) and
the sharded one (glassrl.run.sharded) alike. The end-to-end cases run ``glassrl train --resume``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from harness import assert_one_error_line
from safetensors.torch import load_file, save_file

from glassrl.algos.kl import FixedKLController
from glassrl.errors import GlassrlError
from glassrl.run import sharded, state
from glassrl.run.checkpoint import MANIFEST, CheckpointManager
from helpers import tiny_run_overrides

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def reseal(checkpoint: Path) -> None:
    """The manifest made to match every file again, as anyone handing over a run directory can."""
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    for entry in manifest["parts"].values():
        for file in entry["files"]:
            data = (checkpoint / file["path"]).read_bytes()
            file["size"], file["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (checkpoint / MANIFEST).write_text(json.dumps(manifest, indent=2))


def _edit_json(file: Path, edit: Callable[[dict], object]) -> None:
    tree = json.loads(file.read_text())
    edit(tree)
    file.write_text(json.dumps(tree))


def _set(part: str, key: str, value: object) -> Callable[[Path], None]:
    return lambda ck: _edit_json(ck / f"{part}.json", lambda tree: tree.__setitem__(key, value))


def _header(file: Path, edit: Callable[[dict], None] | None = None, length: int | None = None) -> None:
    """The safetensors file with its JSON header edited, or its header length replaced."""
    data = file.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    if length is not None:
        file.write_bytes(struct.pack("<Q", length) + data[8:])
        return
    header = json.loads(data[8 : 8 + n])
    edit(header)
    raw = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


def _first_tensor_offsets_past_the_end(header: dict) -> None:
    key = next(k for k in header if k != "__metadata__")
    header[key]["data_offsets"][1] += 10**9


def _tensors(file: Path, edit: Callable[[dict], None]) -> None:
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file))


NAN = {"__glassrl__": "float", "value": "nan"}
TIMEDELTA = {"__glassrl__": "timedelta", "days": 10**12, "seconds": 0, "microseconds": 0}


def _rng_tensor_key(ck: Path, field: str) -> str:
    tree = json.loads((ck / "rng.json").read_text())
    node = tree
    for part in field.split("."):
        node = node[part]
    return node["key"]


def _shorten_rng(field: str) -> Callable[[Path], None]:
    def craft(ck: Path) -> None:
        key = _rng_tensor_key(ck, field)
        _tensors(ck / "rng.safetensors", lambda t: t.__setitem__(key, t[key][:100].clone()))

    return craft


def _rng_as_float(ck: Path) -> None:
    key = _rng_tensor_key(ck, "generators.shuffle")
    _tensors(ck / "rng.safetensors", lambda t: t.__setitem__(key, t[key].float()))


def _python_rng_short(ck: Path) -> None:
    _edit_json(ck / "rng.json", lambda t: t["python"]["items"].__setitem__(1, {"__glassrl__": "tuple", "items": [1]}))


def _weight_nan(ck: Path) -> None:
    _tensors(ck / "weights" / "model.safetensors", lambda t: t["w"].__setitem__(0, float("nan")))


# id -> (what is done to checkpoint step_00000002, the error line's pattern)
CRAFTED: dict[str, tuple[Callable[[Path], None], str]] = {
    "step-negative": (_set("counters", "step", -5), r"counters\.json: step = -5, but the checkpoint is step 2"),
    "step-1e20": (_set("counters", "step", 10**20), r"counters\.json: step: 1e\+20 is beyond a 64-bit integer"),
    "step-1.5": (_set("counters", "step", 1.5), r"counters\.json: step: 1\.5, expected a whole number"),
    "step-text": (_set("counters", "step", "2"), r"counters\.json: step: '2', expected a whole number"),
    "kl-nan": (_set("kl_controller", "value", NAN), r"kl_controller\.json: value: nan is not finite"),
    "kl-text": (_set("kl_controller", "value", "0.1"), r"kl_controller\.json: value: '0\.1', expected a number"),
    "nested-deep": (
        lambda ck: (ck / "counters.json").write_text("[" * 100_000 + "]" * 100_000),
        r"counters\.json: cannot be decoded \(nested too deep",
    ),
    "timedelta-overflow": (
        _set("counters", "since", TIMEDELTA),
        r"counters\.json: cannot be decoded \(a malformed encoded value \(OverflowError",
    ),
    "rng-wrong-size": (
        _shorten_rng("torch"),
        r"rng\.json: torch: a torch\.uint8 tensor of shape \(100,\), expected torch\.uint8 \(5056,\)",
    ),
    "generator-wrong-size": (_shorten_rng("generators.shuffle"), r"rng\.json: generators\.shuffle: .*\(100,\)"),
    "generator-wrong-dtype": (
        _rng_as_float,
        r"rng\.json: generators\.shuffle: a torch\.float32 tensor .*expected torch\.uint8",
    ),
    "python-rng-wrong-size": (_python_rng_short, r"rng\.json: python\[1\]: 1 items, expected 625"),
    "safetensors-huge-header": (
        lambda ck: _header(ck / "rng.safetensors", length=10**12),
        r"rng\.safetensors: cannot be decoded \(.*header too large",
    ),
    "safetensors-offsets-past-the-end": (
        lambda ck: _header(ck / "rng.safetensors", _first_tensor_offsets_past_the_end),
        r"rng\.safetensors: cannot be decoded \(.*offset",
    ),
    "weights-huge-header": (
        lambda ck: _header(ck / "weights" / "model.safetensors", length=10**12),
        r"weights/model\.safetensors: not a valid safetensors file \(.*header too large",
    ),
    "weights-nan": (_weight_nan, r"weights/model\.safetensors: tensor w holds non-finite values"),
    "weights-wrong-shape": (
        lambda ck: _tensors(ck / "weights" / "model.safetensors", lambda t: t.__setitem__("w", torch.ones(2))),
        r"checkpoint .*step_00000002: part weights does not fit this run \(RuntimeError",
    ),
}


class _Weights:
    """A model's weights as an "hf" part (a directory holding model.safetensors), copied in on load."""

    part_names = ("weights",)

    def __init__(self) -> None:
        self.w = torch.zeros(3)

    def save_pretrained(self, path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        save_file({"w": self.w}, str(Path(path) / "model.safetensors"))

    def state_dict(self) -> dict:
        return {"weights": ("hf", self)}

    def load_state_dict(self, parts: dict) -> None:
        self.w.copy_(load_file(str(Path(parts["weights"]) / "model.safetensors"))["w"])


def _components(step: int = 0) -> list:
    counters = state.Counters()
    counters.step = step
    return [
        _Weights(),
        counters,
        state.Threads(1, "a test"),
        state.Wrapped("kl_controller", "json", FixedKLController(0.1)),
        state.GlobalRNG({"shuffle": torch.Generator().manual_seed(3)}),
    ]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """The checkpoint root of a run that saved step 2 (weights, counters, threads, β, every RNG)."""
    root = tmp_path_factory.mktemp("saved") / "checkpoints"
    state.save(CheckpointManager(root, keep=2), 2, _components(step=2))
    return root


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_checkpoint_is_one_line_naming_the_file_and_field(case, saved, tmp_path):
    craft, match = CRAFTED[case]
    root = tmp_path / "checkpoints"
    shutil.copytree(saved, root)
    craft(root / "step_00000002")
    reseal(root / "step_00000002")
    manager = CheckpointManager(root, keep=2)
    with pytest.raises(GlassrlError, match=match) as caught:
        state.recorded_threads(manager)
        state.restore(manager, _components())
    assert "\n" not in str(caught.value)


def test_the_untouched_checkpoint_restores(saved, tmp_path):
    """The control: the same checkpoint resealed without a change restores, step and β as saved."""
    shutil.copytree(saved, tmp_path / "checkpoints")
    reseal(tmp_path / "checkpoints" / "step_00000002")
    components = _components()
    restored = state.restore(CheckpointManager(tmp_path / "checkpoints", keep=2), components)
    assert restored.step == 2 and components[3].obj.value == 0.1


def test_a_recorded_thread_count_below_one_is_refused(saved, tmp_path):
    root = tmp_path / "checkpoints"
    shutil.copytree(saved, root)
    _set("threads", "count", -3)(root / "step_00000002")
    reseal(root / "step_00000002")
    with pytest.raises(GlassrlError, match=r"threads\.json: count = -3: a thread count is at least 1"):
        state.recorded_threads(CheckpointManager(root, keep=2))


# ---------------------------------------------------------------- the sharded loader (a Ray role's state)


def _sharded_state(w: float = 1.0, lr: float = 0.1, last_epoch: int = 3) -> dict:
    return {
        "model": {"w": torch.full((3, 2), w)},
        "optim": {"param_groups": [{"lr": lr, "betas": (0.9, 0.99)}]},
        "scheduler": {"last_epoch": last_epoch},
    }


def _state_json(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    return lambda path: _edit_json(path / sharded.PLAIN, edit)


SHARDED: dict[str, tuple[Callable[[Path], None], str]] = {
    "lr-nan": (
        _state_json(lambda t: t["optim"]["param_groups"][0].__setitem__("lr", NAN)),
        r"state\.json: optim\.param_groups\[0\]\.lr: nan is not finite",
    ),
    "epoch-1.5": (
        _state_json(lambda t: t["scheduler"].__setitem__("last_epoch", 1.5)),
        r"state\.json: scheduler\.last_epoch: 1\.5, expected a whole number",
    ),
    "betas-a-list": (
        _state_json(lambda t: t["optim"]["param_groups"][0].__setitem__("betas", "x")),
        r"state\.json: optim\.param_groups\[0\]\.betas: 'x', expected a tuple",
    ),
    "nested-deep": (
        lambda path: (path / sharded.PLAIN).write_text("[" * 100_000 + "]" * 100_000),
        r"state\.json: cannot be decoded \(nested too deep",
    ),
    "timedelta-overflow": (
        _state_json(lambda t: t["scheduler"].__setitem__("since", TIMEDELTA)),
        r"state\.json: cannot be decoded \(a malformed encoded value \(OverflowError",
    ),
    "safetensors-huge-header": (
        lambda path: _header(next(path.glob("*.safetensors")), length=10**12),
        r"cannot be loaded \(.*header too large",
    ),
    "safetensors-offsets-past-the-end": (
        lambda path: _header(next(path.glob("*.safetensors")), _first_tensor_offsets_past_the_end),
        r"cannot be loaded \(.*offset",
    ),
}


@pytest.fixture(scope="module")
def sharded_saved(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sharded") / "actor_state"
    with pytest.warns(UserWarning):  # DCP's "no process group: one process" warning
        sharded.save(_sharded_state(), path, main=True)
    return path


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("case", sorted(SHARDED))
def test_a_crafted_sharded_state_is_one_line(case, sharded_saved, tmp_path):
    craft, match = SHARDED[case]
    path = tmp_path / "actor_state"
    shutil.copytree(sharded_saved, path)
    craft(path)
    with pytest.raises(GlassrlError, match=match) as caught:
        sharded.load(_sharded_state(w=0.0, lr=0.5, last_epoch=0), path)
    assert "\n" not in str(caught.value)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_untouched_sharded_state_loads(sharded_saved):
    loaded = sharded.load(_sharded_state(w=0.0, lr=0.5, last_epoch=0), sharded_saved)
    assert loaded["optim"]["param_groups"][0]["lr"] == 0.1 and loaded["scheduler"]["last_epoch"] == 3
    assert torch.equal(loaded["model"]["w"], torch.ones(3, 2))


# ---------------------------------------------------------------- end to end: glassrl train --resume


@pytest.fixture(scope="module")
def run(tiny_model_dir, prompt_files, tmp_path_factory) -> tuple[Path, list[str]]:
    """A PPO run of 2 steps with a checkpoint each step, and the overrides that resume it."""
    from glassrl.cli import main

    out = tmp_path_factory.mktemp("run") / "run"
    overrides = [*tiny_run_overrides(tiny_model_dir, prompt_files, out), "logging.checkpoint_every=1"]
    overrides.append("logging.report=false")
    assert main(["train", str(EXAMPLES / "ppo.yaml"), *overrides]) == 0
    return out, overrides


@pytest.mark.slow
@pytest.mark.parametrize("case", ["step-negative", "step-1e20", "kl-nan", "rng-wrong-size", "weights-wrong-shape"])
def test_train_resume_of_a_crafted_checkpoint_is_one_line(case, run, capsys, tmp_path):
    """The same refusals through the command, on a real run's checkpoint (its actor is an "hf" part)."""
    out, overrides = run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    checkpoint = copy / "checkpoints" / "step_00000002"
    if case == "weights-wrong-shape":
        file = checkpoint / "actor" / "model.safetensors"
        _tensors(file, lambda t: t.__setitem__("model.embed_tokens.weight", t["model.embed_tokens.weight"][:1]))
        match = r"part actor, actor_optim does not fit this run \(RuntimeError: the saved weights' shapes"
    else:
        craft, match = CRAFTED[case]
        craft(checkpoint)
    reseal(checkpoint)
    metrics = (copy / "metrics.jsonl").read_bytes()
    argv = ["train", EXAMPLES / "ppo.yaml", *overrides, f"output_dir={copy}", "steps=3", "--resume"]
    assert_one_error_line(capsys, argv, match)
    assert (copy / "metrics.jsonl").read_bytes() == metrics  # no row rewritten
    assert not (copy / "checkpoints" / "step_00000003").exists()


@pytest.mark.slow
def test_resuming_a_copy_resumes_the_copy_and_says_so(run, capsys, tmp_path):
    """``glassrl train COPY/config.yaml --resume`` followed the absolute output_dir inside the copied
    config.yaml and appended to the ORIGINAL run (issue 37, item 8). The run resumed is the one the
    config lies in; a line names both; the original is left as it was."""
    from harness import run_cli

    out, _ = run
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    rc, stdout, err = run_cli(capsys, "train", copy / "config.yaml", "--resume", "steps=3")
    assert rc == 0, err
    assert f"lies in the run directory {copy}, whose output_dir names {out}; resuming {copy}" in " ".join(
        stdout.split()
    )
    assert (copy / "checkpoints" / "step_00000003").is_dir()
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    (record,) = [json.loads(line) for line in (copy / "resumes.jsonl").read_text().splitlines()]
    assert record["changed"]["output_dir"] == [str(out), str(copy)]
