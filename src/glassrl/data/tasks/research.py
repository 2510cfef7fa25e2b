"""The research task: the reference dialogue's agentic question, over the bundled offline corpus.

dialogue-agentic-rl-rubric-reward.md, part 1: it is May 2025; the user asks for a summary of
Google's 2025 financial report with a focus on Cloud revenue. Only the first-quarter report is
out. The agent has ``search`` and ``open_page`` over the bundled corpus
(src/glassrl/rollout/agent/corpus/: the official Q1 release, a Chinese news report of it, an
analyst forecast, and two rumour pages claiming "5 trillion for the full year"), and writes a
report. The pages are fictional snapshots whose figures follow the dialogue (Cloud revenue
$11.5 billion in Q1 2025).

The report is judged by the dialogue's rubric (part 2), here by rules on the final answer's
text (``CRITERIA``, each scoring 0 or 1), total Σ w_i·s_i with weights 1 + 1 + 0.5 = 2.5:

- accuracy (w = 1.0): states the official Cloud revenue, $11.5 billion (115 亿美元);
- temporal (w = 1.0): says it is the first quarter, and presents nothing unreported as fact:
  no rumour figure (5 trillion, 5 万亿), and a sentence about the full year or with the
  analysts' full-year forecast ($50 billion) that carries a number must say it is a forecast
  or not yet reported (``HEDGES``);
- citation (w = 0.5): cites the official release with ``\\cite{…}`` (its url or page id), the
  format every prompt asks for.

The rubric source is :func:`glassrl.rewards.research.research_rubric`, which runs these rules
through :class:`glassrl.rewards.rubric.RubricSource` (a criterion may be judged by a model
instead). The dialogue's counter-example (opening the rumour page and reporting "5 trillion for
the full year", citing it) scores 0 here: its figure is not the official one, it states a rumour
as fact, and it cites the rumour page. (The dialogue gives it 0.5, keeping the format point;
this rubric gives that point only for citing the official release.)

Records: six phrasings of the question, three Chinese and three English, each stating the date
and the citation format; the last of each language is the test split, the others train.
Records cycle through their split's phrasings. ``reference_answer`` is a report that scores 2.5.
"""

from __future__ import annotations

import re

from glassrl.data.records import PromptRecord

NAME = "research"
TOOLS = ("search", "open_page")
OFFICIAL_ID = "abc-2025-q1"
OFFICIAL_URL = "https://abc.xyz/investor/2025-q1.pdf"

# (language, question); the last of each language is the test split.
QUESTIONS = (
    ("zh", "今天是2025年5月15日。帮我总结 Google 2025年的财报，重点关注 Cloud 业务的营收。用 \\cite{网址} 标注来源。"),
    ("zh", "现在是2025年5月。Google Cloud 2025年的营收是多少？请写一份简短报告，用 \\cite{网址} 注明来源。"),
    (
        "zh",
        "今天是2025年5月20日。请调研 Alphabet 2025年的财务表现，尤其是 Google Cloud 的收入，用 \\cite{网址} 引用可靠来源。",
    ),
    (
        "en",
        "Today is May 15, 2025. Summarise Google's 2025 financial results, focusing on Cloud revenue. Cite as \\cite{url}.",
    ),
    (
        "en",
        "It is May 2025. How much revenue did Google Cloud make in 2025? Write a short report; cite as \\cite{url}.",
    ),
    (
        "en",
        "Today is 20 May 2025. Research Alphabet's 2025 earnings, especially Google Cloud revenue; cite as \\cite{url}.",
    ),
)
SPLIT_QUESTIONS = {
    "train": tuple(i for i, (lang, _) in enumerate(QUESTIONS) if i not in (2, 5)),
    "test": (2, 5),
}
REFERENCE_ANSWERS = {
    "zh": f"根据 Alphabet 发布的2025年第一季度财报 \\cite{{{OFFICIAL_URL}}}，Google Cloud 营收为115亿美元。"
    "2025年全年财报尚未发布。",
    "en": f"According to Alphabet's first quarter 2025 results \\cite{{{OFFICIAL_URL}}}, Google Cloud revenue was "
    "$11.5 billion. Full-year 2025 results have not been reported yet.",
}

_OFFICIAL_FIGURE = re.compile(r"11\.5\s*(?:billion|bn|b\b)|115\s*亿", re.I)
_QUARTER = re.compile(r"\bQ1\b|first[- ]quarter|1st quarter|第一季度|一季度|第1季度", re.I)
_RUMOUR = re.compile(r"5\s*(?:trillion|万亿|tn\b)|5,?000\s*billion", re.I)
# What is not reported yet: the full year, and the analysts' forecast ($50 billion for the year).
_UNREPORTED = re.compile(r"full[- ]year|whole year|全年|50\s*billion|500\s*亿", re.I)
# Words that mark a figure as not a reported fact.
HEDGES = re.compile(
    r"not (?:yet )?(?:been )?(?:reported|released|published|out)|forecast|expect|estimate|predict|rumou?r|"
    r"unverified|尚未|还未|未发布|未公布|没有公布|预测|预期|预计|估计|传言|谣言",
    re.I,
)
_NUMBER = re.compile(r"\d")
_SENTENCES = re.compile(r"(?<=[.!?。！？；;\n])\s*")
_CITE = re.compile(r"\\cite\{([^}]*)\}")


def accuracy(report: str) -> float:
    """准确性: states the official Cloud revenue figure ($11.5 billion, 115 亿)."""
    return float(bool(_OFFICIAL_FIGURE.search(report)))


def temporal(report: str) -> float:
    """时间正确性: names the first quarter; states no rumour figure; every sentence that gives a
    number about the full year or a forecast says it is not (yet) a reported fact. Citation keys
    are not read (the official url holds "q1")."""
    report = _CITE.sub("", report)
    if not _QUARTER.search(report) or _RUMOUR.search(report):
        return 0.0
    for sentence in _SENTENCES.split(report):
        if _UNREPORTED.search(sentence) and _NUMBER.search(sentence) and not HEDGES.search(sentence):
            return 0.0
    return 1.0


def citation(report: str) -> float:
    """引用规范: cites the official release, ``\\cite{url}`` or ``\\cite{page id}``."""
    keys = {key.strip() for cited in _CITE.findall(report) for key in cited.split(",")}
    return float(bool(keys & {OFFICIAL_URL, OFFICIAL_ID}))


# (name, weight w_i, rule scoring the final report in {0, 1})
CRITERIA = (("accuracy", 1.0, accuracy), ("temporal", 1.0, temporal), ("citation", 0.5, citation))


def grade(report: str) -> dict[str, float]:
    """Each criterion's score s_i of a report."""
    return {name: rule(report) for name, _, rule in CRITERIA}


def score(report: str) -> float:
    """Σ_i w_i · s_i (at most 2.5)."""
    scores = grade(report)
    return sum(weight * scores[name] for name, weight, _ in CRITERIA)


def _record(index: int, source: str) -> PromptRecord:
    lang, text = QUESTIONS[index]
    metadata = {"task": NAME, "lang": lang, "question": index, "tools": list(TOOLS), "official_source": OFFICIAL_URL}
    return PromptRecord(text, REFERENCE_ANSWERS[lang], metadata, source)


def records(split: str, seed: int, size: int) -> list[PromptRecord]:
    """``size`` records cycling through the split's phrasings (``seed`` does not change them: there are six)."""
    indices = SPLIT_QUESTIONS[split]
    return [_record(indices[i % len(indices)], f"task:{NAME}/{split}#{i}") for i in range(size)]


def record_for_prompt(text: str) -> PromptRecord | None:
    """The record of one of the task's questions typed verbatim; None for any other text."""
    for index, (_, question) in enumerate(QUESTIONS):
        if text == question:
            return _record(index, repr(text))
    return None
