"""The one train/test cut that every bundled task draws its operands from.

Operands are digits, 0..``MAX_OPERAND`` = 9 (so a+b is in [0, 18]), as in the reference example.
The 10×10 operand pairs (a, b) are shuffled with ``seed`` and cut once into test
(``TEST_FRACTION`` of them) and train; every task draws from the same cut. A test record
therefore never shares (a, b) with any train record of any task: the test split asks about
sums never seen in training (a + b may have been seen as b + a). Records cycle through their
split's pairs, so a split of ``size`` records repeats pairs once ``size`` exceeds the number
of pairs (20 test, 80 train). Everything is drawn from ``random.Random`` seeded by
(task, split, seed): the same arguments give the same records.
"""

from __future__ import annotations

import random
from functools import lru_cache

MAX_OPERAND = 9
TEST_FRACTION = 0.2
SPLITS = ("train", "test")
DEFAULT_SIZES = {"train": 8000, "test": 500}


@lru_cache(maxsize=8)
def operand_pairs(split: str, seed: int) -> tuple[tuple[int, int], ...]:
    """The (a, b) pairs of one split: a seeded shuffle of all pairs, cut at TEST_FRACTION."""
    pairs = [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    random.Random(f"glassrl-pairs/{seed}").shuffle(pairs)
    n_test = round(len(pairs) * TEST_FRACTION)
    return tuple(pairs[:n_test] if split == "test" else pairs[n_test:])


def draw_pairs(task: str, split: str, seed: int, size: int) -> tuple[random.Random, list[tuple[int, int]]]:
    """``size`` operand pairs of the split, in a seeded order; they repeat only when size > the split.
    Returns the generator too: a task draws the rest of its records from it."""
    rng = random.Random(f"glassrl-task/{task}/{split}/{seed}")
    pool = list(operand_pairs(split, seed))
    drawn: list[tuple[int, int]] = []
    while len(drawn) < size:
        rng.shuffle(pool)
        drawn.extend(pool[: size - len(drawn)])
    return rng, drawn
