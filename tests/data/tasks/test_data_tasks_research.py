"""research: the rubric rules on hand-written reports (the reference dialogue's good report and
its counter-example, on the dialogue's own episode), and the seeded episode generator: seeded,
splits disjoint by company, every episode solvable, typed prompts replayed."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter

import pytest

from glassrl.data.tasks import research

DIALOGUE = research.DIALOGUE
OFFICIAL = DIALOGUE.official_url


@pytest.mark.parametrize(
    ("report", "scores"),
    [
        # The dialogue's report (part 1, t=6), with the citation format its rubric asks for.
        (
            f"根据 Alphabet 发布的 **2025年第一季度财报** \\cite{{{OFFICIAL}}}，Google Cloud 营收达到 115 亿美元。",
            (1, 1, 1),
        ),
        (research.report(DIALOGUE), (1, 1, 1)),
        (research.report(dataclasses.replace(DIALOGUE, lang="en")), (1, 1, 1)),
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
        # A figure that only contains the official one is not it; the second quarter is not the first.
        (f"Q1 2025: Google Cloud revenue was $111.5 billion \\cite{{{OFFICIAL}}}.", (0, 1, 1)),
        (f"Q2 2025: Google Cloud revenue was $11.5 billion \\cite{{{OFFICIAL}}}.", (1, 0, 1)),
    ],
)
def test_rubric_rules_hand_table(report, scores):
    assert tuple(research.grade(report, DIALOGUE).values()) == tuple(float(s) for s in scores)
    # R = Σ w_i·s_i with weights 1, 1, 0.5 (the dialogue's 2.5 for a report meeting all three)
    assert research.score(report, DIALOGUE) == 1.0 * scores[0] + 1.0 * scores[1] + 0.5 * scores[2]


def test_a_reported_full_year_is_named_and_the_forecast_still_hedged():
    year = dataclasses.replace(DIALOGUE, lang="en", quarter=4, figure=47.2, forecast=50.0)
    assert research.period(year) == "the full year 2025"
    assert research.grade(research.report(year), year) == {"accuracy": 1.0, "temporal": 1.0, "citation": 1.0}
    cite = f"\\cite{{{year.official_url}}}"
    assert year.official_url == "https://abc.xyz/investor/2025-fy.pdf"
    assert research.grade(f"Full-year 2025 Cloud revenue: $47.2 billion {cite}.", year)["temporal"] == 1.0
    assert research.grade(f"Q1 2025 Cloud revenue: $47.2 billion {cite}.", year)["temporal"] == 0.0
    assert research.grade(f"FY 2025: $47.2 billion {cite}. It reached $50 billion.", year)["temporal"] == 0.0


def test_weights_are_the_dialogues():
    assert [(name, weight) for name, weight, _ in research.CRITERIA] == [
        ("accuracy", 1.0),
        ("temporal", 1.0),
        ("citation", 0.5),
    ]
    assert research.FULL_MARKS == 2.5


def test_episodes_are_seeded_and_the_splits_disjoint_by_company():
    train, test = research.episodes("train", 0, 300), research.episodes("test", 0, 100)
    assert train == research.episodes("train", 0, 300) and train != research.episodes("train", 1, 300)
    assert research.episodes("train", 0, 30) == train[:30]  # a longer split extends a shorter one
    assert len(set(train)) == 300 and len(set(test)) == 100
    assert not {e.company for e in train} & {e.company for e in test}
    assert {research.split_of(e.company) for e in test} == {"test"}
    assert 0.15 < sum(research.split_of(c) == "test" for c in research.COMPANIES) / len(research.COMPANIES) < 0.25
    # the world varies: languages, phrasings, periods reported, the search engine's ranking
    assert set(Counter(e.lang for e in train)) == {"zh", "en"}
    assert set(Counter(e.quarter for e in train)) == {1, 2, 3, 4}
    assert len({e.order for e in train}) == 24 and len({e.phrasing for e in train}) == 3
    assert Counter(e.order[0] for e in train)["official"] < 0.4 * len(train)  # not always the top result


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_episode_is_solvable(split):
    """Its four pages (one of each kind, in its language), the official one with the true figure on
    the company's site, dated before "today"; the careful agent's query finds every page; the
    official report scores 2.5, the rumour and the forecast 0, the forgotten citation 2.0."""
    from glassrl.agents.corpus import Corpus, Page

    for e in research.episodes(split, 0, 200):
        today = dt.date.fromisoformat(e.today)
        assert research.reported_quarter(e.year, today) == e.quarter >= 1
        pages = research.pages(e)
        assert [p["kind"] for p in pages] == list(e.order) and {p["lang"] for p in pages} == {e.lang}
        official = next(p for p in pages if p["kind"] == "official")
        assert official["url"] == e.official_url and official["url"].startswith(f"https://{e.domain}/")
        assert research.money(e.figure, e.lang) in official["text"] and dt.date.fromisoformat(official["date"]) < today
        assert e.forecast != e.figure
        corpus = Corpus(tuple(Page(**p) for p in pages))
        assert len(corpus.search(research.search_query(e), 4)) == 4
        scores = {b: research.score(research.report(e, b), e) for b in research.BEHAVIOURS}
        assert scores == {"official": 2.5, "no_cite": 2.0, "rumour": 0.0, "forecast": 0.0}, (e, scores)


def test_records_carry_their_episode_and_typed_prompts_replay_it():
    records = research.records("test", 0, 20)
    for r in records:
        e = research.episode_of(r)
        assert r.prompt == research.question(e) and "\\cite{" in r.prompt and str(e.year) in r.prompt
        assert r.metadata["tools"] == ["search", "open_page"] and r.metadata["lang"] == e.lang
        assert research.score(r.answer, e) == 2.5
        typed = research.record_for_prompt(r.prompt)
        assert typed is not None and typed.metadata == r.metadata and typed.answer == r.answer
    # the dialogue's question, typed: an episode of its own (its facts drawn from the question)
    dialogue = research.record_for_prompt(research.question(DIALOGUE))
    assert research.episode_of(dialogue).quarter == 1 and research.episode_of(dialogue).company == "Google"
    assert research.record_for_prompt("hello") is None
    # a year nothing of which is reported yet by "today" is no episode
    early = dataclasses.replace(DIALOGUE, today="2025-02-01")
    assert research.record_for_prompt(research.question(early)) is None
