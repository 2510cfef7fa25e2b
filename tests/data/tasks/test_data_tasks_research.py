"""research: the rubric rules on hand-written reports (the reference dialogue's good report and
its counter-example), the records and splits."""

from __future__ import annotations

import pytest

from glassrl.data.tasks import research

OFFICIAL = research.OFFICIAL_URL


@pytest.mark.parametrize(
    ("report", "scores"),
    [
        # The dialogue's report (part 1, t=6), with the citation format its rubric asks for.
        (
            f"根据 Alphabet 发布的 **2025年第一季度财报** \\cite{{{OFFICIAL}}}，Google Cloud 营收达到 115 亿美元。",
            (1, 1, 1),
        ),
        (research.REFERENCE_ANSWERS["zh"], (1, 1, 1)),
        (research.REFERENCE_ANSWERS["en"], (1, 1, 1)),
        ("Google Cloud revenue was $11.5B in Q1 2025 \\cite{abc-2025-q1}.", (1, 1, 1)),  # page id, "B"
        # The counter-example: the rumour page's full-year figure, cited.
        ("Google 2025 全年营收 5 万亿美元 \\cite{https://tech-gossip.com/google-2025-revenue-5-trillion}。", (0, 0, 0)),
        # Right figure, but a forecast stated as fact; no citation.
        ("第一季度 Google Cloud 营收115亿美元。全年营收将达到500亿美元。", (1, 0, 0)),
        # The forecast, hedged, is fine.
        (
            f"Q1 2025 Cloud revenue: $11.5 billion \\cite{{{OFFICIAL}}}. Analysts expect $50 billion for the year.",
            (1, 1, 1),
        ),
        # No quarter named: the figure reads as the year's.
        (f"Google Cloud 2025 revenue was $11.5 billion \\cite{{{OFFICIAL}}}.", (1, 0, 1)),
        # Cited, but in another format.
        (f"Q1 2025 Google Cloud revenue was $11.5 billion [1]. [1] {OFFICIAL}", (1, 1, 0)),
        ("", (0, 0, 0)),
    ],
)
def test_rubric_rules_hand_table(report, scores):
    assert tuple(research.grade(report).values()) == tuple(float(s) for s in scores)
    # R = Σ w_i·s_i with weights 1, 1, 0.5 (the dialogue's 2.5 for a report meeting all three)
    assert research.score(report) == 1.0 * scores[0] + 1.0 * scores[1] + 0.5 * scores[2]


def test_weights_are_the_dialogues():
    assert [(name, weight) for name, weight, _ in research.CRITERIA] == [
        ("accuracy", 1.0),
        ("temporal", 1.0),
        ("citation", 0.5),
    ]


def test_records_cycle_through_the_split_and_the_splits_are_disjoint():
    train, test = research.records("train", 0, 8), research.records("test", 0, 4)
    assert [r.metadata["question"] for r in train] == [0, 1, 3, 4] * 2
    assert [r.metadata["question"] for r in test] == [2, 5, 2, 5]
    assert {r.metadata["lang"] for r in test} == {"zh", "en"}
    for r in train + test:
        assert "\\cite{" in r.prompt and "2025" in r.prompt and r.metadata["tools"] == ["search", "open_page"]
        assert research.score(r.answer) == 2.5
    assert research.record_for_prompt(test[0].prompt).metadata == test[0].metadata
    assert research.record_for_prompt("hello") is None
