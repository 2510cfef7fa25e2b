"""The add task: "{a}+{b}=" answered with the number, "3+4=" → "7".

Operands are digits drawn from the shared train/test cut (:mod:`.splits`). A response is right
when its last number is a+b: :class:`glassrl.rewards.verifiers.NumericVerifier` scores it from
the record's ``metadata["sum"]``.
"""

from __future__ import annotations

import re

from glassrl.data.records import PromptRecord
from glassrl.data.tasks.splits import draw_pairs

NAME = "add"
_QUESTION = re.compile(r"(\d+)\+(\d+)=")


def question(a: int, b: int) -> str:
    return f"{a}+{b}="


def _record(a: int, b: int, source: str) -> PromptRecord:
    return PromptRecord(question(a, b), str(a + b), {"a": a, "b": b, "sum": a + b, "task": NAME}, source)


def records(split: str, seed: int, size: int) -> list[PromptRecord]:
    """``size`` records of ``split``: operand pairs from the shared cut."""
    _, pairs = draw_pairs(NAME, split, seed, size)
    return [_record(a, b, f"task:{NAME}/{split}#{i}") for i, (a, b) in enumerate(pairs)]


def record_for_prompt(text: str) -> PromptRecord | None:
    """The record of a typed prompt "a+b=" (any number of digits); None when ``text`` is not of this form."""
    if m := _QUESTION.fullmatch(text):
        a, b = map(int, m.groups())
        return _record(a, b, repr(text))
    return None
