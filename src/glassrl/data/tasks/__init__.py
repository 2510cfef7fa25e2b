"""The bundled tasks: small arithmetic prompts generated from a seed, with train/test splits.

One module per task (nanochat's ``tasks/`` layout), each owning its prompt and answer formats,
its records and the record of a typed prompt:

- :mod:`.arith_verify`: "请问3+4=8？" → "不是，等于7！", and in English "Is 3+4=8?" → "No, it equals 7!";
  it also owns the rule that judges a response (``grade``) and the default model's evaluation;
- :mod:`.add`: "3+4=" → "7";
- agentic (``AGENTIC_TASKS``, answered over turns with tools, docs/agentic.md): :mod:`.tool_add`
  ("4821+975=?" with a calculator), :mod:`.research` (the reference dialogue's report).

Both draw their operand pairs from one seeded train/test cut (:mod:`.splits`), so no test
record of either task asks about an operand pair that any train record has.

A config names a task's records ``task:NAME/SPLIT``, SPLIT optional (training data defaults
to train); :func:`parse_task` is the one parser of that form, and :func:`held_out_split`
names the test split of a task spec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from glassrl.data.records import PromptRecord
from glassrl.data.tasks import add, arith_verify, research, tool_add
from glassrl.data.tasks.splits import DEFAULT_SIZES, SPLITS
from glassrl.errors import GlassrlError

PREFIX = "task:"


@dataclass(frozen=True)
class Task:
    """A bundled task's entry points.

    records:           (split, seed, size) -> its records
    record_for_prompt: a typed prompt in the task's form -> its record (reference answer and
                       metadata, as ``records`` would give); None for another form
    """

    records: Callable[[str, int, int], list[PromptRecord]]
    record_for_prompt: Callable[[str], PromptRecord | None]


TASKS: dict[str, Task] = {
    arith_verify.NAME: Task(arith_verify.records, arith_verify.record_for_prompt),
    add.NAME: Task(add.records, add.record_for_prompt),
}
# Tasks answered over several turns with tools (glassrl.agents.tasks holds their environments).
# Kept apart from TASKS: the default model's tokenizer and SFT mix are built from TASKS' text, and
# must not change when an agentic task is added.
AGENTIC_TASKS: dict[str, Task] = {
    tool_add.NAME: Task(tool_add.records, tool_add.record_for_prompt),
    research.NAME: Task(research.records, research.record_for_prompt),
}


@dataclass(frozen=True)
class TaskRef:
    """A split of a bundled task, as a config names it: ``task:NAME/SPLIT``."""

    name: str
    split: str

    def __str__(self) -> str:
        return f"{PREFIX}{self.name}/{self.split}"


def parse_task(spec: str, *, split: str = "train") -> TaskRef | None:
    """``"task:NAME[/SPLIT]"`` -> TaskRef, SPLIT defaulting to ``split``; any other string (a
    file path) -> None. The name is not checked here: the loader knows which names it serves."""
    if not spec.startswith(PREFIX):
        return None
    name, _, given = spec[len(PREFIX) :].partition("/")
    return TaskRef(name, given or split)


def held_out_split(spec: str) -> str | None:
    """The test split of a task spec ("task:add", "task:add/train" -> "task:add/test"); None for a path."""
    ref = parse_task(spec)
    return None if ref is None else str(TaskRef(ref.name, "test"))


def load_task(name: str, split: str, *, seed: int = 0, size: int | None = None) -> list[PromptRecord]:
    """The records of a bundled task; ``size`` defaults to ``DEFAULT_SIZES[split]``."""
    every = {**TASKS, **AGENTIC_TASKS}
    if name not in every:
        raise GlassrlError(f"unknown task {name!r}; valid tasks: {', '.join(every)}")
    if split not in SPLITS:
        raise GlassrlError(f"task {name}: unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    size = DEFAULT_SIZES[split] if size is None else size
    if size < 0:
        raise GlassrlError(f"task {name}: size must be >= 0, got {size}")
    return every[name].records(split, seed, size)


def sft_pairs(name: str, split: str, seed: int = 0) -> list[tuple[str, str]]:
    """(prompt, reference answer) pairs of a bundled task, for supervised fine-tuning."""
    return [(str(r.prompt), str(r.answer)) for r in load_task(name, split, seed=seed)]


def record_for_prompt(text: str) -> PromptRecord | None:
    """The record of a typed prompt in some bundled task's form (its reference answer and
    metadata, so that a reward can score a response to it); None when no task has that form."""
    for task in (*TASKS.values(), *AGENTIC_TASKS.values()):
        if (record := task.record_for_prompt(text)) is not None:
            return record
    return None
