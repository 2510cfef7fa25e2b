"""add: exact format, the record of a typed prompt."""

from __future__ import annotations

from glassrl.data.tasks import load_task
from glassrl.data.tasks.add import record_for_prompt


def test_format():
    for i, r in enumerate(load_task("add", "test", size=50)):
        a, b = r.metadata["a"], r.metadata["b"]
        assert r.prompt == f"{a}+{b}=" and r.answer == str(a + b)
        assert r.metadata == {"a": a, "b": b, "sum": a + b, "task": "add"}
        assert r.source == f"task:add/test#{i}"


def test_record_for_a_typed_prompt():
    r = record_for_prompt("12+30=")
    assert (r.prompt, r.answer, r.metadata) == ("12+30=", "42", {"a": 12, "b": 30, "sum": 42, "task": "add"})
    assert record_for_prompt("12+30=42") is None and record_for_prompt("Is 1+1=2?") is None
