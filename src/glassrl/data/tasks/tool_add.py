"""The tool-add task: additions of 3- and 4-digit numbers, with a calculator the model may call.

"4821+975=?" → "5796". Too large for the default model to add in its head (it learnt sums of
two digits), easy with the ``calculator`` tool (:mod:`glassrl.agents.calculator`). An
episode in the tagged call format (:mod:`glassrl.agents.formats`)::

    4821+975=?  <call>calculator 4821+975</call> <result>5796</result>\\n 5796<|eos|>
    (prompt)    (generated, trains)            (observation)            (generated)

Reward (the two parts the issue names):
- the final answer (the last turn, when it is not a call) is right when its last number is
  a+b: :class:`glassrl.rewards.verifiers.NumericVerifier` scores it 1 or 0 from
  ``metadata["sum"]`` (``grade`` is the same rule);
- a format reward of ``VALID_CALL_REWARD`` for the first call that parsed and ran, given by the
  environment (``ToolEnvironment(valid_call_reward=VALID_CALL_REWARD)``) as the reward part
  "valid_call". It is small beside the answer's 1, so calling without answering right is
  never worth more than answering right.

The prompt form ``"{a}+{b}=?"`` is distinct from the add task's ``"{a}+{b}="``, so a typed
prompt belongs to one task. ``TOOLS`` (also in every record's metadata) names the tools the
episode offers.

Splits: each operand has 3 or 4 digits (one of the two with equal chance, then uniform); a pair
(a, b) belongs to the test split when a seeded hash puts it there (``TEST_FRACTION`` of all
pairs), so no test pair is ever a train pair, for any split sizes. The pairs are far more than
any split draws; records are drawn without repeats from ``random.Random`` seeded by (task,
split, seed).
"""

from __future__ import annotations

import random
import re
import zlib

from glassrl.data.answers import extract_last_number
from glassrl.data.records import PromptRecord

NAME = "tool-add"
TOOLS = ("calculator",)
VALID_CALL_REWARD = 0.1
DIGITS = (3, 4)
TEST_FRACTION = 0.2
_QUESTION = re.compile(r"(\d+)\+(\d+)=\?")


def question(a: int, b: int) -> str:
    return f"{a}+{b}=?"


def split_of(a: int, b: int, seed: int) -> str:
    """ "test" for a seeded ``TEST_FRACTION`` of the pairs, "train" for the rest."""
    bucket = zlib.crc32(f"{NAME}/{seed}/{a}+{b}".encode()) % 1000
    return "test" if bucket < TEST_FRACTION * 1000 else "train"


def _record(a: int, b: int, source: str) -> PromptRecord:
    metadata = {"a": a, "b": b, "sum": a + b, "task": NAME, "tools": list(TOOLS)}
    return PromptRecord(question(a, b), str(a + b), metadata, source)


def _operand(rng: random.Random) -> int:
    digits = rng.choice(DIGITS)
    return rng.randrange(10 ** (digits - 1), 10**digits)


def records(split: str, seed: int, size: int) -> list[PromptRecord]:
    """``size`` records of ``split``, distinct pairs, in a seeded order."""
    rng = random.Random(f"glassrl-task/{NAME}/{split}/{seed}")
    seen: set[tuple[int, int]] = set()
    out = []
    while len(out) < size:
        a, b = _operand(rng), _operand(rng)
        if (a, b) in seen or split_of(a, b, seed) != split:
            continue
        seen.add((a, b))
        out.append(_record(a, b, f"task:{NAME}/{split}#{len(out)}"))
    return out


def record_for_prompt(text: str) -> PromptRecord | None:
    """The record of a typed prompt "a+b=?" (any number of digits); None for another form."""
    if m := _QUESTION.fullmatch(text):
        a, b = map(int, m.groups())
        return _record(a, b, repr(text))
    return None


def grade(answer: str, record: PromptRecord) -> float:
    """1.0 when the last number of the final answer is a+b, else 0.0 (NumericVerifier's rule)."""
    stated = extract_last_number(answer)
    return float(stated is not None and float(stated) == float(record.metadata["sum"]))
