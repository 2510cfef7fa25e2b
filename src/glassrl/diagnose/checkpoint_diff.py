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
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from glassrl.config import flatten
from glassrl.errors import GlassrlError

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
        elif files_a[name].read_bytes() != files_b[name].read_bytes():
            found.append(TensorDifference(name, "bytes", "other bytes", 1, 1, None))
    return found


def tensor_count(checkpoint: Path) -> int:
    """Tensors in the safetensors files of a checkpoint directory (their headers only)."""
    total = 0
    for path in checkpoint.rglob("*.safetensors"):
        with path.open("rb") as f:
            head = f.read(8)
            size = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            total += sum(name != "__metadata__" for name in _header(path, head + f.read(size)))
    return total


def _header(path: Path, data: bytes) -> dict:
    """The JSON header of safetensors bytes (8-byte little-endian length, then the JSON)."""
    try:
        (size,) = struct.unpack("<Q", data[:8])
        return json.loads(data[8 : 8 + size])
    except (struct.error, ValueError) as err:
        raise GlassrlError(f"{path}: not a safetensors file ({err})") from None


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file as numpy arrays (bfloat16 widened to float32)."""
    data = path.read_bytes()
    header = _header(path, data)
    start = 8 + struct.unpack("<Q", data[:8])[0]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise GlassrlError(f"{path}: tensor {name}: dtype {info['dtype']} is not compared by glassrl diff")
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[start + begin : start + end], dtype=_DTYPES[info["dtype"]])
        if info["dtype"] == "BF16":  # the high half of a float32
            array = (array.astype(np.uint32) << 16).view(np.float32)
        out[name] = array.reshape(info["shape"])
    return out


def _files(root: Path) -> dict[str, Path]:
    """{path relative to the checkpoint: file} of every file but the :data:`SKIPPED` ones."""
    files = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}
    return {name: p for name, p in files.items() if name not in SKIPPED}


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
    try:
        tree = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise GlassrlError(f"{path}: not valid JSON ({err})") from None
    return flatten(tree) if isinstance(tree, dict) else {"": tree}
