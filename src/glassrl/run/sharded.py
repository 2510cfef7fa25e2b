"""A data-parallel role's state (weights, optimiser, schedule: tensors sharded over the ranks, or
replicated, among plain values) in a directory, and back, without unpickling anything.

    save(state, path, main=ctx.is_main)   # collective: every rank of the group calls it
    state = load(template, path)           # collective; ``template`` is the state as the ranks hold it now

On disk:

- the tensors, with torch.distributed.checkpoint (DCP) writing safetensors: each rank its part
  (a replicated tensor once), the offsets of a shard in the file's header, so that a run with
  another world size reads its own parts (HuggingFaceStorageWriter/Reader, ``save_distributed``);
- ``state.json``: everything else (an optimiser's hyper-parameters, the schedule's counters),
  encoded by glassrl.run.codec, each tensor standing as ``{"__dcp__": KEY}``, its key in the
  safetensors files; written by the main rank.

DCP's own format pickles its metadata (``.metadata``, read with ``pickle.load``) and every
non-tensor value (read with ``torch.load(weights_only=False)``): a directory handed over by
someone else could run code on ``--resume`` (issue 32). Directories in that format, written by
glassrl before this one, are still read (an old run resumes), but never by ``pickle.load``: the
metadata by an unpickler that builds only the classes DCP's metadata is made of (Python's
"restricting globals", pickle docs §11.1.5), each file it names a plain name beside it, each
value by ``torch.load(weights_only=True)``; all checked on every rank before DCP reads a tensor.
Anything else in them is one GlassrlError line naming it, before it is built.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._nested_dict import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta
from torch.distributed.tensor import DTensor

from glassrl.errors import GlassrlError
from glassrl.run import codec
from glassrl.run.atomic import write_text
from glassrl.run.validate import conform

PLAIN = "state.json"
_TENSOR = "__dcp__"
_OLD_METADATA = ".metadata"  # DCP's own (pickled) format
# What the pickled metadata of DCP's own format is built of (torch 2.13), and nothing else.
_METADATA_CLASSES = {
    ("pathlib", "PosixPath"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    *(
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ),
}


def save(state: dict[str, Any], path: str | Path, *, main: bool) -> None:
    """Write ``state`` into directory ``path`` (collective; the main rank writes state.json)."""
    plain, tensors = _split(state)
    if main:  # first: DCP's save ends in a collective, after which every rank may read it
        Path(path).mkdir(parents=True, exist_ok=True)
        write_text(Path(path) / PLAIN, codec.encode(plain, allow_tensors=False)[0])
    dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(str(path), save_distributed=True))


def load(template: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """The state saved in ``path``: ``template``'s tensors filled in place (their layout is this
    group's), its plain values as saved (collective)."""
    path = Path(path)
    if not (path / PLAIN).is_file():
        return _load_old_format(template, path)
    try:
        saved = codec.decode((path / PLAIN).read_text(encoding="utf-8"))
    except ValueError as err:  # passed its sha256: written so by a bug, or by hand and resealed
        raise GlassrlError(f"{path / PLAIN}: cannot be decoded ({err})") from None
    plain, tensors = _split(template)
    conform(saved, plain, str(path / PLAIN))  # the plain values this group holds now: their shapes, finite
    try:
        dcp.load(tensors, storage_reader=HuggingFaceStorageReader(str(path)))
    except CheckpointException as err:
        raise GlassrlError(f"{path}: cannot be loaded ({_first_failure(err)})") from None
    except (ValueError, KeyError, TypeError, IndexError, OverflowError, RuntimeError, SafetensorError) as err:
        # DCP reads the safetensors' own metadata (each shard's offsets) outside its error handling
        raise GlassrlError(f"{path}: cannot be loaded ({type(err).__name__}: {_one_line(err)[:300]})") from None
    # the tensors' finiteness: checked by the driver on every file of the part before the ranks load
    # it (glassrl.run.checkpoint), not here, where one rank alone refusing would leave the others waiting
    return _join(saved, tensors, path)


def _split(tree: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """``tree`` with each tensor replaced by ``{"__dcp__": KEY}``, and the tensors by KEY (its path
    in the tree as JSON: parameter names hold dots, so a dotted path would be ambiguous). A tensor
    that is a view of one met before (tied weights: the embedding and the output layer) takes that
    one's key: safetensors holds each storage once. (An empty shard is never taken for another: its
    storage has no address.)"""
    tensors: dict[str, torch.Tensor] = {}
    seen: dict[tuple, str] = {}

    def walk(node: Any, at: list) -> Any:
        if isinstance(node, torch.Tensor):
            local = node.to_local() if isinstance(node, DTensor) else node
            same = (
                local.untyped_storage().data_ptr(),
                local.storage_offset(),
                local.shape,
                local.stride(),
                local.dtype,
            )
            if same not in seen or not local.numel():
                seen[same] = json.dumps(at)
                tensors[seen[same]] = node
            return {_TENSOR: seen[same]}
        if isinstance(node, dict):  # an OrderedDict (a model's state) too: written as a dict
            return {k: walk(v, [*at, k if isinstance(k, (str, int)) else repr(k)]) for k, v in node.items()}
        if type(node) in (list, tuple):
            return type(node)(walk(v, [*at, i]) for i, v in enumerate(node))
        return node

    return walk(tree, []), tensors


def _join(tree: Any, tensors: dict[str, torch.Tensor], path: Path) -> Any:
    if type(tree) is dict:
        if set(tree) == {_TENSOR}:
            if tree[_TENSOR] not in tensors:
                raise GlassrlError(f"{path / PLAIN}: names tensor {tree[_TENSOR]}, which this run's state lacks")
            return tensors[tree[_TENSOR]]
        return {k: _join(v, tensors, path) for k, v in tree.items()}
    if type(tree) in (list, tuple):
        return type(tree)(_join(v, tensors, path) for v in tree)
    return tree


# ---------------------------------------------------------------- DCP's own format, read without running code


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def _old_metadata(path: Path) -> Metadata:
    """DCP's pickled ``.metadata`` built of its own classes only, each file it names a plain name in
    ``path``, and each pickled value plain data (``torch.load(weights_only=True)``); else a
    GlassrlError. Every rank checks the same files, so that every rank refuses together."""
    try:
        with open(path / _OLD_METADATA, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except Exception as err:  # noqa: BLE001 - whatever a malformed or hostile pickle raises
        raise GlassrlError(f"{path}: refused to load: {_one_line(err)}") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise GlassrlError(f"{path}: refused to load: {_OLD_METADATA} is not DCP's metadata")
    values = {k for k, v in metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)}
    for index, info in metadata.storage_data.items():
        name = getattr(info, "relative_path", None)
        plain_name = isinstance(name, str) and Path(name).name == name and (path / name).is_file()
        if not isinstance(info, _StorageInfo) or not plain_name:
            raise GlassrlError(f"{path}: refused to load: {_OLD_METADATA} names {name!r}, not a file beside it")
        if transforms := getattr(info, "transform_descriptors", None):  # glassrl never wrote a compressed one
            raise GlassrlError(f"{path}: refused to load: {index.fqn} is stored transformed ({transforms})")
        if index.fqn in values:
            with open(path / name, "rb") as f:
                f.seek(info.offset)
                _plain_value(io.BytesIO(f.read(info.length)), f"{path}: refused to load: the value of {index.fqn}")
    return metadata


def _plain_value(value: io.BytesIO, where: str) -> Any:
    try:
        return torch.load(value, weights_only=True)  # torch's unpickler that builds plain data and tensors only
    except Exception as err:  # noqa: BLE001 - whatever a malformed or hostile pickle raises
        # torch's text goes on to suggest weights_only=False: the one thing not to do here
        if found := re.search(r"GLOBAL ([\w.]+)", str(err)):
            raise GlassrlError(f"{where} holds {found[1]}, which is not plain data") from None
        found = re.search(r"WeightsUnpickler error: (.*?)(?: Check the documentation|$)", _one_line(err))
        raise GlassrlError(f"{where} is not plain data ({found[1] if found else _one_line(err)[:200]})") from None


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


class _CheckedReader(FileSystemReader):
    """DCP's reader, its metadata the one :func:`_old_metadata` checked (never ``pickle.load``)."""

    def __init__(self, path: Path, metadata: Metadata) -> None:
        super().__init__(str(path))
        self.checked = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if getattr(self.checked, "storage_meta", None) is None:
            self.checked.storage_meta = StorageMeta()
        self.checked.storage_meta.load_id = self.load_id
        return self.checked


class _ValuesPlanner(DefaultLoadPlanner):
    """DCP's planner, each pickled value loaded with ``weights_only=True`` (DCP's own: ``False``)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        loaded = _plain_value(value, f"the value of {read_item.dest_index.fqn}")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def _load_old_format(template: dict[str, Any], path: Path) -> dict[str, Any]:
    if not (path / _OLD_METADATA).is_file():
        raise GlassrlError(f"{path}: holds neither {PLAIN} nor {_OLD_METADATA}: not a sharded state")
    reader = _CheckedReader(path, _old_metadata(path))
    try:
        dcp.load(template, storage_reader=reader, planner=_ValuesPlanner())
    except CheckpointException as err:  # it passed its sha256s and the checks above: written so by a bug
        raise GlassrlError(f"{path}: cannot be loaded ({_first_failure(err)})") from None
    return template


def _first_failure(err: CheckpointException) -> str:
    failures = list(err.failures.values())
    return _one_line(failures[0][0]) if failures else _one_line(err)
