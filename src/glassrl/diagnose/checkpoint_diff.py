"""Two checkpoints of the same step compared file by file and tensor by tensor, without torch.

    found = compare_checkpoints(run_a / "checkpoints/step_00000004", run_b / ..., close)
    found[0].where        # "actor/model.safetensors lm_head.weight[3, 7]"

A checkpoint directory (glassrl.run.checkpoint) holds ``manifest.json`` (times and hashes: not
compared; the files it lists are), the config part ``config.json`` (the run's config: compared
before, by key), ``NAME.json`` parts (compared by dotted key) and safetensors
files (tensor by tensor: the first differing element by index, the count and the largest
|a − b|), and other files a Hugging Face part writes (tokenizer, config.json: compared by bytes).
safetensors files are read here (their 8-byte header length, JSON header and raw little-endian
data, as the format's specification lays them out) so that a run can be diffed where torch is
absent; bfloat16 is widened to float32 by its bits.

Nothing is read before it is checked against the file (issue 37 item 6: a header claiming 10¹²
bytes was read whole): the header's length against the file's size, then every tensor's dtype,
shape and data_offsets against the data that follows, as safetensors' own loader validates them
(``Metadata::validate`` in safetensors/src/tensor.rs: offsets contiguous from 0 to the end of the
data, each span ``shape`` × the dtype's size). A file the manifest lists with another size was
truncated or changed. Each is one GlassrlError naming the file and the tensor or field.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from glassrl.config import flatten
from glassrl.errors import GlassrlError
from glassrl.jsonl import load_json
from glassrl.report.run_dir import reading, regular_file

# not compared: the manifest (glassrl.run.checkpoint.MANIFEST: times of the save) and the trainer's config
# part (the run's config.yaml again, compared first by glassrl.diagnose.diff)
SKIPPED = ("manifest.json", "config.json")

# safetensors dtype -> numpy dtype (little-endian); BF16 is read as uint16 and widened
_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}

_ITEMSIZE = {name: np.dtype(dtype).itemsize for name, dtype in _DTYPES.items()}
MAX_HEADER = 100_000_000  # bytes: safetensors' own bound (MAX_HEADER_SIZE, safetensors/src/tensor.rs)

Close = Callable[[Any, Any], bool]  # whether two values count as equal (the diff's tolerances)


@dataclass(frozen=True)
class TensorDifference:
    """Where one file of two checkpoints differs: ``where`` names the file and the tensor, key or
    first element; ``a``/``b`` the values there; ``count`` of ``total`` elements differ; ``max_abs``
    the largest |a − b| over the tensor (None for non-numbers)."""

    where: str
    a: Any
    b: Any
    count: int
    total: int
    max_abs: float | None


def compare_checkpoints(dir_a: Path, dir_b: Path, close: Close, atol: float, rtol: float) -> list[TensorDifference]:
    """Every difference between two checkpoint directories, in file then tensor order; a file on one
    side only is a difference (``a`` or ``b`` is "missing")."""
    files_a, files_b = _files(dir_a), _files(dir_b)
    found = []
    for name in sorted(files_a.keys() | files_b.keys()):
        if name not in files_a or name not in files_b:
            a, b = ("missing", "present") if name not in files_a else ("present", "missing")
            found.append(TensorDifference(name, a, b, 1, 1, None))
        elif name.endswith(".safetensors"):
            found += _compare_tensors(
                name, read_safetensors(files_a[name]), read_safetensors(files_b[name]), atol, rtol
            )
        elif name.endswith(".json"):
            found += _compare_json(name, files_a[name], files_b[name], close)
        elif _bytes(files_a[name]) != _bytes(files_b[name]):
            found.append(TensorDifference(name, "bytes", "other bytes", 1, 1, None))
    return found


def tensor_count(checkpoint: Path) -> int:
    """Tensors in the safetensors files of a checkpoint directory (their headers only, checked)."""
    return sum(
        sum(name != "__metadata__" for name in _layout(path)[0])
        for name, path in _files(checkpoint).items()
        if name.endswith(".safetensors")
    )


def _layout(path: Path) -> tuple[dict[str, Any], int]:
    """(header, where the data starts) of a safetensors file, every field checked against the file
    (module docstring) before a tensor is read; GlassrlError naming the file and the tensor."""
    size = path.stat().st_size
    with reading(path), path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise GlassrlError(f"{path}: not a safetensors file ({size} bytes, shorter than its 8-byte header length)")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER, size - 8):
            raise GlassrlError(
                f"{path}: not a safetensors file (its header claims {length} bytes; the file holds {size - 8} after it)"
            )
        text = f.read(length)
    try:
        header = load_json(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:  # not JSON, nested too deep, a 5,000-digit integer
        raise GlassrlError(f"{path}: not a safetensors file (its header is not JSON: {err})") from None
    if not isinstance(header, dict):
        raise GlassrlError(f"{path}: not a safetensors file (its header is a {type(header).__name__}, not an object)")
    data = size - 8 - length
    spans = sorted(_span(path, name, info, data) for name, info in header.items() if name != "__metadata__")
    end = 0
    for begin, stop, name in spans:  # contiguous from 0 to the end of the data: safetensors' rule
        if begin != end:
            raise GlassrlError(
                f"{path}: tensor {name!r}: data_offsets start at {begin}, the previous tensor ends at {end}"
            )
        end = stop
    if end != data:
        raise GlassrlError(f"{path}: its tensors end at byte {end} of the data, the file holds {data} (truncated?)")
    return header, 8 + length


def _span(path: Path, name: str, info: Any, data: int) -> tuple[int, int, str]:
    """(begin, end, name) of one tensor's bytes, its header entry checked."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict):
        raise GlassrlError(f"{where}: expected an object with dtype, shape and data_offsets")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        shown = "no dtype" if dtype is None else f"dtype {dtype!r}"
        raise GlassrlError(f"{where}: {shown}; glassrl diff reads {', '.join(_DTYPES)}")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise GlassrlError(f"{where}: shape {shape!r}: expected a list of integers >= 0")
    if (
        not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets))
        or not 0 <= offsets[0] <= offsets[1] <= data
    ):
        raise GlassrlError(
            f"{where}: data_offsets {offsets!r}: expected [begin, end] within the file's {data} data bytes"
        )
    span = math.prod(shape) * _ITEMSIZE[dtype]
    if span != offsets[1] - offsets[0]:
        raise GlassrlError(
            f"{where}: shape {shape} of {dtype} takes {span} bytes, its data_offsets span {offsets[1] - offsets[0]}"
        )
    return offsets[0], offsets[1], name


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file as numpy arrays (bfloat16 widened to float32)."""
    header, start = _layout(path)
    with reading(path), path.open("rb") as f:
        f.seek(start)
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=_DTYPES[info["dtype"]])
        if array.size != math.prod(info["shape"]):  # the file changed under us
            raise GlassrlError(f"{path}: tensor {name!r}: the file changed while it was read")
        if info["dtype"] == "BF16":  # the high half of a float32
            array = (array.astype(np.uint32) << 16).view(np.float32)
        out[name] = array.reshape(info["shape"])
    return out


def _files(root: Path) -> dict[str, Path]:
    """{path relative to the checkpoint: file} of every file but the :data:`SKIPPED` ones. Anything
    there that is not a regular file or a directory (a FIFO, a link loop) is a GlassrlError; so is a
    file whose size is not the one the manifest recorded (truncated or changed)."""
    files = {}
    with reading(root):
        entries = sorted(root.rglob("*"))
    for p in entries:
        if p.is_dir():
            continue
        regular_file(p)
        files[p.relative_to(root).as_posix()] = p
    for name, size in _manifest_sizes(root).items():
        if name in files and files[name].stat().st_size != size:
            raise GlassrlError(
                f"{files[name]}: {files[name].stat().st_size} bytes, its checkpoint's manifest.json says {size} "
                "(truncated or changed after the save)"
            )
    return {name: p for name, p in files.items() if name not in SKIPPED}


def _manifest_sizes(root: Path) -> dict[str, int]:
    """{file: size} that the checkpoint's manifest records (glassrl.run.checkpoint); {} without one
    in that form."""
    path = root / "manifest.json"
    if not regular_file(path):
        return {}
    manifest = _json(path)
    parts = manifest.get("parts") if isinstance(manifest, dict) else None
    files = [f for entry in (parts or {}).values() if isinstance(entry, dict) for f in entry.get("files") or ()]
    return {
        f["path"]: f["size"]
        for f in files
        if isinstance(f, dict) and isinstance(f.get("path"), str) and type(f.get("size")) is int
    }


def _bytes(path: Path) -> bytes:
    with reading(path):
        return path.read_bytes()


def _compare_tensors(
    file: str, a: dict[str, np.ndarray], b: dict[str, np.ndarray], atol: float, rtol: float
) -> list[TensorDifference]:
    found = []
    for name in sorted(a.keys() | b.keys()):
        if name not in a or name not in b:
            found.append(TensorDifference(f"{file} {name}", "missing" if name not in a else "present", "", 1, 1, None))
            continue
        x, y = a[name], b[name]
        if x.shape != y.shape or x.dtype != y.dtype:
            found.append(
                TensorDifference(f"{file} {name}", f"{x.dtype}{list(x.shape)}", f"{y.dtype}{list(y.shape)}", 1, 1, None)
            )
            continue
        if x.dtype == np.bool_:
            x, y = x.astype(np.int8), y.astype(np.int8)
        x, y = x.astype(np.float64), y.astype(np.float64)
        # numpy.isclose's rule: |a − b| <= atol + rtol·|b|; NaN equals NaN (a run that saved one both times agrees)
        differ = ~np.isclose(x, y, atol=atol, rtol=rtol, equal_nan=True) if (atol or rtol) else ~_same(x, y)
        count = int(differ.sum())
        if count:
            first = tuple(int(i) for i in np.argwhere(differ)[0])
            gap = np.abs(x - y)[differ]
            found.append(
                TensorDifference(
                    f"{file} {name}{list(first)}",
                    float(x[first]),
                    float(y[first]),
                    count,
                    int(x.size),
                    float(np.nanmax(gap)) if not np.all(np.isnan(gap)) else None,
                )
            )
    return found


def _same(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact equality, NaN equal to NaN."""
    return (x == y) | (np.isnan(x) & np.isnan(y))


def _compare_json(file: str, path_a: Path, path_b: Path, close: Close) -> list[TensorDifference]:
    a, b = (_flat_json(p) for p in (path_a, path_b))
    found = []
    for key in sorted(a.keys() | b.keys()):
        if key not in a or key not in b or not close(a[key], b[key]):
            found.append(TensorDifference(f"{file} {key}", a.get(key, "missing"), b.get(key, "missing"), 1, 1, None))
    return found


def _flat_json(path: Path) -> dict[str, Any]:
    tree = _json(path)
    return flatten(tree) if isinstance(tree, dict) else {"": tree}


def _json(path: Path) -> Any:
    """A JSON file's value; not JSON, nested past glassrl.jsonl.MAX_NESTING or not UTF-8: GlassrlError."""
    try:
        return load_json(_bytes(path).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise GlassrlError(f"{path}: not valid JSON ({err})") from None
