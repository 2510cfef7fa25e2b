"""The type of every field of a ledger file, checked as a row is read (glassrl.ledger.model.read_jsonl).

A ledger file is JSON a run wrote, but it is read back by ``explain --ledger``, ``diff`` and the
report, which may be handed a file that was edited, garbled or crafted. A value of the wrong type
used to surface far away as a traceback (a ``{}`` response index, a token that is a number, turns
that are a string) or not at all (a NaN step). Each field has one kind:

    int      a JSON integer (not a bool, not 1.0, not NaN)
    number   a JSON number (int or float; NaN and ±inf are values a run may record), read as float
    text     a JSON string
    flag     true or false
    turns    a list of turn objects (glassrl.ledger.model.LedgerTurn), checked field by field

and is either required or may be null (a quantity that was not computed). A wrong one is a
GlassrlError naming ``file:LINE`` and the field.
"""

from __future__ import annotations

import math
from typing import Any

from glassrl.errors import GlassrlError

INT, NUMBER, TEXT, FLAG, TURNS = "an integer", "a number", "a string", "true or false", "a list of turns"
# field -> (kind, may be null)
FIELDS: dict[str, tuple[str, bool]] = {
    # the run's
    "step": (INT, True),
    "estimator": (TEXT, False),
    "gamma": (NUMBER, False),
    "lam": (NUMBER, True),
    "beta": (NUMBER, False),
    "kl_kind": (TEXT, True),
    # a response's
    "response_index": (INT, False),
    "prompt": (TEXT, False),
    "response": (TEXT, False),
    "score": (NUMBER, True),
    "group_id": (INT, True),
    "length": (INT, False),
    "finish_reason": (TEXT, True),
    "baseline_reward": (NUMBER, True),
    "turns": (TURNS, True),
    "prompt_as_seen": (TEXT, True),
    # a token's
    "index": (INT, False),
    "token_id": (INT, True),
    "token": (TEXT, False),
    "logprobs": (NUMBER, True),
    "ref_logprobs": (NUMBER, True),
    "kl": (NUMBER, True),
    "token_scores": (NUMBER, True),
    "token_rewards": (NUMBER, True),
    "values": (NUMBER, True),
    "deltas": (NUMBER, True),
    "advantages": (NUMBER, True),
    "returns": (NUMBER, True),
    "whitened_advantages": (NUMBER, True),
    "response_mask": (FLAG, False),
    "step_end": (FLAG, True),
    "role": (TEXT, True),
    "turn": (INT, True),
    "policy_version": (INT, True),
    "staleness": (INT, True),
    "rollout_logprobs": (NUMBER, True),
    "is_weights": (NUMBER, True),
    "is_keep": (FLAG, True),
}
ROLES = ("generated", "observation")
_TURN = {"start": INT, "end": INT, "observation_end": INT, "finish_reason": TEXT}


def checked(obj: dict[str, Any], names: tuple[str, ...], where: str) -> dict[str, Any]:
    """``{name: value}`` of ``obj`` for ``names`` (absent: None), each of its field's kind (numbers
    as float); GlassrlError naming ``where`` and the field otherwise."""
    out = {}
    for name in names:
        value = obj.get(name)
        kind, nullable = FIELDS[name]
        if value is None:
            if not nullable:
                raise GlassrlError(f"{where}: field {name!r}: expected {kind}, got null")
        elif kind is TURNS:
            turns(value, where)
        else:
            value = _value(value, kind, where, name)
        out[name] = value
    if out.get("role") not in (None, *ROLES):
        raise GlassrlError(f"{where}: field 'role': expected one of {', '.join(ROLES)} or null, got {out['role']!r}")
    return out


def _value(value: Any, kind: str, where: str, name: str) -> Any:
    t = type(value)
    if kind is NUMBER and t in (int, float):
        try:
            return float(value)
        except OverflowError:
            raise GlassrlError(f"{where}: field {name!r}: {_shown(value)} is beyond a float's range") from None
    if (kind is INT and t is int) or (kind is TEXT and t is str) or (kind is FLAG and t is bool):
        return value
    null = " or null" if FIELDS.get(name, (kind, False))[1] else ""
    raise GlassrlError(f"{where}: field {name!r}: expected {kind}{null}, got {_shown(value)}")


def turns(value: Any, where: str) -> None:
    """A response's turns: a list of objects with integer start ≤ end ≤ observation_end, a string
    finish_reason, tool_calls a list of objects and reward_parts an object of numbers."""
    if not isinstance(value, list):
        raise GlassrlError(f"{where}: field 'turns': expected {TURNS} or null, got {_shown(value)}")
    for k, turn in enumerate(value):
        field = f"turns[{k}]"
        if not isinstance(turn, dict):
            raise GlassrlError(f"{where}: field {field!r}: expected an object, got {_shown(turn)}")
        unknown = sorted(set(turn) - {*_TURN, "tool_calls", "reward_parts", "error"})
        if unknown:
            raise GlassrlError(f"{where}: field {field!r}: unknown key {unknown[0]!r}")
        for key, kind in _TURN.items():
            if kind is INT and type(turn.get(key)) is not int or kind is TEXT and type(turn.get(key)) is not str:
                raise GlassrlError(f"{where}: field '{field}.{key}': expected {kind}, got {_shown(turn.get(key))}")
        if not 0 <= turn["start"] <= turn["end"] <= turn["observation_end"]:
            raise GlassrlError(f"{where}: field {field!r}: expected 0 <= start <= end <= observation_end")
        if type(turn.get("error", "")) is not str:
            raise GlassrlError(f"{where}: field '{field}.error': expected {TEXT}, got {_shown(turn['error'])}")
        calls = turn.get("tool_calls", [])
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise GlassrlError(f"{where}: field '{field}.tool_calls': expected a list of objects")
        parts = turn.get("reward_parts", {})
        if not isinstance(parts, dict):
            raise GlassrlError(f"{where}: field '{field}.reward_parts': expected an object of numbers")
        turn["reward_parts"] = {k: _value(v, NUMBER, where, f"{field}.reward_parts.{k}") for k, v in parts.items()}


def _shown(value: Any) -> str:
    """A value in a message, short (a crafted field may be a megabyte)."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"an integer of {len(str(abs(value)))} digits"
    text = (
        f"{'an object' if isinstance(value, dict) else 'a list'} {value!r}"
        if isinstance(value, (dict, list))
        else repr(value)
    )
    return text if len(text) <= 60 else text[:57] + "..."
