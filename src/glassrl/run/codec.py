"""Plain state as JSON plus tensors: the encoding of every non-model checkpoint part.

    text, tensors = encode(state)              # JSON text, dict[str, Tensor] for safetensors
    assert same(decode(text, tensors), state)  # by construction, and checked at save time

A checkpoint must be read back by any later glassrl without running code, so no part is
pickled. JSON holds the tree; what JSON lacks is written as an object with the reserved key
``"__glassrl__"`` naming the type:

    tuple, set, frozenset     {"__glassrl__": "tuple", "items": [...]}  (sets in a stable order)
    dict with non-str keys    {"__glassrl__": "dict", "items": [[key, value], ...]}
    (or the reserved key)       (an optimiser's state is keyed by parameter index)
    nan, inf, -inf            {"__glassrl__": "float", "value": "nan"}
    bytes                     {"__glassrl__": "bytes", "base64": "..."}
    datetime, date, time      {"__glassrl__": "datetime", "iso": "2024-01-01T00:00:00+00:00"}
    timedelta                 {"__glassrl__": "timedelta", "days": d, "seconds": s, "microseconds": us}
    Decimal, complex          {"__glassrl__": "decimal", "text": "0.1"}, {"__glassrl__": "complex", ...}
    numpy array / scalar      {"__glassrl__": "ndarray", "dtype": "uint32", "shape": [624], "base64": ...}
    pandas Timestamp, NaT     {"__glassrl__": "pandas.Timestamp", "iso": ...} (Parquet timestamps)
    torch.Tensor              {"__glassrl__": "tensor", "key": "t3"} -> tensors["t3"] (safetensors)

Anything else is a TypeError naming where in the tree it sits (``groups[0].prompt.metadata.x``).
Python's JSON writes a float as its shortest repr, which reads back to the same double, and
an int of any size exactly.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
from typing import Any

import numpy as np
import torch

MARK = "__glassrl__"
_CLOCK_TYPES = {"datetime": dt.datetime, "date": dt.date, "time": dt.time}


def encode(value: Any, *, allow_tensors: bool = True) -> tuple[str, dict[str, torch.Tensor]]:
    """(JSON text, tensors by key) of ``value``; TypeError naming the path of an unsupported value."""
    tensors = _Tensors()
    tree = _encode(value, "", tensors, allow_tensors)
    return json.dumps(tree, indent=1, allow_nan=False, ensure_ascii=True) + "\n", dict(tensors)


class _Tensors(dict):
    """The tensors :func:`encode` collects, and the storages they sit on."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: set[int] = set()

    def add(self, tensor: torch.Tensor) -> str:
        """``tensor``'s key. It is kept as it is, not copied (the checkpoint writes it at once: a copy of an
        optimiser's state, twice the weights under Adam, was a 0.5 B run's peak at every checkpoint), unless
        its storage holds a tensor added before: safetensors refuses tensors that share storage."""
        tensor = tensor.detach().cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        key = f"t{len(self)}"
        self[key] = tensor.clone() if storage in self.storages and tensor.numel() else tensor
        self.storages.add(storage)
        return key


def decode(text: str, tensors: dict[str, torch.Tensor] | None = None) -> Any:
    """The value :func:`encode` wrote; ValueError for anything else: malformed JSON, nesting deeper than
    the interpreter's recursion limit allows, a malformed or out-of-range tagged value (a timedelta
    of 10¹² days), a missing tensor."""
    try:
        return _decode(json.loads(text), tensors or {})
    except RecursionError:
        raise ValueError("nested too deep to be a checkpoint's state") from None
    except (KeyError, TypeError, IndexError, AttributeError, OverflowError) as err:
        raise ValueError(f"a malformed encoded value ({type(err).__name__}: {err})") from None


def same(a: Any, b: Any) -> bool:
    """Equal in type and value all the way down: tensors bit for bit (dtype and shape too),
    NaN equal to NaN, a tuple never equal to a list."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu()) or _both_nan(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def _both_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch.equal says False when NaNs sit at the same places: compare the bytes instead."""
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and bytes(a.view(torch.uint8).flatten().numpy()) == bytes(b.view(torch.uint8).flatten().numpy())
    )


def _tagged(tag: str, **fields: Any) -> dict[str, Any]:
    return {MARK: tag, **fields}


def _encode(value: Any, path: str, tensors: _Tensors, allow_tensors: bool) -> Any:
    if value is None or type(value) in (bool, str):
        return value
    if isinstance(value, torch.Tensor):
        if not allow_tensors:
            raise TypeError(f"{path or 'the value'}: a tensor, which this part cannot hold (JSON only)")
        return _tagged("tensor", key=tensors.add(value))
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return _unsupported(value, path)
        return _tagged("ndarray", dtype=value.dtype.str, shape=list(value.shape), base64=_b64(value.tobytes()))
    if isinstance(value, np.generic):
        return _tagged("numpy", dtype=value.dtype.str, base64=_b64(value.tobytes()))
    if isinstance(value, int):
        return value if type(value) is int else _unsupported(value, path)
    if isinstance(value, float):
        if type(value) is not float:
            return _unsupported(value, path)
        return value if math.isfinite(value) else _tagged("float", value=repr(value))
    if type(value) in (list, tuple, set, frozenset):
        kind = type(value).__name__
        if kind in ("set", "frozenset"):
            value = sorted(value, key=_sort_key)
        items = [_encode(v, f"{path}[{i}]", tensors, allow_tensors) for i, v in enumerate(value)]
        return items if kind == "list" else _tagged(kind, items=items)
    if type(value) is dict:
        if all(type(k) is str for k in value) and MARK not in value:
            return {k: _encode(v, f"{path}.{k}" if path else k, tensors, allow_tensors) for k, v in value.items()}
        return _tagged(
            "dict",
            items=[
                [
                    _encode(k, f"{path}<key>", tensors, allow_tensors),
                    _encode(v, f"{path}[{k!r}]", tensors, allow_tensors),
                ]
                for k, v in value.items()
            ],
        )
    return _encode_scalar(value, path)


def _encode_scalar(value: Any, path: str) -> Any:
    kind = type(value)
    if kind is bytes:
        return _tagged("bytes", base64=_b64(value))
    if kind.__module__.startswith("pandas"):
        return _encode_pandas(value, path)
    for tag, clock in _CLOCK_TYPES.items():
        if kind is clock:
            return _tagged(tag, iso=value.isoformat())
    if kind is dt.timedelta:
        return _tagged("timedelta", days=value.days, seconds=value.seconds, microseconds=value.microseconds)
    if kind is decimal.Decimal:
        return _tagged("decimal", text=str(value))
    if kind is complex:
        real, imag = (_encode(part, path, _Tensors(), False) for part in (value.real, value.imag))
        return _tagged("complex", real=real, imag=imag)
    return _unsupported(value, path)


def _encode_pandas(value: Any, path: str) -> Any:
    """Parquet's timestamp columns come back from pyarrow as pandas objects."""
    name = type(value).__name__
    if name == "Timestamp":
        return _tagged("pandas.Timestamp", iso=value.isoformat())
    if name == "Timedelta":
        return _tagged("pandas.Timedelta", nanoseconds=int(value.value))
    if name == "NaTType":
        return _tagged("pandas.NaT")
    return _unsupported(value, path)


def _unsupported(value: Any, path: str) -> Any:
    kind = type(value)
    raise TypeError(f"{path or 'the value'}: cannot store a {kind.__module__}.{kind.__qualname__} ({value!r:.60})")


def _sort_key(value: Any) -> tuple[str, str]:
    """A set's members in an order that does not depend on hashing (str hashes are salted)."""
    return type(value).__name__, repr(value)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _decode(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(tree, list):
        return [_decode(v, tensors) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if MARK not in tree:
        return {k: _decode(v, tensors) for k, v in tree.items()}
    tag = tree[MARK]
    if tag in ("tuple", "set", "frozenset"):
        return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](_decode(v, tensors) for v in tree["items"])
    if tag == "dict":
        return {_decode(k, tensors): _decode(v, tensors) for k, v in tree["items"]}
    if tag == "tensor":
        if tree["key"] not in tensors:
            raise ValueError(f"tensor {tree['key']!r} is missing from the part's tensors")
        return tensors[tree["key"]]
    return _decode_scalar(tag, tree, tensors)


def _decode_scalar(tag: str, tree: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
    if tag == "float":
        return float(tree["value"])
    if tag == "bytes":
        return base64.b64decode(tree["base64"])
    if tag in _CLOCK_TYPES:
        return _CLOCK_TYPES[tag].fromisoformat(tree["iso"])
    if tag == "timedelta":
        return dt.timedelta(days=tree["days"], seconds=tree["seconds"], microseconds=tree["microseconds"])
    if tag == "decimal":
        return decimal.Decimal(tree["text"])
    if tag == "complex":
        return complex(_decode(tree["real"], tensors), _decode(tree["imag"], tensors))
    if tag == "ndarray":
        data = base64.b64decode(tree["base64"])
        return np.frombuffer(data, dtype=np.dtype(tree["dtype"])).reshape(tree["shape"]).copy()
    if tag == "numpy":
        return np.frombuffer(base64.b64decode(tree["base64"]), dtype=np.dtype(tree["dtype"]))[0]
    if tag.startswith("pandas."):
        import pandas as pd

        if tag == "pandas.Timestamp":
            return pd.Timestamp(tree["iso"])
        if tag == "pandas.Timedelta":
            return pd.Timedelta(tree["nanoseconds"], unit="ns")
        if tag == "pandas.NaT":
            return pd.NaT
    raise ValueError(f"unknown encoded type {tag!r}")
