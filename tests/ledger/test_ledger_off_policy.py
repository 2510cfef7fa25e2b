"""A token another policy sampled (asynchronous training, algo.off_policy): its version, staleness,
log μ, weight and keep decision in the ledger (None on observation tokens), in the file only where
recorded, in the CSV, the tables and the legend, in English and Chinese."""

from __future__ import annotations

import csv
import io
import math

import pytest
import torch

from glassrl.ledger import ALL_FIELDS, Ledger, read_jsonl
from glassrl.ledger.legend import token_legend
from glassrl.ledger.render import columns, to_markdown

L = math.log
PARAMS = dict(estimator="grpo", gamma=1.0, lam=None, beta=0.0, kl_kind=None)


def off_policy_ledger() -> Ledger:
    """One response: a, b generated (versions 3 and 4, two and one updates behind step's version 5),
    then an observation token holding junk, then c (version 4); π_old/μ = 2 on a, 0.5 on b, 1 on c."""
    mask = torch.tensor([[True, True, False, True]])
    return Ledger.from_tensors(
        prompts=["p"],
        token_texts=[["a", "b", "<obs>", "c"]],
        response_mask=mask,
        logprobs=torch.tensor([[L(0.5), L(0.3), 0.0, L(0.2)]]),
        rollout_logprobs=torch.tensor([[L(0.25), L(0.6), -7.0, L(0.2)]]),
        policy_versions=torch.tensor([[3, 4, -1, 4]]),
        staleness=torch.tensor([[2, 1, 99, 1]]),
        is_weights=torch.tensor([[0.0, 0.5, 5.0, 1.0]]),
        is_keep=torch.tensor([[False, True, True, True]]),
        advantages=torch.tensor([[1.0, 1.0, 0.0, 1.0]]),
        step=5,
        **PARAMS,
    )


def test_each_generated_token_holds_its_numbers_and_observations_none(tmp_path):
    ledger = off_policy_ledger()
    a, b, obs, c = ledger.responses[0].tokens
    assert (a.policy_version, a.staleness, a.is_keep, a.is_weights) == (3, 2, False, 0.0)
    assert (b.policy_version, b.staleness, b.is_keep, b.is_weights) == (4, 1, True, 0.5)
    assert a.rollout_logprobs == pytest.approx(L(0.25)) and c.policy_version == 4
    for name in ("policy_version", "staleness", "rollout_logprobs", "is_weights", "is_keep"):
        assert getattr(obs, name) is None, name
    path = tmp_path / "l.jsonl"
    ledger.to_jsonl(path)
    assert read_jsonl(path) == ledger
    rows = list(csv.DictReader(io.StringIO(ledger.csv())))
    assert tuple(rows[0])[: len(ALL_FIELDS)] == ALL_FIELDS and rows[0]["staleness"] == "2"
    assert rows[2]["staleness"] == ""  # the observation


def test_a_synchronous_ledger_has_no_off_policy_numbers_on_its_rows(tmp_path):
    ledger = Ledger.from_tensors(
        prompts=["p"], token_texts=[["a"]], response_mask=torch.tensor([[True]]), step=1, **PARAMS
    )
    assert "staleness" not in ledger.jsonl() and tuple(next(csv.DictReader(io.StringIO(ledger.csv())))) == ALL_FIELDS
    assert "lag" not in to_markdown(ledger)


def test_the_tables_and_the_legend_show_them():
    ledger = off_policy_ledger()
    shown = columns(ledger)
    assert {"policy_version", "staleness", "rollout_logprobs", "is_weights", "is_keep"} <= set(shown)
    assert "| v | lag | log μ(a_i\\|s_i) | w_i | keep |" in to_markdown(ledger)
    first = {line.key: line.text for line in token_legend(ledger, 0, 0)}["sampled"]
    assert "version 3, 2 actor update(s) before" in first
    assert "log μ(a_0|s_0) = -1.3863" in first and "= 2.0000" in first  # ρ = 0.5/0.25
    assert "dropped it" in first
    second = {line.key: line.text for line in token_legend(ledger, 0, 1)}["sampled"]
    assert "× w_1 = 0.5000" in second
    zh = {line.key: line.text for line in token_legend(ledger, 0, 1, "zh")}["sampled"]
    assert "由第 4 版权重采样" in zh and "× w_1 = 0.5000" in zh
    assert "sampled" not in {line.key for line in token_legend(ledger, 0, 2)}  # the observation


def test_the_report_colours_tokens_by_staleness_mismatch_and_weight():
    from glassrl.report.html import token_payload

    payload = token_payload([("run", [off_policy_ledger()])], (0, 0))
    fields = payload["token_fields"]
    assert {"staleness", "logprob_gap", "is_weights"} <= {q["field"] for q in payload["quantities"]}
    rows = [dict(zip(fields, row)) for row in payload["sources"][0]["ledgers"][0]["responses"][0]["tokens"]]
    assert [r["staleness"] for r in rows] == [2, 1, None, 1]
    gaps = [r["logprob_gap"] for r in rows]
    assert gaps[0] == pytest.approx(L(2), abs=1e-6) and gaps[1] == pytest.approx(L(2), abs=1e-6)
    assert gaps[2] is None and gaps[3] == pytest.approx(0.0, abs=1e-6)  # an observation has no gap


def test_explain_shows_a_ledger_file_with_its_legend(tmp_path, capsys):
    from glassrl import cli

    path = tmp_path / "step_000005.jsonl"
    off_policy_ledger().to_jsonl(path)
    assert cli.main(["explain", "--ledger", str(path), "--format", "markdown", "--legend-token", "0"]) == 0
    out = capsys.readouterr().out
    assert f"{path}: step 5" in out and "| v | lag |" in out
    assert "by the weights of version 3, 2 actor update(s) before" in out and "dropped it" in out
    assert cli.main(["explain", "--ledger", str(path), "--legend-token", "1", "--lang", "zh"]) == 0
    assert "由第 4 版权重采样" in capsys.readouterr().out
    assert cli.main(["explain", "--ledger", str(path), "--prompt", "p"]) == 2
    assert "--ledger shows a ledger a run wrote; --prompt computes one" in capsys.readouterr().err
