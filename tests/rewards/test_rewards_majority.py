"""Majority vote (TTRL): pseudo-labels from each group's most frequent answer, no labels needed."""

from __future__ import annotations

from glassrl.data.records import PromptRecord
from glassrl.rewards import MajorityVoteSource, RewardRequest


def req(prompt: str, response: str, group=None) -> RewardRequest:
    metadata = {} if group is None else {"group_id": group}
    return RewardRequest(prompt, response, PromptRecord(prompt, None, metadata, "t#0"))


def test_groups_by_prompt_and_votes():
    batch = [req("1+1=", r) for r in ["2", "it is 2", "3", "no idea"]] + [req("2+2=", r) for r in ["5", "4", "4"]]
    results = MajorityVoteSource().score(batch)
    assert [r.score for r in results] == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    assert [r.details["pseudo_label"] for r in results] == ["2"] * 4 + ["4"] * 3
    assert results[3].details["answer"] is None  # no answer: no vote, and it cannot agree


def test_group_id_overrides_the_prompt():
    # Same prompt text, two groups (e.g. two rollouts of one prompt in one batch).
    batch = [
        req("q", "1", group=0),
        req("q", "1", group=0),
        req("q", "2", group=1),
        req("q", "2", group=1),
        req("q", "1", group=1),
    ]
    assert [r.score for r in MajorityVoteSource().score(batch)] == [1.0, 1.0, 1.0, 1.0, 0.0]


def test_group_without_any_answer_scores_zero():
    results = MajorityVoteSource().score([req("q", "dunno"), req("q", "no")])
    assert [(r.status, r.score, r.details["pseudo_label"]) for r in results] == [("ok", 0.0, None)] * 2


def test_custom_extractor_by_spec_and_failures():
    source = MajorityVoteSource(extract_answer="glassrl.rewards.verifiers:normalize_text")
    assert [r.score for r in source.score([req("q", "Ａ"), req("q", "A"), req("q", "b")])] == [1.0, 1.0, 0.0]

    def picky(response: str):
        if response == "bad":
            raise ValueError("cannot parse")
        return response

    results = MajorityVoteSource(extract_answer=picky).score([req("q", "x"), req("q", "bad"), req("q", "x")])
    assert [r.status for r in results] == ["ok", "error", "ok"]
    assert results[1].message == "extract_answer raised ValueError: cannot parse"


def test_empty_batch():
    assert MajorityVoteSource().score([]) == []


def test_a_spec_extractor_runs_in_a_worker_from_a_file(tmp_path):
    (tmp_path / "extract.py").write_text(
        "import time\n\ndef last_word(response):\n    return response.split()[-1] if response.split() else None\n\n"
        "def stuck(response):\n    time.sleep(600)\n"
    )
    source = MajorityVoteSource(extract_answer="extract.py:last_word", base_dir=str(tmp_path))
    results = source.score([req("q", "it is b"), req("q", "b"), req("q", "a"), req("q", "")])
    assert [r.score for r in results] == [1.0, 1.0, 0.0, 0.0]
    assert results[0].details == {"answer": "b", "pseudo_label": "b"} and results[3].details["answer"] is None
    stuck = MajorityVoteSource(extract_answer="extract.py:stuck", timeout_s=0.5, base_dir=str(tmp_path))
    timed_out = stuck.score([req("q", "a"), req("q", "b")])
    assert [r.status for r in timed_out] == ["timeout", "timeout"] and "no result after 0.5 s" in timed_out[0].message
