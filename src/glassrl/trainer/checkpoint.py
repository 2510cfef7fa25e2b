"""Atomic, verified checkpoints: a manifest, a ``latest`` pointer, pruning.

    manager = CheckpointManager(run_dir / "checkpoints", keep=2)
    manager.save(step, {"actor": Part("hf", actor), "actor_optimizer": Part("torch", opt.state_dict()),
                        "trainer": Part("json", {"step": step})})
    path = manager.latest()                       # None before the first save
    parts = manager.load(path, required={"actor", "actor_optimizer", "trainer"})

On disk (``root``)::

    step_00000010/        one complete checkpoint: a file or directory per part + manifest.json
    step_00000020/
    latest                the name of the newest complete checkpoint ("step_00000020")
    tmp-…/                a save in progress (or one killed mid-way): never loaded, removed by the next save

Protocol of :meth:`CheckpointManager.save` (what makes it crash-safe):
1. every part is written into ``tmp-step_XXXXXXXX-<random>/`` and each file is fsynced;
2. ``manifest.json`` (step, parts, each file's size and sha256, glassrl version, time)
   is written LAST, so a directory with a manifest has all its files;
3. the directory is renamed to ``step_XXXXXXXX`` (rename(2) of a directory is atomic)
   and ``root`` is fsynced so the rename survives a power loss;
4. ``latest`` is replaced (temp file + os.replace + fsync): it only ever names a
   complete checkpoint;
5. only then are older checkpoints beyond ``keep`` and stale ``tmp-*`` directories deleted.

The fsync-then-rename sequence is the one recommended for crash-safe file replacement
(Pillai et al. 2014, "All File Systems Are Not Created Equal", OSDI, §2 and §5).

Part kinds (:class:`Part`):
- ``"safetensors"``: dict[str, Tensor] → ``NAME.safetensors`` (loaded back on CPU);
- ``"hf"``: an object with ``save_pretrained(dir)`` (a Hugging Face model, the critic
  with its value head, a tokenizer) → directory ``NAME/``; :meth:`load` returns that
  directory's Path for the caller to ``from_pretrained``;
- ``"torch"``: picklable state (optimiser / scheduler state_dicts, RNG states) →
  ``NAME.pt`` via torch.save, read back with ``weights_only=True`` (plus numpy arrays,
  for ``np.random.get_state()``) so a checkpoint cannot run code when loaded;
- ``"json"``: a JSON-able object (counters, data position, controller state) → ``NAME.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import glassrl
from glassrl.errors import GlassrlError

PartKind = Literal["json", "torch", "safetensors", "hf"]
MANIFEST = "manifest.json"
LATEST = "latest"
MANIFEST_FORMAT = 1
_STEP_DIR = re.compile(r"^step_(\d{8})$")
_PART_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")  # no '.': "a" (json) → a.json cannot clash
_HASH_CHUNK = 1 << 20


class Part(NamedTuple):
    """One piece of a checkpoint: how to store it (``kind``) and what (``value``)."""

    kind: PartKind
    value: object


def step_dir_name(step: int) -> str:
    """``step_XXXXXXXX``: eight digits, so names sort in step order."""
    return f"step_{step:08d}"


class CheckpointManager:
    """Checkpoints of one run under ``root``; the newest ``keep`` complete ones are kept."""

    def __init__(self, root: Path, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep

    def save(self, step: int, parts: dict[str, Part]) -> Path:
        """Write ``parts`` as checkpoint ``step`` by the protocol of the module docstring.

        Returns the checkpoint directory ``root/step_XXXXXXXX``. Saving a step that
        already exists (left by a run killed before ``latest`` moved) replaces it.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if not parts:
            raise ValueError("a checkpoint needs at least one part")
        self.root.mkdir(parents=True, exist_ok=True)
        name = step_dir_name(step)
        tmp = self.root / f"tmp-{name}-{secrets.token_hex(4)}"
        tmp.mkdir()
        entries = {}
        for part_name, part in parts.items():
            entries[part_name] = self._write_part(tmp, part_name, Part(*part))
        manifest = {
            "format": MANIFEST_FORMAT,
            "step": step,
            "glassrl_version": glassrl.__version__,
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "parts": entries,
        }
        _write_durably(tmp / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
        _fsync(tmp)
        final = self.root / name
        if final.exists():
            # Usually an orphan of a run killed before `latest` moved. rename(2) cannot replace
            # a non-empty directory, so it goes aside first (removed below with the tmp-*). If
            # `latest` names this very step, a kill between the two renames leaves it dangling,
            # and latest() then raises naming it rather than loading anything.
            os.rename(final, self.root / f"tmp-replaced-{name}-{secrets.token_hex(4)}")
        os.rename(tmp, final)
        _fsync(self.root)
        _write_durably(self.root / f"{LATEST}.tmp-{secrets.token_hex(4)}", (name + "\n").encode(), self.root / LATEST)
        self._prune(step)
        self._remove_stale_tmp()
        return final

    def latest(self) -> Path | None:
        """The checkpoint ``latest`` names; None when nothing was ever saved.

        Raises GlassrlError when the pointer names a directory that is missing or has
        no manifest (never returns an incomplete checkpoint).
        """
        pointer = self.root / LATEST
        if not pointer.is_file():
            return None
        name = pointer.read_text(encoding="utf-8").strip()
        path = self.root / name
        if not _STEP_DIR.match(name) or not (path / MANIFEST).is_file():
            raise GlassrlError(f"{pointer}: names {name!r}, which is not a complete checkpoint (no {path / MANIFEST})")
        return path

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints (those with a manifest) under ``root``, oldest first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if _STEP_DIR.match(p.name) and (p / MANIFEST).is_file()]
        return sorted(found, key=lambda p: p.name)

    def load(self, path: Path, required: set[str]) -> dict[str, object]:
        """Verify checkpoint ``path`` and return its parts by name.

        Checks the manifest, every file's size and sha256 (a truncated or corrupt file →
        GlassrlError naming it) and that the parts are exactly ``required`` (a missing
        or an unexpected part → GlassrlError naming it). Values: json → the object,
        torch → the unpickled state, safetensors → dict[str, Tensor] on CPU,
        hf → the part's directory (a Path).
        """
        path = Path(path)
        manifest = read_manifest(path)
        present = set(manifest["parts"])
        missing, extra = sorted(required - present), sorted(present - required)
        if missing:
            raise GlassrlError(
                f"checkpoint {path.name} has no part {', '.join(map(repr, missing))} (it has: {', '.join(sorted(present))})"
            )
        if extra:
            raise GlassrlError(
                f"checkpoint {path.name} has unexpected part {', '.join(map(repr, extra))} "
                f"(expected: {', '.join(sorted(required))})"
            )
        for entry in manifest["parts"].values():
            for file in entry["files"]:
                _verify_file(path, file)
        return {part_name: _READERS[entry["kind"]](path, part_name) for part_name, entry in manifest["parts"].items()}

    def _write_part(self, directory: Path, name: str, part: Part) -> dict:
        if not _PART_NAME.match(name) or name == "manifest":
            raise ValueError(f"invalid checkpoint part name {name!r}: use letters, digits, '_', '-' (not 'manifest')")
        if part.kind not in _WRITERS:
            raise ValueError(f"unknown checkpoint part kind {part.kind!r} for {name!r}; valid: {', '.join(_WRITERS)}")
        _WRITERS[part.kind](directory, name, part.value)
        written = directory / _part_path(part.kind, name)
        files = sorted(p for p in written.rglob("*") if p.is_file()) if written.is_dir() else [written]
        for sub in {f.parent for f in files}:
            _fsync(sub)
        return {"kind": part.kind, "files": [_describe_file(directory, f) for f in files]}

    def _prune(self, latest_step: int) -> None:
        """Delete complete checkpoints older than the newest ``keep`` up to ``latest_step``.

        Each is renamed to ``tmp-*`` first, so one half-deleted by a crash is never
        taken for a complete checkpoint.
        """
        older = [p for p in self.checkpoints() if int(_STEP_DIR.match(p.name)[1]) <= latest_step]
        for path in older[: max(0, len(older) - self.keep)]:
            doomed = self.root / f"tmp-pruned-{path.name}-{secrets.token_hex(4)}"
            os.rename(path, doomed)
            shutil.rmtree(doomed)

    def _remove_stale_tmp(self) -> None:
        for path in self.root.iterdir():
            if path.is_dir() and path.name.startswith("tmp-"):
                shutil.rmtree(path)
            elif path.is_file() and path.name.startswith(f"{LATEST}.tmp-"):
                path.unlink()


def read_manifest(path: Path) -> dict:
    """The parsed ``manifest.json`` of checkpoint ``path`` (GlassrlError when missing or malformed)."""
    file = Path(path) / MANIFEST
    if not file.is_file():
        raise GlassrlError(f"{path}: not a complete checkpoint (no {MANIFEST})")
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise GlassrlError(f"{file}: unreadable manifest ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT or "parts" not in manifest:
        raise GlassrlError(f"{file}: not a glassrl checkpoint manifest (format {MANIFEST_FORMAT})")
    named = _STEP_DIR.match(Path(path).name)
    if named and manifest.get("step") != int(named[1]):
        raise GlassrlError(f"{file}: records step {manifest.get('step')}, but the directory is {Path(path).name}")
    for part_name, entry in manifest["parts"].items():
        if entry.get("kind") not in _READERS:
            raise GlassrlError(f"{file}: part {part_name!r} has unknown kind {entry.get('kind')!r}")
    return manifest


def _part_path(kind: str, name: str) -> str:
    return {"json": f"{name}.json", "torch": f"{name}.pt", "safetensors": f"{name}.safetensors", "hf": name}[kind]


def _write_json(directory: Path, name: str, value: object) -> None:
    _write_durably(directory / _part_path("json", name), (json.dumps(value, indent=1) + "\n").encode())


def _write_torch(directory: Path, name: str, value: object) -> None:
    path = directory / _part_path("torch", name)
    torch.save(value, path)
    _fsync(path)


def _write_safetensors(directory: Path, name: str, value: object) -> None:
    if not isinstance(value, dict) or not all(isinstance(v, torch.Tensor) for v in value.values()):
        raise TypeError(f"checkpoint part {name!r} of kind 'safetensors' must be a dict[str, Tensor]")
    tensors, seen = {}, set()
    for key, tensor in value.items():
        tensor = tensor.detach().cpu().contiguous()
        # safetensors refuses tensors that share storage (tied weights, views): copy those.
        ptr = tensor.untyped_storage().data_ptr()
        tensors[key] = tensor.clone() if ptr in seen else tensor
        seen.add(ptr)
    path = directory / _part_path("safetensors", name)
    save_file(tensors, str(path))
    _fsync(path)


def _write_hf(directory: Path, name: str, value: object) -> None:
    if not hasattr(value, "save_pretrained"):
        raise TypeError(
            f"checkpoint part {name!r} of kind 'hf' needs a save_pretrained method, got {type(value).__name__}"
        )
    target = directory / _part_path("hf", name)
    value.save_pretrained(target)
    for file in target.rglob("*"):
        if file.is_file():
            _fsync(file)


def _read_json(path: Path, name: str) -> object:
    return json.loads((path / _part_path("json", name)).read_text(encoding="utf-8"))


def _numpy_globals() -> list:
    """What torch's weights-only unpickler needs for numpy arrays (np.random.get_state())."""
    core = np._core if hasattr(np, "_core") else np.core  # numpy 2 renamed numpy.core
    return [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype] + [
        getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType")
    ]


def _read_torch(path: Path, name: str) -> object:
    with torch.serialization.safe_globals(_numpy_globals()):
        return torch.load(path / _part_path("torch", name), map_location="cpu", weights_only=True)


def _read_safetensors(path: Path, name: str) -> object:
    return load_file(str(path / _part_path("safetensors", name)), device="cpu")


def _read_hf(path: Path, name: str) -> object:
    return path / _part_path("hf", name)


_WRITERS: dict[str, Callable[[Path, str, object], None]] = {
    "json": _write_json,
    "torch": _write_torch,
    "safetensors": _write_safetensors,
    "hf": _write_hf,
}
_READERS: dict[str, Callable[[Path, str], object]] = {
    "json": _read_json,
    "torch": _read_torch,
    "safetensors": _read_safetensors,
    "hf": _read_hf,
}


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _describe_file(directory: Path, file: Path) -> dict:
    return {"path": file.relative_to(directory).as_posix(), "size": file.stat().st_size, "sha256": _sha256(file)}


def _verify_file(checkpoint: Path, entry: dict) -> None:
    file = checkpoint / entry["path"]
    if not file.is_file():
        raise GlassrlError(f"checkpoint {checkpoint.name}: file {entry['path']} is missing")
    size = file.stat().st_size
    if size != entry["size"]:
        raise GlassrlError(
            f"checkpoint {checkpoint.name}: file {entry['path']} has {size} bytes, the manifest says "
            f"{entry['size']} (truncated or replaced)"
        )
    if _sha256(file) != entry["sha256"]:
        raise GlassrlError(
            f"checkpoint {checkpoint.name}: file {entry['path']} is corrupt (sha256 differs from the manifest)"
        )


def _fsync(path: Path) -> None:
    """fsync(2) a file (its data) or a directory (its entries: new names, renames)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(tmp: Path, data: bytes, final: Path | None = None) -> None:
    """Write ``data`` to ``tmp`` and fsync it; with ``final``, atomically rename it there and fsync the directory."""
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if final is not None:
        os.replace(tmp, final)
        _fsync(final.parent)
