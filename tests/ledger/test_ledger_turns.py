"""Multi-turn ledgers: every turn and observation kept, roles and turns on the rows, the turns in the
JSONL/CSV files, the per-turn credit summary (DESIGN §1: observation tokens have no reward or A)."""

from __future__ import annotations

import csv
import io
import json
from types import SimpleNamespace

import pytest
import torch

from glassrl.ledger import Ledger, LedgerTurn, read_jsonl
from glassrl.ledger.compute import from_experience
from glassrl.ledger.legend import turn_legend
from glassrl.ledger.phrases import PHRASES
from glassrl.ledger.render import columns, to_markdown
from glassrl.rollout.base import RolloutBatch, Turn

PARAMS = dict(estimator="gae", gamma=1.0, lam=0.95, beta=0.0, kl_kind=None)
CALL = {"name": "calculator", "arguments": {"expression": "4821+975"}, "status": "ok", "seconds": 0.01}
# Response 0: turn 0 = tokens 0..1 generated, 2..3 observation; turn 1 = tokens 4..5 generated,
# then an observation 6 that nothing follows (the budget ran out). Response 1: one turn of 2 tokens.
TURNS = [
    (
        Turn(0, 2, 4, "tool_call", "<call>", "<result>5796</result>", (CALL,), {"valid_call": 0.1}),
        Turn(4, 6, 7, "length", "5796"),
    ),
    (Turn(0, 2, 2, "stop", "xy"),),
]
ROLES = torch.tensor([[1, 1, 2, 2, 1, 1, 2], [1, 1, 0, 0, 0, 0, 0]], dtype=torch.int8)  # (B, T)


def rollout() -> RolloutBatch:
    mask, context = ROLES == 1, ROLES != 0
    return RolloutBatch(
        prompt_ids=torch.tensor([[5, 6], [5, 6]]),
        prompt_mask=torch.ones(2, 2, dtype=torch.bool),
        response_ids=torch.arange(10, 24).view(2, 7),
        response_mask=mask,
        group_index=torch.tensor([0, 0]),
        finish_reasons=["length", "stop"],
        texts=["", "xy"],
        response_context_mask=context,
        turns=[tuple(t) for t in TURNS],
    )


def multi_turn_ledger() -> Ledger:
    r = rollout()
    advantages = torch.tensor([[1.0, 2.0, 9.0, 9.0, 3.0, 4.0, 9.0], [0.5, -0.5, 0, 0, 0, 0, 0]])
    rewards = torch.tensor([[0.0, 0.1, 9.0, 9.0, 0.0, 0.25, 9.0], [0.0, 1.0, 0, 0, 0, 0, 0]])
    return Ledger.from_tensors(
        prompts=["p", "p"],
        token_texts=[[f"t{i}" for i in range(7)], [f"u{i}" for i in range(7)]],
        response_mask=r.response_mask,
        token_ids=r.response_ids,
        token_rewards=rewards,
        advantages=advantages,
        lengths=r.context_lengths,
        token_roles=r.token_roles,
        turns=r.turns,
        finish_reasons=r.finish_reasons,
        **PARAMS,
    )


def test_rows_carry_roles_and_turns_and_keep_the_observation_after_the_last_turn():
    ledger = multi_turn_ledger()
    r0, r1 = ledger.responses
    assert r0.length == 7  # the observation after the last generated token is kept
    assert [t.role for t in r0.tokens] == ["generated"] * 2 + ["observation"] * 2 + ["generated"] * 2 + ["observation"]
    assert [t.turn for t in r0.tokens] == [0, 0, 0, 0, 1, 1, 1]
    assert [t.advantages for t in r0.tokens] == [1.0, 2.0, None, None, 3.0, 4.0, None]  # none on observations
    assert r0.turns == (
        LedgerTurn(0, 2, 4, "tool_call", (CALL,), {"valid_call": 0.1}),
        LedgerTurn(4, 6, 7, "length"),
    )
    assert r1.length == 2 and [t.turn for t in r1.tokens] == [0, 0]


def test_without_turns_a_row_is_generated_where_the_mask_says_so():
    mask = torch.tensor([[True, False, True]])
    ledger = Ledger.from_tensors(prompts=["p"], token_texts=[["a", "b", "c"]], response_mask=mask, **PARAMS)
    resp = ledger.responses[0]
    assert [t.role for t in resp.tokens] == ["generated", "observation", "generated"]
    assert resp.turns is None and all(t.turn is None for t in resp.tokens)


def test_from_experience_keeps_every_turn():
    """The defect the issue names: a saved ledger cut at the number of generated tokens lost the
    second turn. from_experience keeps every real token (generated and observation)."""
    r = rollout()
    B, T = r.response_ids.shape
    zeros = torch.zeros(B, T)
    exp = SimpleNamespace(
        rollout=r,
        prompts=["p", "p"],
        response_mask=r.response_mask,
        scores=torch.tensor([0.0, 1.0]),
        token_scores=zeros,
        step_end_mask=None,
        baseline_rewards=None,
        logprobs=zeros,
        ref_logprobs=None,
        kl=None,
        values=None,
        token_rewards=zeros,
        deltas=None,
        advantages=zeros,
        returns=zeros,
        whitened_advantages=None,
        reward_beta=0.0,
    )
    tokenizer = SimpleNamespace(decode=lambda ids: f"<{ids[0]}>")
    ledger = from_experience(exp, tokenizer, estimator="grpo", gamma=1.0, lam=1.0, kl_kind="k3")
    r0 = ledger.responses[0]
    assert int(r.lengths[0]) == 4 and r0.length == 7  # 4 generated tokens, 7 in the context
    assert [t.token_id for t in r0.tokens] == list(range(10, 17))
    assert [t.turn for t in r0.tokens] == [0, 0, 0, 0, 1, 1, 1]
    assert [t.role for t in r0.tokens][2:4] == ["observation"] * 2
    assert r0.turns[0].tool_calls == (CALL,) and r0.turns[0].reward_parts == {"valid_call": 0.1}


def test_jsonl_round_trip_keeps_turns_and_csv_writes_them_as_json(tmp_path):
    ledger = multi_turn_ledger()
    ledger.to_jsonl(tmp_path / "l.jsonl")
    assert read_jsonl(tmp_path / "l.jsonl") == ledger
    head, first = (json.loads(line) for line in (tmp_path / "l.jsonl").read_text().splitlines()[:2])
    assert head["turns"][0]["tool_calls"] == [CALL] and first["role"] == "generated" and first["turn"] == 0
    rows = list(csv.DictReader(io.StringIO(ledger.csv())))
    assert json.loads(rows[0]["turns"])[1] == {
        "start": 4,
        "end": 6,
        "observation_end": 7,
        "finish_reason": "length",
        "tool_calls": [],
        "reward_parts": {},
    }
    assert rows[2]["role"] == "observation"


def test_a_ledger_file_written_before_turns_existed_still_reads(tmp_path):
    ledger = Ledger.from_tensors(
        prompts=["p"], token_texts=[["a", "b"]], response_mask=torch.tensor([[True, True]]), **PARAMS
    )
    rows = [{k: v for k, v in row.items() if k not in ("role", "turn", "turns")} for row in ledger.rows()]
    (tmp_path / "old.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    old = read_jsonl(tmp_path / "old.jsonl")
    assert old.responses[0].turns is None and [t.role for t in old.responses[0].tokens] == [None, None]


def test_turn_legend_sums_the_credit_of_each_turn():
    ledger = multi_turn_ledger()
    lines = turn_legend(ledger, 0)
    assert lines[1] == (
        "turn 0: tokens 0…1 generated (2), observation tokens 2…3; finish tool_call; "
        "calls calculator: ok; environment reward valid_call 0.1"
    )
    # turn 0: r = 0 + 0.1, A = 1 + 2 (the 9s on its observation are not credit); turn 1: A = 3 + 4
    assert lines[2].split() == ["Σ", "r_i", "=", "0.1000", "Σ", "A_i", "=", "3.0000", "mean", "A_i", "=", "1.5000"]
    assert lines[3] == "turn 1: tokens 4…5 generated (2), observation tokens 6…6; finish length"
    assert lines[4].split()[-1] == "3.5000"
    assert len(turn_legend(ledger, 0, "zh")) == len(lines)
    assert turn_legend(ledger, 1)[1] == "turn 0: tokens 0…1 generated (2); finish stop"


def test_turn_phrases_exist_in_every_language_with_the_same_slots():
    keys = [k for k in PHRASES["en"] if k.startswith(("turn", "heading.turns"))]
    assert len(keys) == 6
    for lang, table in PHRASES.items():
        for key in keys:
            assert set(_slots(table[key])) == set(_slots(PHRASES["en"][key])), (lang, key)


def _slots(text: str) -> list[str]:
    import string

    return [name for _, name, _, _ in string.Formatter().parse(text) if name]


def test_markdown_marks_observations_and_shows_the_turns():
    ledger = multi_turn_ledger()
    assert columns(ledger)[0] == "turn" and "role" in columns(ledger)
    md = to_markdown(ledger)
    table = [line for line in md.splitlines() if line.startswith("| 0 | 2 ")]
    assert table and table[0].rstrip(" |").endswith("obs")
    assert "turn 0: tokens 0…1 generated (2)" in md
    single = Ledger.from_tensors(prompts=["p"], token_texts=[["a"]], response_mask=torch.tensor([[True]]), **PARAMS)
    assert "turn" not in columns(single) and "role" not in columns(single)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_report_shows_turns(lang, tmp_path):
    from glassrl.report.html import token_payload, write_explain_html

    ledger = multi_turn_ledger()
    payload = token_payload([("explain", [ledger])], (0, 0), lang)
    resp = payload["sources"][0]["ledgers"][0]["responses"][0]
    assert [t["start"] for t in resp["turns"]] == [0, 4] and resp["turns"][0]["tool_calls"] == [CALL]
    assert resp["turn_legend"] == turn_legend(ledger, 0, lang)
    role = payload["token_fields"].index("role")
    assert [row[role] for row in resp["tokens"]].count("observation") == 3
    page = write_explain_html(ledger, tmp_path / "t.html", lang=lang).read_text()
    assert "turn-tag" in page and "turn_legend" in page
