"""The arith-verify task: "is a+b=c?" in Chinese or English, answered with a verdict and the true sum.

It generalises the reference documents' example ("请问1+1=2？" → "是的，等于2！"):

    zh  "请问{a}+{b}={c}？"  →  "是的，等于{a+b}！"  if c == a+b  else  "不是，等于{a+b}！"
    en  "Is {a}+{b}={c}?"    →  "Yes, it equals {a+b}!"  /  "No, it equals {a+b}!"

An answer counts only in the question's language: "是的，等于7！" to "Is 3+4=7?" is right
arithmetic in the wrong language (DeepSeek-R1's language consistency, Guo et al. 2025, §2.3.3,
as a hard requirement).

Operands are digits drawn from the shared train/test cut (:mod:`.splits`). About half of the
prompts are true; a false one has c = a+b+δ with δ drawn from ``DELTAS`` (a slip of one or two,
or in the tens digit), so the verdict cannot be guessed from the size of c. Why digits: the
verdict comes *before* the sum in the answer, so the model must add silently and compare with c.
A small model learns that for digits within a few hundred SFT steps on 2 CPU cores, and only
partly for unseen operand pairs, while the answer format is learnt fully: visible headroom for
RL. (With operands up to 99 the same model, after 3000 steps, still got the verdict right only
at chance.)

This module owns the task: the formats (``question``, ``reference_answer``), the records
(``records``), the record of a typed prompt (``record_for_prompt``), the rule that judges a
response (``grade``) and the scores of the default model's greedy answers (``evaluate``). The
reward source that scores with ``grade`` is :class:`glassrl.rewards.verifiers.ArithVerifyVerifier`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from glassrl.data.answers import extract_last_number, normalize_text
from glassrl.data.records import PromptRecord
from glassrl.data.tasks.splits import draw_pairs

NAME = "arith-verify"
LANGUAGES = ("zh", "en")
# Slips of one or two in the units digit, or of one in the tens digit.
DELTAS = (-10, -2, -1, 1, 2, 10)
# (language, c == a+b) -> the verdict word that starts the answer
VERDICTS = {("zh", True): "是的", ("zh", False): "不是", ("en", True): "Yes", ("en", False): "No"}
_QUESTIONS = {"zh": re.compile(r"请问(\d+)\+(\d+)=(\d+)？"), "en": re.compile(r"Is (\d+)\+(\d+)=(\d+)\?")}
_ANSWERS = {"zh": re.compile(r"(是的|不是)，等于\d+！"), "en": re.compile(r"(Yes|No), it equals \d+!")}
_COMMAS = ("，", ",")


def question(a: int, b: int, c: int, lang: str) -> str:
    """The prompt "is a+b=c?" in language ``lang`` ("zh" or "en")."""
    return f"请问{a}+{b}={c}？" if lang == "zh" else f"Is {a}+{b}={c}?"


def reference_answer(is_true: bool, total: int, lang: str) -> str:
    """The reference answer to an arith-verify question, in language ``lang`` ("zh" or "en")."""
    if lang == "zh":
        return f"{VERDICTS['zh', is_true]}，等于{total}！"
    return f"{VERDICTS['en', is_true]}, it equals {total}!"


def _record(a: int, b: int, c: int, lang: str, source: str) -> PromptRecord:
    total = a + b
    metadata = {"a": a, "b": b, "c": c, "sum": total, "is_true": c == total, "lang": lang, "task": NAME}
    return PromptRecord(question(a, b, c, lang), reference_answer(c == total, total, lang), metadata, source)


def records(split: str, seed: int, size: int) -> list[PromptRecord]:
    """``size`` records of ``split``: operand pairs from the shared cut, then per record the
    language, whether it is true, and the slip of a false one, in that order from one generator."""
    rng, pairs = draw_pairs(NAME, split, seed, size)
    out = []
    for i, (a, b) in enumerate(pairs):
        total = a + b
        lang = rng.choice(LANGUAGES)
        is_true = rng.random() < 0.5
        delta = rng.choice(DELTAS)
        c = total if is_true else (total + delta if total + delta >= 0 else total - delta)
        out.append(_record(a, b, c, lang, f"task:{NAME}/{split}#{i}"))
    return out


def record_for_prompt(text: str) -> PromptRecord | None:
    """The record of a typed prompt in this task's form ("请问3+4=8？", "Is 3+4=8?"; any number of
    digits), with its reference answer and metadata; None when ``text`` is not of this form."""
    for lang, pattern in _QUESTIONS.items():
        if m := pattern.fullmatch(text):
            a, b, c = map(int, m.groups())
            return _record(a, b, c, lang, repr(text))
    return None


@dataclass(frozen=True)
class Grade:
    """What :func:`grade` read in a response.

    verdict:    True for a yes-word (是…, yes), False for a no-word (不…, no), None for neither
    language:   the verdict word's language, "zh" or "en" (None without one)
    stated:     the last number after the first comma, canonical ("7"); None if there is none
    verdict_ok: the right verdict, in the question's language
    sum_ok:     the stated number is the true sum
    comma:      index of the first comma ("，" or ","), which ends the verdict; -1 without one
    """

    verdict: bool | None
    language: str | None
    stated: str | None
    verdict_ok: bool
    sum_ok: bool
    comma: int


def grade(response: str, metadata: Mapping[str, Any]) -> Grade:
    """Judge ``response`` against a record's ``metadata`` (``is_true``, ``sum``, optional ``lang``).

    The verdict is read before the first comma and the sum after it (the whole response for both
    when there is no comma); text is NFKC-normalised, so full-width and ASCII forms count alike.
    Right means ``verdict_ok and sum_ok``.
    """
    comma = min((i for i in (response.find(c) for c in _COMMAS) if i >= 0), default=-1)
    verdict_text = response[:comma] if comma >= 0 else response
    number_text = response[comma + 1 :] if comma >= 0 else response
    verdict, language = _verdict(verdict_text)
    stated = extract_last_number(number_text)
    language_ok = metadata.get("lang") in (None, language)
    verdict_ok = verdict is not None and verdict == bool(metadata["is_true"]) and language_ok
    sum_ok = stated is not None and float(stated) == float(metadata["sum"])
    return Grade(verdict, language, stated, verdict_ok, sum_ok, comma)


def _verdict(text: str) -> tuple[bool | None, str | None]:
    """(verdict, its language): "是…" -> (True, "zh"), "不…" -> (False, "zh"), "yes…" -> (True, "en"),
    "no…" -> (False, "en"), anything else -> (None, None)."""
    text = normalize_text(text).lower()
    if text.startswith("不"):
        return False, "zh"
    if text.startswith("是"):
        return True, "zh"
    if re.match(r"no\b", text):
        return False, "en"
    if re.match(r"yes\b", text):
        return True, "en"
    return None, None


def evaluate(records: Sequence[PromptRecord], answers: Sequence[tuple[str, bool]]) -> dict[str, float]:
    """Scores of answers ``(text, whether it ended with EOS)`` to ``records``, as fractions of the records:

    exact:   the reference answer exactly, then EOS
    verdict: the right verdict word (是的/不是, Yes/No) first
    format:  "(是的|不是)，等于N！" or "(Yes|No), it equals N!" in the prompt's language, then EOS

    Stricter than :func:`grade` (exact text, no normalisation): it measures what greedy decoding
    of the default model learnt, not what a reward accepts.
    """
    exact = verdict = form = 0
    for r, (text, ended) in zip(records, answers, strict=True):
        lang = r.metadata["lang"]
        exact += ended and text == r.answer
        verdict += text.startswith(VERDICTS[lang, r.metadata["is_true"]])
        form += ended and _ANSWERS[lang].fullmatch(text) is not None
    n = len(records)
    return {"n": n, "exact": exact / n, "verdict": verdict / n, "format": form / n}
