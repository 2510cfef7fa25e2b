"""The research scenario end to end: the bundled corpus (search, open_page), a scripted agent
that opens the official report or the rumour page, and the rubric (1 + 1 + 0.5) on its report."""

from __future__ import annotations

import json
import re

import pytest
import torch

from glassrl.data.tasks import research
from glassrl.errors import GlassrlError
from glassrl.rewards import RewardRequest
from glassrl.rewards.research import research_rubric
from glassrl.rollout.agent import AgentRolloutEngine, ToolEnvironment, build_tools, run_call
from glassrl.rollout.agent.corpus import CORPUS_DIR, Corpus, OpenPageTool, SearchTool, load_pages, terms
from glassrl.rollout.agent.tools import ToolCall, tool_map
from glassrl.rollout.base import SamplingParams


def test_corpus_pages_and_the_tasks_official_source_agree():
    pages = {p.id: p for p in load_pages()}
    official = pages[research.OFFICIAL_ID]
    assert official.kind == "official" and official.url == research.OFFICIAL_URL
    assert {p.kind for p in pages.values()} == {"official", "news", "forecast", "rumour"}
    assert {p.lang for p in pages.values()} == {"en", "zh"}
    assert "$11.5 billion" in official.text


def test_terms_split_words_and_han():
    assert terms("Google Cloud 营收115亿") == ["google", "cloud", "115", "营", "收", "营收", "亿"]


def test_search_finds_the_official_report_and_the_rumours():
    search = SearchTool()
    english = search.call({"query": "Alphabet 2025 Q1 earnings report google cloud revenue"})
    assert english.splitlines()[0].startswith("1. Alphabet Announces First Quarter 2025 Results | https://abc.xyz")
    chinese = search.call({"query": "谷歌 2025 全年 营收"})
    assert "keji-bagua" in chinese.splitlines()[0]  # the trap: the rumour ranks first in Chinese
    assert "official" not in english and "rumour" not in chinese  # the kind is not shown
    assert search.call({"query": "zzz"}) == "no results"


def test_open_page_by_url_or_id_and_unknown_urls_are_observations():
    page = OpenPageTool().call({"url": research.OFFICIAL_URL})
    assert page.startswith("Alphabet Announces First Quarter 2025 Results\nhttps://abc.xyz/investor/2025-q1.pdf")
    assert OpenPageTool().call({"url": research.OFFICIAL_ID}) == page
    result = run_call(tool_map([OpenPageTool()]), ToolCall("open_page", text="https://example.com/x"), 5.0)
    assert result.status == "error" and "no page at 'https://example.com/x'" in result.text


def test_a_bad_page_file_is_one_error_naming_it(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"id": "y", "url": "u", "title": "t", "kind": "official"}))
    with pytest.raises(GlassrlError, match="x.json: field 'lang' missing"):
        load_pages(tmp_path)
    for row in ({"id": "y"}, {"id": "x", "kind": "blog"}):
        fields = {"url": "u", "title": "t", "kind": "official", "lang": "en", "date": "d", "text": "x"} | row
        (tmp_path / "x.json").write_text(json.dumps(fields))
        with pytest.raises(GlassrlError, match="id must be the file name"):
            load_pages.__wrapped__(tmp_path)
    assert Corpus(load_pages(CORPUS_DIR)).open(" abc-2025-q1 ").id == "abc-2025-q1"


def agent(choose: str):
    """A scripted researcher: search, open the page whose url contains ``choose``, write a report from it."""

    def script(context: str) -> str:
        results = [r for r in re.findall(r"<result>(.*?)</result>", context, re.S) if r != "…"]  # "…": the prompt's
        if not results:
            return "<call>search Google Cloud 2025 revenue</call>"
        if len(results) == 1:
            url = next(u for u in re.findall(r"\| (\S+) \|", results[0]) if choose in u)
            return f"<call>open_page {url}</call>"
        url = results[1].splitlines()[1].split()[0]
        if "abc.xyz" in url:
            return (
                f"Q1 2025: Google Cloud revenue was $11.5 billion \\cite{{{url}}}. Full-year results are not out yet."
            )
        return f"Google's 2025 revenue will hit $5 trillion for the full year \\cite{{{url}}}."

    return script


@pytest.mark.parametrize(("choose", "score"), [("abc.xyz", 2.5), ("tech-gossip", 0.0)])
def test_the_rubric_rewards_the_agent_that_opened_the_official_report(tokenizer, scripted, choose, score):
    tools = build_tools(list(research.TOOLS))
    engine = AgentRolloutEngine(scripted(tokenizer, agent(choose)), tokenizer, lambda: ToolEnvironment(tools))
    records = research.records("train", 0, 1)
    prompts = engine.format_prompts(records)
    batch = engine.generate(
        prompts, n=1, params=SamplingParams(max_new_tokens=2048), generator=torch.Generator(), records=records
    )
    turns = batch.turns[0]
    assert [t.finish_reason for t in turns] == ["tool_call", "tool_call", "stop"]
    assert [c["name"] for t in turns for c in t.tool_calls] == ["search", "open_page"]
    (result,) = research_rubric().score([RewardRequest(records[0].prompt, batch.texts[0], records[0])])
    assert result.status == "ok" and result.score == score
    assert result.details["weights"] == {"accuracy": 1.0, "temporal": 1.0, "citation": 0.5}


def test_research_rubric_judges_are_checked():
    with pytest.raises(GlassrlError, match="unknown criterion 'style'"):
        research_rubric({"style": object()})
