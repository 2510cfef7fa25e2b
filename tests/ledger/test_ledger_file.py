"""The ledger file (issue 33, item 2): a response's own fields (prompt, response, turns) are written
once, not on every token row, so a ledger grows linearly with the response length; rows are written
as they are made; pandas reads the file; files of the old layout (every field on every row) still read."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from glassrl.errors import GlassrlError
from glassrl.ledger import ALL_FIELDS, Ledger, read_jsonl
from glassrl.ledger.model import RESPONSE_ROW, TOKEN_ROW
from glassrl.rollout.base import Turn

PARAMS = dict(estimator="grpo", gamma=1.0, lam=None, beta=0.0, kl_kind=None)
WORD = "token "  # six characters a token, so that the response text is 6·T characters


def long_ledger(T: int, step: int | None = 3) -> Ledger:
    """One multi-turn response of T tokens (a tool call in its first turn) and a short second one."""
    mask = torch.ones(2, T, dtype=torch.bool)
    mask[1, 2:] = False
    call = {"name": "calculator", "arguments": {"expression": "1+1"}, "status": "ok", "seconds": 0.0}
    turns = [(Turn(0, 1, 2, "tool_call", "a", "b", (call,), {"valid_call": 0.1}), Turn(2, T, T, "stop", "c")), None]
    return Ledger.from_tensors(
        prompts=["What is 1+1?", "And 2+2?"],
        token_texts=[[WORD] * T, ["x", "y"]],
        response_mask=mask,
        token_ids=torch.arange(2 * T).view(2, T),
        advantages=torch.full((2, T), 0.5),
        scores=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        lengths=torch.tensor([T, 2]),
        turns=turns,
        step=step,
        **PARAMS,
    )


def test_a_ledger_grows_linearly_with_the_response_length(tmp_path):
    """Each token row repeated the whole response: 16 k tokens wrote 522 MB. Doubling the length
    now doubles the file (plus a constant), and the response's text is in it once."""
    sizes = {}
    for T in (500, 1000, 2000):
        path = tmp_path / f"{T}.jsonl"
        long_ledger(T).to_jsonl(path)
        sizes[T] = path.stat().st_size
        assert path.read_text(encoding="utf-8").count(WORD * T) == 1  # the response text, once
        assert path.read_text(encoding="utf-8").count("What is 1+1?") == 1
    per_token = (sizes[2000] - sizes[1000]) / 1000
    assert sizes[1000] - sizes[500] == pytest.approx(500 * per_token, rel=0.02)  # linear, not quadratic
    assert per_token < 400  # one token row: its own fields only


def test_one_line_per_response_then_one_per_token(tmp_path):
    ledger = long_ledger(4)
    path = tmp_path / "l.jsonl"
    ledger.to_jsonl(path)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [r["kind"] for r in rows] == ["response", "token", "token", "token", "token", "response", "token", "token"]
    assert tuple(rows[0]) == RESPONSE_ROW and tuple(rows[1]) == TOKEN_ROW
    assert rows[0]["turns"][0]["tool_calls"][0]["name"] == "calculator" and rows[0]["prompt"] == "What is 1+1?"
    assert "prompt" not in rows[1] and "turns" not in rows[1]
    assert (rows[1]["step"], rows[1]["response_index"], rows[6]["response_index"]) == (3, 0, 1)
    assert read_jsonl(path) == ledger
    assert "".join(ledger.jsonl_lines()) == path.read_text(encoding="utf-8") == ledger.jsonl()


def test_rows_are_written_as_they_are_made(tmp_path):
    """The writer streams: no write holds more than one row (the old one built the whole file as one string)."""
    writes: list[str] = []

    class Recorder:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

    ledger = long_ledger(300)
    ledger.write_jsonl(Recorder())
    assert len(writes) == 1 + 300 + 1 + 2 and max(map(len, writes)) < 6 * 300 + 1000
    assert "".join(writes) == ledger.jsonl()


def test_pandas_reads_the_file_as_docs_metrics_says(tmp_path):
    """docs/metrics.md, "Reading a ledger file": one frame of rows, split by kind, joined on the response."""
    path = tmp_path / "step_000003.jsonl"
    long_ledger(5).to_jsonl(path)
    rows = [json.loads(line) for line in path.open(encoding="utf-8")]
    responses = pd.DataFrame([r for r in rows if r["kind"] == "response"]).drop(columns="kind")
    tokens = pd.DataFrame([r for r in rows if r["kind"] == "token"]).drop(columns="kind")
    table = tokens.merge(responses, on=["step", "response_index"])
    assert len(table) == 7 and list(table.prompt.unique()) == ["What is 1+1?", "And 2+2?"]
    assert table[table.response_index == 0].advantages.tolist() == [0.5] * 5
    assert set(table.columns) == set(ALL_FIELDS) and table.token_id.dtype == "int64"  # the flat rows, exact types
    assert len(pd.read_json(path, lines=True)) == 2 + 7  # or one frame of both kinds


def test_a_ledger_file_of_the_old_layout_still_reads(tmp_path):
    """Runs written before this layout (every field on every token row) read as they did, for
    ``glassrl explain`` and ``glassrl report``."""
    ledger = long_ledger(6)
    path = tmp_path / "old.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ledger.rows()), encoding="utf-8")
    assert read_jsonl(path) == ledger


def test_a_broken_file_names_the_line(tmp_path):
    ledger = long_ledger(3)
    lines = ledger.jsonl().splitlines()
    path = tmp_path / "bad.jsonl"
    cases = {
        r"bad\.jsonl:1: a token row before any response row": lines[1:],
        r"bad\.jsonl:4: response 0 has 2 token rows, its length is 3": lines[:3] + lines[4:],
        r"bad\.jsonl:2: missing field 'advantages'": [lines[0], lines[1].replace('"advantages"', '"x"'), *lines[2:]],
        r"bad\.jsonl:1: missing field 'prompt'": [lines[0].replace('"prompt"', '"p"')] + lines[1:],
        r"bad\.jsonl:5: kind 'tok': expected 'response' or 'token'": lines[:4]
        + [lines[4].replace('"response"', '"tok"', 1)],
        r"bad\.jsonl:5: run fields differ from the first response": lines[:4]
        + [lines[4].replace('"step": 3', '"step": 4')],
        r"bad\.jsonl:3: a token row of response 1 under response 0": lines[:2]
        + [lines[2].replace('"response_index": 0', '"response_index": 1')]
        + lines[3:],
    }
    for match, content in cases.items():
        path.write_text("\n".join(content) + "\n", encoding="utf-8")
        with pytest.raises(GlassrlError, match=match):
            read_jsonl(path)


def test_glassrl_report_reads_a_run_whose_ledgers_have_the_old_layout(tmp_path, capsys):
    from glassrl.cli import main

    run = tmp_path / "run"
    (run / "ledgers").mkdir(parents=True)
    (run / "config.yaml").write_text("steps: 3\n")
    (run / "metrics.jsonl").write_text('{"step": 3, "reward/mean": 0.5}\n')
    old = long_ledger(6)
    (run / "ledgers" / "step_000003.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old.rows()))
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "What is 1+1?" in page and page.count('"token "') >= 6
