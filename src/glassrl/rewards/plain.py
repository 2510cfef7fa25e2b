"""The plain form of a reward result: what crosses the process boundary from a reward worker.

A user's function may return anything: a numpy scalar, a tensor, ``10**400``, NaN, a date or a
set in its details, or an object built to attack whoever unpickles it. The worker converts the
value here — inside the worker, under the call's time limit, so a conversion that hangs is the
call's timeout — into a plain dict that JSON carries (:mod:`glassrl.worker_pool`)::

    {"status": "ok", "score": float, "process_rewards": [[end, reward], ...], "details": {...}}
    {"status": "error", "message": "..."}

and the trainer turns that dict into a :class:`~glassrl.rewards.base.RewardResult`
(:func:`result_from_plain`). A score must be a finite number: NaN, inf and an integer beyond a
float's range are an ``error`` result saying so, never a number that poisons the batch.
Details are kept as far as JSON can hold them: sets become sorted lists, dates ISO strings,
arrays lists, non-finite floats ``null``, anything else its ``str``.
"""

from __future__ import annotations

import datetime
import math
import numbers
from collections.abc import Mapping
from typing import Any

from glassrl.rewards.base import RewardResult

_MAX_DEPTH = 32
_MAX_TEXT = 1000  # characters kept of an object's str() in details


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a user object whose __repr__ raises
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def finite_number(value: Any, what: str = "score") -> float:
    """``value`` as a finite float; ValueError with a one-line reason otherwise.

    Accepts bool, int, float and any ``numbers.Real``, and numpy/torch scalars (via ``.item()``).
    """
    if not isinstance(value, (bool, int, float, str, bytes)) and callable(getattr(value, "item", None)):
        try:
            value = value.item()  # numpy scalar, one-element array, 0-d tensor
        except Exception:  # noqa: BLE001 - not a scalar: reported as a wrong type below
            pass
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            raise ValueError(
                f"{what} must be a finite number, got an integer of {value.bit_length()} bits (beyond a float's range)"
            ) from None
    if isinstance(value, numbers.Real):
        try:
            number = float(value)
        except (OverflowError, ValueError, TypeError) as err:
            raise ValueError(f"{what} must be a finite number, got {_short(value)} ({err})") from None
        if not math.isfinite(number):
            raise ValueError(f"{what} must be a finite number, got {number}")
        return number
    raise ValueError(f"{what} must be a number, got {type(value).__name__} {_short(value)}")


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON-able data (see the module docstring)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if value.bit_length() <= 63 else f"<integer of {value.bit_length()} bits>"
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth >= _MAX_DEPTH:
        return _short(value)
    if isinstance(value, Mapping):
        return {k if isinstance(k, str) else str(plain(k, depth + 1)): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((plain(v, depth + 1) for v in value), key=repr)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if callable(getattr(value, "tolist", None)):  # numpy arrays and scalars, tensors
        try:
            return plain(value.tolist(), depth + 1)
        except Exception:  # noqa: BLE001 - fall back to its text
            pass
    try:
        text = str(value)
    except Exception:  # noqa: BLE001 - a user object whose __str__ raises
        return _short(value)
    return text[:_MAX_TEXT]


def plain_result(value: Any, response_chars: int) -> dict[str, Any]:
    """A reward function's return value — a number, or a dict with ``"score"``, optional
    ``"process_rewards"`` (``[end character offset, reward]`` pairs, offsets increasing in
    1..``response_chars``) and any other keys (kept as details) — as its plain form."""
    if isinstance(value, Mapping):
        if "score" not in value:
            keys = sorted(map(str, value))
            return {"status": "error", "message": f"returned a dict without 'score' (keys: {keys})"}
        details = plain({k: v for k, v in value.items() if k not in ("score", "process_rewards")})
        score, steps = value["score"], value.get("process_rewards") or ()
    else:
        details, score, steps = {}, value, ()
    try:
        number = finite_number(score)
        pairs = _steps(steps, response_chars)
    except ValueError as err:
        return {"status": "error", "message": str(err)}
    return {"status": "ok", "score": number, "process_rewards": pairs, "details": details}


def _steps(steps: Any, response_chars: int) -> list[list[float]]:
    try:
        pairs = [(end, reward) for end, reward in steps]
    except (TypeError, ValueError):
        raise ValueError(f"process_rewards must be [end, reward] pairs, got {_short(steps)}") from None
    out, previous = [], 0
    for end, reward in pairs:
        if isinstance(end, bool) or not isinstance(end, int) or not previous < end <= response_chars:
            raise ValueError(
                f"process reward end {_short(end)} must be an increasing character offset in 1..{response_chars}"
            )
        out.append([end, finite_number(reward, f"process reward at {end}")])
        previous = end
    return out


def result_from_plain(reply: Any, prefix: str) -> RewardResult:
    """The trainer's side: a plain dict (as JSON decoded it) -> RewardResult; messages start with ``prefix``."""
    try:
        if reply["status"] == "ok":
            steps = [(int(end), float(reward)) for end, reward in reply["process_rewards"]]
            result = RewardResult.ok(float(reply["score"]), steps, dict(reply["details"]))
            if result.is_ok:
                return result
            return RewardResult.error(f"{prefix}: {result.message}")
        return RewardResult.error(f"{prefix}: {reply['message']}")
    except (KeyError, TypeError, ValueError):
        return RewardResult.error(f"{prefix}: malformed result from the reward worker")
