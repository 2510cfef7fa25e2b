"""The bundled tasks: small arithmetic prompts generated from a seed, with train/test splits.

``arith-verify`` generalises the reference documents' example ("请问1+1=2？" → "是的，等于2！"):

    zh  "请问{a}+{b}={c}？"  →  "是的，等于{a+b}！"  if c == a+b  else  "不是，等于{a+b}！"
    en  "Is {a}+{b}={c}?"    →  "Yes, it equals {a+b}!"  /  "No, it equals {a+b}!"

An answer counts only in the question's language (ArithVerifyVerifier checks the verdict word).

``add``: "{a}+{b}=" → str(a+b).

Number ranges: a and b are digits, 0..``MAX_OPERAND`` = 9 (so a+b is in [0, 18]), as in the
reference example. About half of the arith-verify prompts are true; a false one has
c = a+b+δ with δ drawn from ``DELTAS`` (a slip of one or two, or in the tens digit), so the
verdict cannot be guessed from the size of c. Why digits: the verdict comes *before* the sum
in the answer, so the model must add silently and compare with c. A small model learns that
for digits within a few hundred SFT steps on 2 CPU cores, and only partly for unseen operand
pairs, while the answer format is learnt fully: visible headroom for RL. (With operands up to
99 the same model, after 3000 steps, still got the verdict right only at chance.)

Splits: the 10×10 operand pairs (a, b) are shuffled with ``seed`` and cut once into test
(``TEST_FRACTION`` of them) and train; both tasks draw from the same cut. A test record
therefore never shares (a, b), let alone (a, b, c, lang), with any train record of either
task: the test split asks about sums never seen in training (a + b may have been seen as
b + a). Records cycle through their split's pairs, so a split of ``size`` records repeats
pairs once ``size`` exceeds the number of pairs (20 test, 80 train). Everything is drawn from
``random.Random`` seeded by (task, split, seed): the same arguments give the same records.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import lru_cache

from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError

MAX_OPERAND = 9
TEST_FRACTION = 0.2
# Slips of one or two in the units digit, or of one in the tens digit.
DELTAS = (-10, -2, -1, 1, 2, 10)
SPLITS = ("train", "test")
DEFAULT_SIZES = {"train": 8000, "test": 500}


@lru_cache(maxsize=8)
def _operand_pairs(split: str, seed: int) -> tuple[tuple[int, int], ...]:
    """The (a, b) pairs of one split: a seeded shuffle of all pairs, cut at TEST_FRACTION."""
    pairs = [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    random.Random(f"glassrl-pairs/{seed}").shuffle(pairs)
    n_test = round(len(pairs) * TEST_FRACTION)
    return tuple(pairs[:n_test] if split == "test" else pairs[n_test:])


def _draw_pairs(task: str, split: str, seed: int, size: int) -> tuple[random.Random, list[tuple[int, int]]]:
    """``size`` operand pairs of the split, in a seeded order; they repeat only when size > the split."""
    rng = random.Random(f"glassrl-task/{task}/{split}/{seed}")
    pool = list(_operand_pairs(split, seed))
    drawn: list[tuple[int, int]] = []
    while len(drawn) < size:
        rng.shuffle(pool)
        drawn.extend(pool[: size - len(drawn)])
    return rng, drawn


def verify_answer(is_true: bool, total: int, lang: str) -> str:
    """The reference answer to an arith-verify question, in language ``lang`` ("zh" or "en")."""
    if lang == "zh":
        return f"{'是的' if is_true else '不是'}，等于{total}！"
    return f"{'Yes' if is_true else 'No'}, it equals {total}!"


def arith_verify(split: str, seed: int, size: int) -> list[PromptRecord]:
    """ "Is a+b=c?" in Chinese or English, answered with a verdict and the true sum."""
    rng, pairs = _draw_pairs("arith-verify", split, seed, size)
    records = []
    for i, (a, b) in enumerate(pairs):
        total = a + b
        lang = rng.choice(("zh", "en"))
        is_true = rng.random() < 0.5
        delta = rng.choice(DELTAS)
        c = total if is_true else (total + delta if total + delta >= 0 else total - delta)
        prompt = f"请问{a}+{b}={c}？" if lang == "zh" else f"Is {a}+{b}={c}?"
        answer = verify_answer(is_true, total, lang)
        metadata = {"a": a, "b": b, "c": c, "sum": total, "is_true": is_true, "lang": lang, "task": "arith-verify"}
        records.append(PromptRecord(prompt, answer, metadata, f"task:arith-verify/{split}#{i}"))
    return records


def add(split: str, seed: int, size: int) -> list[PromptRecord]:
    """ "a+b=" answered with the number."""
    _, pairs = _draw_pairs("add", split, seed, size)
    return [
        PromptRecord(f"{a}+{b}=", str(a + b), {"a": a, "b": b, "sum": a + b, "task": "add"}, f"task:add/{split}#{i}")
        for i, (a, b) in enumerate(pairs)
    ]


# name -> generator(split, seed, size) -> records
TASKS: dict[str, Callable[[str, int, int], list[PromptRecord]]] = {
    "arith-verify": arith_verify,
    "add": add,
}


def load_task(name: str, split: str, *, seed: int = 0, size: int | None = None) -> list[PromptRecord]:
    """The records of a bundled task; ``size`` defaults to ``DEFAULT_SIZES[split]``."""
    if name not in TASKS:
        raise GlassrlError(f"unknown task {name!r}; valid tasks: {', '.join(TASKS)}")
    if split not in SPLITS:
        raise GlassrlError(f"task {name}: unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    size = DEFAULT_SIZES[split] if size is None else size
    if size < 0:
        raise GlassrlError(f"task {name}: size must be >= 0, got {size}")
    return TASKS[name](split, seed, size)


def sft_pairs(name: str, split: str, seed: int = 0) -> list[tuple[str, str]]:
    """(prompt, reference answer) pairs of a bundled task, for supervised fine-tuning."""
    return [(str(r.prompt), str(r.answer)) for r in load_task(name, split, seed=seed)]
