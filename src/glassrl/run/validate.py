"""What a restored value may be: the shape of the state a run holds now, and finite.

    conform(saved, template, "…/step_00000002/rng.json")   # GlassrlError naming the file and the field

A checkpoint may come from someone else, or be edited by hand with its manifest resealed (issue 37,
item 7: a counter of −5 trained steps −4…3 and rewrote the first metric rows, 10²⁰ trained nothing
and exited 0, a wrong-size RNG state was a traceback, a NaN KL coefficient was trained with and
saved again). Each restored part of plain state (JSON, or JSON + safetensors: glassrl.run.codec) is
compared with ``template``, what the component holds before the load (its ``state_dict()``), which
has the same shape whatever the run did:

- a key both have holds the same shape (a key one side lacks is left to the component's own load: a
  later torch adds optimiser options), a list or tuple has the same length (an empty one in the
  template, a buffer or an optimiser's per-parameter state not yet filled, takes any length);
- a tensor or a numpy array the same dtype and shape (an RNG state: 5,056 bytes for torch's CPU
  generator);
- an int is an int (not a bool, not 1.5), within int64; a float a number; a str a str; a bool a
  bool; ``None`` stands for "not set yet" and takes ``None`` or a number (Python's cached Gaussian);
- every float and floating tensor is finite, unless the part holds data rather than state
  (``data=True``: a sample buffer's prompts and reward details may hold NaN, as the data did).

The first difference is one GlassrlError line: ``FILE: FIELD: WHAT``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from glassrl.errors import GlassrlError

INT64 = 2**63


def conform(saved: Any, template: Any, where: str, *, data: bool = False) -> None:
    """GlassrlError ``where: field: …`` at the first place ``saved`` differs in shape from ``template``
    or holds a non-finite number (module docstring)."""
    stack: list[tuple[Any, Any, str]] = [(saved, template, "")]
    while stack:
        value, like, field = stack.pop()
        problem = _differs(value, like, data)
        if problem:
            raise GlassrlError(f"{where}: {field or 'the part'}: {problem}")
        if isinstance(like, dict) and like:
            stack.extend((value[k], like[k], _key(field, k)) for k in like if k in value)
            # a key only one side has: a later library's (torch adds optimiser options) or an earlier one's;
            # the component's own load says when it lacks one it needs
            stack.extend((value[k], None, _key(field, k)) for k in value if k not in like)
        elif isinstance(like, (list, tuple)) and like:
            stack.extend((v, t, f"{field}[{i}]") for i, (v, t) in enumerate(zip(value, like)))
        elif not data and isinstance(value, (dict, list, tuple)):  # filled since, or a key only it has: finite
            stack.extend((v, None, f) for v, f in _leaves(value, field))


def _differs(value: Any, like: Any, data: bool) -> str | None:
    """What is wrong with ``value`` where the template holds ``like`` (None when nothing)."""
    if like is None:  # not set yet, or a leaf of a container the template holds empty
        if data or value is None or isinstance(value, (dict, list, tuple, str, bytes, bool)):
            return None
        if isinstance(value, int):
            return _int(value)
        return None if data else _not_finite(value)
    if isinstance(like, torch.Tensor):
        if not isinstance(value, torch.Tensor):
            return f"{_kind(value)}, expected a tensor"
        if value.dtype != like.dtype or value.shape != like.shape:
            return f"a {value.dtype} tensor of shape {tuple(value.shape)}, expected {like.dtype} {tuple(like.shape)}"
        return None if data else _not_finite(value)
    if isinstance(like, np.ndarray):
        if not isinstance(value, np.ndarray) or value.dtype != like.dtype or value.shape != like.shape:
            got = f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else _kind(value)
            return f"{got}, expected a {like.dtype} array of shape {like.shape}"
        return None
    if type(like) is bool or type(like) is str:
        return None if type(value) is type(like) else f"{_kind(value)}, expected a {type(like).__name__}"
    if isinstance(like, int) and not isinstance(like, bool):
        if type(value) is not int:
            return f"{_kind(value)}, expected a whole number"
        return _int(value)
    if isinstance(like, float):
        if type(value) not in (int, float):
            return f"{_kind(value)}, expected a number"
        return None if data else _not_finite(float(value))
    if isinstance(like, (dict, list, tuple)):
        if type(value) is not type(like):
            return f"{_kind(value)}, expected a {type(like).__name__}"
        if not isinstance(like, dict) and like and len(value) != len(like):
            return f"{len(value)} items, expected {len(like)}"
    return None


def _int(value: int) -> str | None:
    return None if -INT64 <= value < INT64 else f"{value:.3g} is beyond a 64-bit integer"


def _not_finite(value: Any) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not finite"
    if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
        return f"a tensor of shape {tuple(value.shape)} holding non-finite values"
    return None


def _leaves(value: Any, field: str):
    """(leaf, field) of every value under ``value``, walked without recursion."""
    stack = [(value, field)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, _key(at, k)) for k, v in item.items())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(item))
        else:
            yield item, at


def _key(field: str, key: Any) -> str:
    name = key if isinstance(key, str) else repr(key)
    return f"{field}.{name}" if field else name


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor"
    if isinstance(value, (bool, int, float, str)):
        return f"{value!r:.40}"
    return f"a {type(value).__name__}"
