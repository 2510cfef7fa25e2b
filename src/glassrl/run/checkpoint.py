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
   and read back: a part that does not decode to what was given is an error (never a
   checkpoint that cannot be resumed);
2. ``manifest.json`` (step, parts, each file's size and sha256, whether every floating
   tensor is finite, glassrl version, time) is written LAST, so a directory with a
   manifest has all its files;
3. the directory is renamed to ``step_XXXXXXXX`` (rename(2) of a directory is atomic)
   and ``root`` is fsynced so the rename survives a power loss;
4. ``latest`` is replaced (temp file + os.replace + fsync): it only ever names a
   complete checkpoint;
5. only then are older checkpoints beyond ``keep`` and stale ``tmp-*`` directories deleted,
   except the newest checkpoint whose tensors are all finite: the last good one survives
   pruning whatever came after it.

A write that fails (a full disk: ENOSPC, from Python or from safetensors) removes the ``tmp-*``
directory and is one GlassrlError line naming the directory, the space a checkpoint takes and the
space free; ``latest`` still names the previous checkpoint. :meth:`CheckpointManager.find_latest`
falls back, when ``latest`` is missing or names nothing complete, to the newest checkpoint
whose files match its manifest, and says so.

The fsync-then-rename sequence is the one recommended for crash-safe file replacement
(Pillai et al. 2014, "All File Systems Are Not Created Equal", OSDI, §2 and §5; glassrl.run.atomic).

Part kinds (:class:`Part`):
- ``"safetensors"``: dict[str, Tensor] → ``NAME.safetensors`` (loaded back on CPU);
- ``"hf"``: an object with ``save_pretrained(dir)`` (a Hugging Face model, the critic
  with its value head, a tokenizer) → directory ``NAME/``; :meth:`load` returns that
  directory's Path for the caller to ``from_pretrained``;
- ``"torch"``: torch state (optimiser / scheduler state_dicts, RNG states, buffers of
  rollouts) → ``NAME.json`` (the tree) + ``NAME.safetensors`` (its tensors), encoded by
  :mod:`glassrl.run.codec`: nothing is pickled, so a checkpoint cannot run code when
  loaded, and a date, a set or a non-finite float reads back as itself;
- ``"json"``: plain data (counters, data position, controller state, the resolved config)
  → ``NAME.json``, the same encoding without tensors.
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

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

import glassrl
from glassrl.errors import GlassrlError
from glassrl.files import DISK_FULL
from glassrl.run import codec, stop
from glassrl.run.atomic import disk_errors, fsync, safetensors_os_errors, write_durably

PartKind = Literal["json", "torch", "safetensors", "hf"]
MANIFEST = "manifest.json"
LATEST = "latest"
MANIFEST_FORMAT = 2  # 2: torch parts as JSON + safetensors (codec), not pickles; a finite flag
_STEP_DIR = re.compile(r"^step_(\d{8})$")
_PART_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")  # no '.': "a" (json) → a.json cannot clash
_HASH_CHUNK = 1 << 20


class Part(NamedTuple):
    """One piece of a checkpoint: how to store it (``kind``) and what (``value``)."""

    kind: PartKind
    value: object


class Latest(NamedTuple):
    """The checkpoint to resume from, and why when it is not the one ``latest`` names."""

    path: Path | None
    note: str | None = None


def step_dir_name(step: int) -> str:
    """``step_XXXXXXXX``: eight digits, so names sort in step order."""
    return f"step_{step:08d}"


class CheckpointManager:
    """Checkpoints of one run under ``root``; the newest ``keep`` complete ones are kept
    (and the newest finite one, when those are not)."""

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
        name = step_dir_name(step)
        with disk_errors(f"checkpoint {name}", self.root):
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f"tmp-{name}-{secrets.token_hex(4)}"
            tmp.mkdir()
            try:
                with safetensors_os_errors():
                    entries = {
                        part_name: self._write_part(tmp, part_name, Part(*part)) for part_name, part in parts.items()
                    }
                manifest = {
                    "format": MANIFEST_FORMAT,
                    "step": step,
                    "glassrl_version": glassrl.__version__,
                    "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "finite": all(entry.pop("finite") for entry in entries.values()),
                    "parts": entries,
                }
                write_durably(tmp / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
                fsync(tmp)
            except (Exception, stop.Interrupted) as err:  # a full disk, a bad value, a stop: free what it took
                written = _bytes_under(tmp)
                shutil.rmtree(tmp, ignore_errors=True)
                if isinstance(err, OSError) and err.errno in DISK_FULL:
                    raise GlassrlError(
                        f"checkpoint {name}: cannot write under {self.root}: {err.strerror}; {self._room(written)}"
                    ) from None
                raise
            final = self.root / name
            if final.exists():
                # Usually an orphan of a run killed before `latest` moved. rename(2) cannot replace
                # a non-empty directory, so it goes aside first (removed below with the tmp-*). If
                # `latest` names this very step, a kill between the two renames leaves it dangling,
                # and find_latest() then falls back to the newest checkpoint that verifies.
                os.rename(final, self.root / f"tmp-replaced-{name}-{secrets.token_hex(4)}")
            os.rename(tmp, final)
            fsync(self.root)
            pointer = self.root / f"{LATEST}.tmp-{secrets.token_hex(4)}"
            write_durably(pointer, (name + "\n").encode(), self.root / LATEST)
        self._prune(step)
        self._remove_stale_tmp()
        return final

    def _room(self, written: int) -> str:
        """What a checkpoint takes (the last one's size; else what this one wrote before the disk was
        full) and what is free under ``root``, for the message of a full disk."""
        last = self.find_latest().path if self.checkpoints() else None
        if last is not None:
            size = sum(f["size"] for entry in read_manifest(last)["parts"].values() for f in entry["files"])
            takes = f"a checkpoint takes about {_size(size)} ({last.name} does)"
        else:
            takes = f"a checkpoint takes more than the {_size(written)} written before the disk was full"
        stat = os.statvfs(self.root)
        return f"{takes}, {_size(stat.f_bavail * stat.f_frsize)} is free there"

    def latest(self) -> Path | None:
        """The checkpoint to resume from (:meth:`find_latest`), without the note."""
        return self.find_latest().path

    def find_latest(self) -> Latest:
        """The checkpoint ``latest`` names; None when nothing was ever saved.

        When ``latest`` is missing or names a directory that is not a complete checkpoint
        (deleted by hand, or a kill between two renames), the newest checkpoint whose files
        match its manifest is taken instead, with a note saying so. GlassrlError when the
        pointer names nothing complete and no checkpoint verifies; never an incomplete one.
        """
        pointer = self.root / LATEST
        problem = None
        if pointer.is_file():
            name = pointer.read_text(encoding="utf-8", errors="replace").strip()
            path = self.root / name
            if _STEP_DIR.match(name) and (path / MANIFEST).is_file():
                return Latest(path)
            problem = f"{pointer} names {name!r}, which is not a complete checkpoint (no {path / MANIFEST})"
        elif not self.checkpoints():
            return Latest(None)
        for path in reversed(self.checkpoints()):
            try:
                verify(path)
            except GlassrlError:
                continue
            why = problem or f"{pointer} is missing"
            return Latest(path, f"{why}; resuming from {path.name}, the newest checkpoint whose files verify")
        raise GlassrlError(
            (problem or f"{pointer} is missing") + f", and no checkpoint in {self.root} verifies (see its manifests)"
        )

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
        or an unexpected part → GlassrlError naming it). Values: json and torch → the
        decoded object (tensors on CPU), safetensors → dict[str, Tensor] on CPU,
        hf → the part's directory (a Path).
        """
        path = Path(path)
        manifest = read_manifest(path)
        present = set(manifest["parts"])
        missing, extra = sorted(required - present), sorted(present - required)
        if missing:
            raise GlassrlError(
                f"checkpoint {path.name} has no part {', '.join(map(repr, missing))} "
                f"(it has: {', '.join(sorted(present))})"
            )
        if extra:
            raise GlassrlError(
                f"checkpoint {path.name} has unexpected part {', '.join(map(repr, extra))} "
                f"(expected: {', '.join(sorted(required))})"
            )
        verify(path, manifest)
        return {part_name: _read_part(path, part_name, entry) for part_name, entry in manifest["parts"].items()}

    def load_part(self, path: Path, name: str) -> object | None:
        """One part of checkpoint ``path``, its files verified and decoded as :meth:`load` does; None
        when the checkpoint has no part ``name``. For what a run must know before it loads the rest
        (the thread count it recorded: glassrl.run.state.recorded_threads)."""
        path = Path(path)
        entry = read_manifest(path)["parts"].get(name)
        if entry is None:
            return None
        for file in entry["files"]:
            _verify_file(path, file)
        return _read_part(path, name, entry)

    def _write_part(self, directory: Path, name: str, part: Part) -> dict:
        """Write one part, read it back, compare; its manifest entry (with "finite", popped by save)."""
        if not _PART_NAME.match(name) or name == "manifest":
            raise ValueError(f"invalid checkpoint part name {name!r}: use letters, digits, '_', '-' (not 'manifest')")
        if part.kind not in _WRITERS:
            raise ValueError(f"unknown checkpoint part kind {part.kind!r} for {name!r}; valid: {', '.join(_WRITERS)}")
        try:
            files = _WRITERS[part.kind](directory, name, part.value)
        except TypeError as err:
            if part.kind not in ("json", "torch"):
                raise
            raise GlassrlError(f"checkpoint part {name!r}: {err}") from None
        for file in files:
            fsync(file)
        for sub in {f.parent for f in files}:
            fsync(sub)
        return {
            "kind": part.kind,
            "files": [_describe_file(directory, f) for f in sorted(files)],
            "finite": _read_back(directory, name, part),
        }

    def _prune(self, latest_step: int) -> None:
        """Delete complete checkpoints older than the newest ``keep`` up to ``latest_step``,
        sparing the newest one whose tensors are all finite.

        Each is renamed to ``tmp-*`` first, so one half-deleted by a crash is never
        taken for a complete checkpoint.
        """
        older = [p for p in self.checkpoints() if int(_STEP_DIR.match(p.name)[1]) <= latest_step]
        kept = older[max(0, len(older) - self.keep) :]
        good = next((p for p in reversed(older) if _is_finite(p)), None)
        for path in older[: max(0, len(older) - self.keep)]:
            if path == good and good not in kept:
                continue
            doomed = self.root / f"tmp-pruned-{path.name}-{secrets.token_hex(4)}"
            os.rename(path, doomed)
            shutil.rmtree(doomed)

    def _remove_stale_tmp(self) -> None:
        for path in self.root.iterdir():
            if path.is_dir() and path.name.startswith("tmp-"):
                shutil.rmtree(path)
            elif path.is_file() and path.name.startswith(f"{LATEST}.tmp-"):
                path.unlink()


def verify(path: Path, manifest: dict | None = None) -> None:
    """Every file of checkpoint ``path`` has the size and sha256 its manifest records (GlassrlError naming it)."""
    manifest = manifest if manifest is not None else read_manifest(path)
    for entry in manifest["parts"].values():
        for file in entry["files"]:
            _verify_file(Path(path), file)


def _is_finite(path: Path) -> bool:
    try:
        return bool(read_manifest(path).get("finite", False))
    except GlassrlError:
        return False


def read_manifest(path: Path) -> dict:
    """The parsed ``manifest.json`` of checkpoint ``path`` (GlassrlError when missing or malformed)."""
    file = Path(path) / MANIFEST
    if not file.is_file():
        raise GlassrlError(f"{path}: not a complete checkpoint (no {MANIFEST})")
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise GlassrlError(f"{file}: unreadable manifest ({err})") from None
    if not isinstance(manifest, dict) or "parts" not in manifest:
        raise GlassrlError(f"{file}: not a glassrl checkpoint manifest (format {MANIFEST_FORMAT})")
    if manifest.get("format") != MANIFEST_FORMAT:
        raise GlassrlError(
            f"{file}: checkpoint format {manifest.get('format')!r}, this glassrl reads format {MANIFEST_FORMAT} "
            f"(written by glassrl {manifest.get('glassrl_version', '?')})"
        )
    named = _STEP_DIR.match(Path(path).name)
    if named and manifest.get("step") != int(named[1]):
        raise GlassrlError(f"{file}: records step {manifest.get('step')}, but the directory is {Path(path).name}")
    for part_name, entry in manifest["parts"].items():
        if entry.get("kind") not in _READERS:
            raise GlassrlError(f"{file}: part {part_name!r} has unknown kind {entry.get('kind')!r}")
    return manifest


def _part_path(kind: str, name: str) -> str:
    """The file (or directory, for hf) a part is read from; a torch part adds NAME.safetensors."""
    return {"json": f"{name}.json", "torch": f"{name}.json", "safetensors": f"{name}.safetensors", "hf": name}[kind]


def _write_json(directory: Path, name: str, value: object) -> list[Path]:
    text, _ = codec.encode(value, allow_tensors=False)
    path = directory / _part_path("json", name)
    write_durably(path, text.encode())
    return [path]


def _write_torch(directory: Path, name: str, value: object) -> list[Path]:
    text, tensors = codec.encode(value)
    tree, weights = directory / f"{name}.json", directory / f"{name}.safetensors"
    write_durably(tree, text.encode())
    save_file(tensors, str(weights))
    return [tree, weights]


def _write_safetensors(directory: Path, name: str, value: object) -> list[Path]:
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
    return [path]


def _write_hf(directory: Path, name: str, value: object) -> list[Path]:
    if not hasattr(value, "save_pretrained"):
        raise TypeError(
            f"checkpoint part {name!r} of kind 'hf' needs a save_pretrained method, got {type(value).__name__}"
        )
    target = directory / _part_path("hf", name)
    value.save_pretrained(target)
    return [f for f in target.rglob("*") if f.is_file()]


def _read_back(directory: Path, name: str, part: Part) -> bool:
    """Read the part just written back and compare it with what was given (GlassrlError when it differs);
    whether every floating tensor in it is finite. An hf part's safetensors files are checked for
    finiteness (the model is compared by its sha256s at load).

    Tensor files are read one tensor at a time (``safe_open``), never whole: loading a 0.5 B run's
    optimiser state back at once held twice the weights more at every checkpoint (issue 40). A torch
    part is compared as its two files: the JSON text equal to the value's encoding, each tensor in the
    file equal to the encoding's bit for bit, and the encoding decoding to the value (the round trip)."""
    if part.kind == "hf":
        return all(_streamed_finite(f) for f in sorted((directory / name).rglob("*.safetensors")))
    differs = GlassrlError(f"checkpoint part {name!r} of kind {part.kind!r} does not read back as written")
    if part.kind == "json":
        back = _READERS["json"](directory, name)
        if not codec.same(part.value, back):
            raise differs
        return _finite(back)
    if part.kind == "safetensors":
        given = {k: v.detach().cpu() for k, v in part.value.items()}
        if not _streamed_equal(directory / _part_path("safetensors", name), given):
            raise differs
        return _finite(given)
    text, tensors = codec.encode(part.value)  # no copies (codec._Tensors)
    written = (directory / f"{name}.json").read_text(encoding="utf-8")
    if written != text or not _streamed_equal(directory / f"{name}.safetensors", tensors):
        raise differs
    if not codec.same(part.value, codec.decode(text, tensors)):
        raise differs
    return _finite(tensors)


def _streamed_equal(file: Path, tensors: dict[str, torch.Tensor]) -> bool:
    """The safetensors ``file`` holds exactly ``tensors``, bit for bit, read one tensor at a time."""
    seen = set()
    for key, tensor in _tensors_in(file):
        if key not in tensors or not codec.same(tensor, tensors[key]):
            return False
        seen.add(key)
    return seen == set(tensors)


def _streamed_finite(file: Path) -> bool:
    """Every floating tensor of the safetensors ``file`` is finite, read one tensor at a time."""
    return all(_finite(tensor) for _, tensor in _tensors_in(file))


# safetensors' dtype names (its format's header) as torch's
_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
    "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


def _tensors_in(file: Path):
    """(name, tensor) of a safetensors ``file``, one at a time, each read into its own buffer. Not through a
    memory map (``safe_open``, ``load_file``): a map's pages stay resident until it closes, so by the last
    tensor the whole file counted in the process's memory (1.4 GiB more to read back a 0.6 GiB model). The
    format: an 8-byte little-endian header length, the JSON header (dtype, shape, data offsets), the data."""
    with open(file, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        for name, spec in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
            begin, end = spec["data_offsets"]
            if spec["dtype"] not in _SAFETENSORS_DTYPES:  # a rarer dtype (float8): safetensors' own reader
                with safe_open(str(file), framework="pt", device="cpu") as whole:
                    yield name, whole.get_tensor(name)
                continue
            dtype = _SAFETENSORS_DTYPES[spec["dtype"]]
            f.seek(8 + length + begin)
            data = bytearray(end - begin)
            if f.readinto(data) != end - begin:
                raise ValueError(f"{file}: {name} is cut short")
            tensor = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
            yield name, tensor.reshape(spec["shape"])


def _finite(value: object) -> bool:
    """Every floating tensor (and float) in a decoded part is finite."""
    if isinstance(value, torch.Tensor):
        # in chunks of 4 Mi values: isfinite makes a float temporary of its input's size (|x|), and a 0.5 B
        # model's embedding is 0.5 GiB
        flat = value.reshape(-1)
        return not value.is_floating_point() or all(bool(torch.isfinite(c).all()) for c in flat.split(1 << 22))
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    return True


def _read_part(path: Path, name: str, entry: dict) -> object:
    """Part ``name`` decoded; GlassrlError naming its file when it is not what glassrl writes: it passed
    its sha256, so it was written so by a bug, or by hand with the manifest resealed (issue 37)."""
    try:
        _check_weights(path, name, entry["kind"])
        return _READERS[entry["kind"]](path, name)
    except (ValueError, KeyError, TypeError, OverflowError, SafetensorError) as err:
        file = path / _part_path(entry["kind"], name)
        if isinstance(err, SafetensorError) and entry["kind"] == "torch":  # the part's tensors
            file = path / f"{name}.safetensors"
        raise GlassrlError(f"{file}: cannot be decoded ({_one_line(err)})") from None


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]


def _read_json(path: Path, name: str) -> object:
    return codec.decode((path / _part_path("json", name)).read_text(encoding="utf-8"))


def _read_torch(path: Path, name: str) -> object:
    tensors = load_file(str(path / f"{name}.safetensors"), device="cpu")
    return codec.decode((path / f"{name}.json").read_text(encoding="utf-8"), tensors)


def _read_safetensors(path: Path, name: str) -> object:
    return load_file(str(path / _part_path("safetensors", name)), device="cpu")


def _read_hf(path: Path, name: str) -> object:
    return path / _part_path("hf", name)


def _check_weights(path: Path, name: str, kind: str) -> None:
    """Every floating tensor of a safetensors or hf part is finite (GlassrlError naming the file and
    the tensor): read one tensor at a time, each file's header checked against the file's size by
    safetensors before a tensor is read. Not at save, where a non-finite checkpoint is recorded as
    such (the manifest's "finite"): a resume never loads one."""
    if kind not in ("safetensors", "hf"):
        return
    target = path / _part_path(kind, name)
    for file in sorted(target.rglob("*.safetensors")) if kind == "hf" else [target]:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as weights:
                for key in weights.keys():  # noqa: SIM118 - a safe_open handle is not a dict
                    tensor = weights.get_tensor(key)
                    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                        raise GlassrlError(
                            f"{file}: tensor {key} holds non-finite values; a checkpoint never loads them"
                        )
        except SafetensorError as err:
            raise GlassrlError(f"{file}: not a valid safetensors file ({_one_line(err)})") from None


_WRITERS: dict[str, Callable[[Path, str, object], list[Path]]] = {
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


def _bytes_under(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def _size(n: float) -> str:
    """Bytes as a person reads them: 0 B, 412.3 kB, 1.2 GB (powers of 1000)."""
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB"):
        n /= 1000
        if n < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} TB"


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
