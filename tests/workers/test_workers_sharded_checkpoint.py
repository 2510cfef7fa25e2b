"""A data-parallel role's sharded checkpoint part runs no code when loaded (issue 32, item 1).

A Ray run's ``<role>_state`` part was torch DCP's own format: its ``.metadata`` read with
``pickle.load``, its non-tensor values with ``torch.load(weights_only=False)``. Anyone who hands
over a run directory could put a pickle there whose ``__reduce__`` calls ``os.system``, fix the
manifest's sizes and sha256s, and the command ran on ``--resume``. Now the part is safetensors
and JSON (glassrl.run.sharded); a part in DCP's old format, written by an earlier glassrl, is
still read (an old run resumes) by an unpickler that builds only DCP's metadata classes, with
its values loaded ``weights_only=True``: the crafted payloads below are each one GlassrlError
line, and their marker file never appears.

2 FSDP2 ranks (torch.multiprocessing spawn, gloo, CPU) on the tiny model, one update so that
AdamW has state; one spawn saves (the new format through CheckpointManager, as the Ray trainee
does, and DCP's old format beside it), one spawn loads every variant into fresh replicas.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch
from dp_cases import actor_batch, dp_kwargs, optimizer_for, plan_for
from spawned import spawn_ranks

from glassrl.run.checkpoint import MANIFEST, CheckpointManager, Part

WORLD = 2
PART = "actor_state"


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().clone()


def _rank(rank: int, world: int, port: int, model_dir: str, out: str, action: str, paths: list[str]) -> None:
    torch.set_num_threads(1)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from glassrl.errors import GlassrlError
    from glassrl.models.loading import load_causal_lm
    from glassrl.rl.update import run_updates
    from glassrl.workers.data_parallel import DataParallelModel, _dcp_state, init_group, load_sharded, save_sharded
    from glassrl.workers.sharding import shard_plan

    ctx = init_group("actor", rank, world, "127.0.0.1", port, "cpu")

    def replica():
        dp = DataParallelModel(load_causal_lm(model_dir, dtype="float32", device="cpu"), ctx, fsdp=True)
        return (dp, *optimizer_for(dp.module))

    def state(dp, optimizer, scheduler) -> dict:
        full = get_model_state_dict(dp.wrapped, options=StateDictOptions(full_state_dict=True))
        optim = {k: {n: _full(t) for n, t in v.items()} for k, v in optimizer.state_dict()["state"].items()}
        return {
            "weights": {k: v.detach().clone() for k, v in full.items()},
            "optim": optim,
            "sched": scheduler.state_dict(),
        }

    results: dict = {}
    if action == "save":
        dp, optimizer, scheduler = replica()
        batch, plan = shard_plan(actor_batch(Path(model_dir)), plan_for(8), world)[rank]
        run_updates(dp.module, optimizer, scheduler, batch, plan, **dp_kwargs(dp))
        new, old = paths
        save_sharded(dp, optimizer, scheduler, new)
        dcp.save(_dcp_state(dp, optimizer, scheduler), checkpoint_id=old)  # what glassrl wrote before
        results["saved"] = state(dp, optimizer, scheduler)
    else:
        for path in paths:
            dp, optimizer, scheduler = replica()
            try:
                load_sharded(dp, optimizer, scheduler, path)
            except GlassrlError as err:
                results[path] = str(err)
            except BaseException as err:  # noqa: BLE001 - DCP raises CheckpointException, a BaseException
                results[path] = f"{type(err).__name__}: {err}"
            else:
                results[path] = state(dp, optimizer, scheduler)
    torch.save(results, Path(out) / f"{action}{rank}.pt")
    torch.distributed.destroy_process_group()


def _spawn(model_dir: Path, out: Path, action: str, paths: list[Path], world: int = WORLD) -> list[dict]:
    from glassrl.workers.data_parallel import free_port

    out.mkdir(parents=True, exist_ok=True)
    spawn_ranks(_rank, (world, free_port(), str(model_dir), str(out), action, [str(p) for p in paths]), world, out)
    return [torch.load(out / f"{action}{r}.pt", weights_only=False) for r in range(world)]


class _SaveOnRanks:
    """A part of kind "hf" whose ``save_pretrained`` is the ranks' collective save (as the Ray trainee's)."""

    def __init__(self, model_dir: Path, out: Path) -> None:
        self.model_dir, self.out, self.ranks = model_dir, out, None

    def save_pretrained(self, path) -> None:
        self.ranks = _spawn(self.model_dir, self.out, "save", [Path(path), self.out / "old"])


def _reseal(checkpoint: Path, part: str = PART) -> None:
    """The manifest made to match the part's files again, as anyone handing over a run directory can."""
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    files = sorted(f for f in (checkpoint / part).rglob("*") if f.is_file())
    manifest["parts"][part]["files"] = [
        {
            "path": str(f.relative_to(checkpoint)),
            "size": f.stat().st_size,
            "sha256": hashlib.sha256(f.read_bytes()).hexdigest(),
        }
        for f in files
    ]
    (checkpoint / MANIFEST).write_text(json.dumps(manifest, indent=2))


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _variant(saved: Path, root: Path, name: str, part_from: Path | None = None) -> Path:
    """A copy of checkpoint ``saved`` under ``root/name`` (its part replaced by ``part_from``'s files)."""
    copy = root / f"checkpoints-{name}" / saved.name
    shutil.copytree(saved, copy)
    if part_from is not None:
        shutil.rmtree(copy / PART)
        shutil.copytree(part_from, copy / PART)
        _reseal(copy)
    return copy


def _crafted_values(old: Path, marker: Path) -> None:
    """DCP's old format whose metadata (only DCP's own classes) sends a pickled value to a payload."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    with open(old / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # noqa: S301 - the test's own checkpoint, written by torch a moment ago
    payload = pickle.dumps(_RunsCode(marker), protocol=2)  # torch.load(weights_only=False) reads it
    (old / "__9_0.distcp").write_bytes(payload)
    values = [k for k, v in metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)]
    assert values, "the old format pickles the optimiser's hyper-parameters and the schedule"
    for index in list(metadata.storage_data):
        if index.fqn in values:
            metadata.storage_data[index] = _StorageInfo("__9_0.distcp", 0, len(payload))
    with open(old / ".metadata", "wb") as f:
        pickle.dump(metadata, f)


@pytest.fixture(scope="module")
def sharded(tiny_model_dir, tmp_path_factory):
    """(what each rank saved, the checkpoint, what each rank loaded from each variant, each payload's marker)."""
    root = tmp_path_factory.mktemp("sharded")
    marker = {name: root / f"code-ran-{name}" for name in ("crafted-metadata", "crafted-values")}
    saver = _SaveOnRanks(tiny_model_dir, root / "save")
    checkpoint = CheckpointManager(root / "checkpoints", keep=1).save(1, {PART: Part("hf", saver)})

    old = root / "save" / "old"
    crafted_metadata = (
        root / "parts" / "crafted-metadata"
    )  # the probe: .metadata replaced by a pickle that runs code
    shutil.copytree(checkpoint / PART, crafted_metadata)
    (crafted_metadata / "state.json").unlink(missing_ok=True)
    (crafted_metadata / ".metadata").write_bytes(pickle.dumps(_RunsCode(marker["crafted-metadata"])))
    crafted_values = root / "parts" / "crafted-values"
    shutil.copytree(old, crafted_values)
    _crafted_values(crafted_values, marker["crafted-values"])
    variants = {
        "new": _variant(checkpoint, root, "new"),
        "old": _variant(checkpoint, root, "old", old),
        "crafted-metadata": _variant(checkpoint, root, "crafted-metadata", crafted_metadata),
        "crafted-values": _variant(checkpoint, root, "crafted-values", crafted_values),
    }
    # Each passes the manifest's check, as a resume reads it; then the ranks load them all.
    parts = {
        name: CheckpointManager(path.parent, keep=1).load(path, required={PART})[PART]
        for name, path in variants.items()
    }
    loaded = _spawn(tiny_model_dir, root / "load", "load", list(parts.values()))
    by_variant = [{name: rank[str(part)] for name, part in parts.items()} for rank in loaded]
    (alone,) = _spawn(tiny_model_dir, root / "load-1", "load", [parts["new"], parts["old"]], world=1)
    for name in ("new", "old"):  # another world size: one rank reads both ranks' shards
        by_variant[0][f"{name}-on-1-rank"] = alone[str(parts[name])]
    return [rank["saved"] for rank in saver.ranks], checkpoint, by_variant, marker


def _same(a: dict, b: dict) -> None:
    assert a["weights"].keys() == b["weights"].keys()
    for key, value in a["weights"].items():
        assert torch.equal(b["weights"][key], value), key
    assert a["optim"].keys() == b["optim"].keys() and a["optim"]
    for param, state in a["optim"].items():
        assert state.keys() == b["optim"][param].keys()
        for name, tensor in state.items():
            assert torch.equal(b["optim"][param][name], tensor), (param, name)
    assert a["sched"] == b["sched"]


def test_the_sharded_part_is_safetensors_and_json(sharded):
    _, checkpoint, _, _ = sharded
    names = sorted(f.name for f in (checkpoint / PART).iterdir())
    assert names[-1] == "state.json" and len(names) == WORLD + 1, names
    assert all(n.endswith(".safetensors") for n in names[:-1]), names  # each rank its shards
    json.loads((checkpoint / PART / "state.json").read_text())


@pytest.mark.parametrize("variant", ["new", "old", "new-on-1-rank", "old-on-1-rank"])
def test_a_sharded_part_loads_back_exactly(sharded, variant):
    """The new format, and DCP's old one (a run written by an earlier glassrl resumes); by the 2 ranks
    that saved it, and by 1 (the full tensors compared)."""
    saved, _, loaded, _ = sharded
    for rank_saved, rank_loaded in zip(saved, loaded):
        if variant in rank_loaded:
            assert not isinstance(rank_loaded[variant], str), rank_loaded[variant]
            _same(rank_saved, rank_loaded[variant])


@pytest.mark.parametrize(
    ("variant", "match"),
    [
        ("crafted-metadata", r"refused to load: posix\.system is not part of a checkpoint's metadata"),
        ("crafted-values", r"refused to load: the value of \S+ holds posix\.system, which is not plain data"),
    ],
)
def test_a_crafted_pickle_runs_no_code(sharded, variant, match):
    _, _, loaded, marker = sharded
    assert not marker[variant].exists(), "a pickle in the checkpoint ran a command"
    for rank in loaded:
        error = rank[variant]
        assert isinstance(error, str), "a crafted checkpoint loaded"
        assert "\n" not in error and PART in error
        assert re.search(match, error), error
