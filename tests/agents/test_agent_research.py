"""The research scenario end to end: the bundled corpus (search, open_page), the task's environment
(each episode its own pages), a scripted agent that opens the official report, the rumour page or
the forecast, and the rubric (1 + 1 + 0.5) on its report."""

from __future__ import annotations

import json
import re

import pytest
import torch

from glassrl.agents import AgentRolloutEngine, run_call, task_environment
from glassrl.agents.corpus import CORPUS_DIR, Corpus, OpenPageTool, SearchTool, load_pages, terms
from glassrl.agents.tools import ToolCall, tool_map
from glassrl.builtin.research_model import opened_kind, scripted_turns
from glassrl.data.tasks import research
from glassrl.data.tasks.research import pages
from glassrl.errors import GlassrlError
from glassrl.rewards import RewardRequest
from glassrl.rewards.research import research_rubric
from glassrl.rollout.base import SamplingParams


def test_corpus_pages_and_the_tasks_official_source_agree():
    pages = {p.id: p for p in load_pages()}
    official = pages[research.DIALOGUE.official_id]
    assert official.kind == "official" and official.url == research.DIALOGUE.official_url
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
    page = OpenPageTool().call({"url": research.DIALOGUE.official_url})
    assert page.startswith("Alphabet Announces First Quarter 2025 Results\nhttps://abc.xyz/investor/2025-q1.pdf")
    assert OpenPageTool().call({"url": research.DIALOGUE.official_id}) == page
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


def agent(record, behaviour: str):
    """A scripted researcher (glassrl.builtin.research_model.scripted_turns): search, open the page
    its behaviour opens, write that behaviour's report; it checks that each observation is what the
    episode's pages say."""
    episode = research.episode_of(record)
    turns = scripted_turns(episode, behaviour)

    def script(context: str) -> str:
        results = re.findall(r"<result>(.*?)</result>", context, re.S)
        if results:  # the search results: rank, title and url of each page, in the episode's order
            assert results[0].splitlines() == [
                f"{i}. {p['title']} | {p['url']}" for i, p in enumerate(pages(episode), 1)
            ]
        if len(results) == 2:  # the opened page: its title and text
            page = next(p for p in pages(episode) if p["kind"] == research.OPENS[behaviour])
            assert results[1] == f"{page['title']}\n{page['text']}"
        return turns[len(results)]

    return script


@pytest.mark.parametrize(
    ("behaviour", "score"), [("official", 2.5), ("no_cite", 2.0), ("rumour", 0.0), ("forecast", 0.0)]
)
def test_the_rubric_rewards_the_agent_that_opened_the_official_report(tokenizer, scripted, behaviour, score):
    records = research.records("test", 0, 4)
    engine = AgentRolloutEngine(
        ScriptedBatch(scripted(tokenizer, None), records, behaviour),
        tokenizer,
        task_environment("research"),
        describe_tools=False,
    )
    prompts = engine.format_prompts(records)
    batch = engine.generate(
        prompts, n=1, params=SamplingParams(max_new_tokens=2048), generator=torch.Generator(), records=records
    )
    for record, turns, text in zip(records, batch.turns, batch.texts):
        assert [t.finish_reason for t in turns] == ["tool_call", "tool_call", "stop"]
        assert [c["name"] for t in turns for c in t.tool_calls] == ["search", "open_page"]
        assert [c["status"] for t in turns for c in t.tool_calls] == ["ok", "ok"]
        assert opened_kind(turns, research.episode_of(record)) == research.OPENS[behaviour]
        (result,) = research_rubric().score([RewardRequest(record.prompt, text, record)])
        assert result.status == "ok" and result.score == score
        assert result.details["weights"] == {"accuracy": 1.0, "temporal": 1.0, "citation": 0.5}


class ScriptedBatch:
    """A TurnSampler that answers each context with the scripted agent of its record (the contexts
    of a turn come in the records' order while all are running, as here)."""

    def __init__(self, sampler, records, behaviour):
        self.sampler, self.device, self.path = sampler, sampler.device, "scripts"
        self.scripts = [agent(r, behaviour) for r in records]

    def sample(self, contexts, max_new_tokens, params, generator, stop_strings, with_logprobs):
        out = []
        for i, context in enumerate(contexts):
            self.sampler.script = self.scripts[i]
            out += self.sampler.sample([context], max_new_tokens[i : i + 1], params, generator, stop_strings, False)
        return out


def test_each_episode_has_its_own_pages():
    env = task_environment("research")()
    first, second = research.records("train", 0, 2)
    env.reset(first)
    search = env.step("", [ToolCall("search", {"query": research.search_query(research.episode_of(first))})])
    env.reset(second)
    again = env.step("", [ToolCall("search", {"query": research.search_query(research.episode_of(first))})])
    assert search.observations != again.observations
    missing = env.step("", [ToolCall("open_page", {"url": research.episode_of(first).official_url})])
    assert missing.tool_calls[0]["status"] == "error"  # the first episode's page is not in the second's web


def test_research_rubric_judges_are_checked():
    with pytest.raises(GlassrlError, match="unknown criterion 'style'"):
        research_rubric({"style": object()})
    with pytest.raises(GlassrlError, match="judged names criteria but judge_model is not set"):
        research_rubric(judged=["temporal"])
