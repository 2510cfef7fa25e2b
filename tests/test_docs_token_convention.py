"""docs/token-convention.md cannot drift: every table and number on it is recomputed with glassrl.

- Each table after a ``<!-- ledger: ARGS -->`` marker must equal, cell by cell, the
  ledger that ``glassrl explain ARGS`` computes.
- Every 4-decimal number on the page must be one that glassrl computed for the
  page's examples; the sentences that do arithmetic are checked one by one.
- Every ``glassrl explain`` command shown on the page runs (exit 0).
"""

from __future__ import annotations

import re
import shlex
import statistics
from pathlib import Path

import pytest

from glassrl import cli
from glassrl.cli import build_parser
from glassrl.commands import explain, explain_input
from glassrl.ledger.render import COLUMNS, cell, columns, fmt, legend_lines, sequence_score

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "token-convention.md").read_text(encoding="utf-8")
PROSE = re.sub(r"\s+", " ", DOC.replace("−", "-"))  # one spelling of minus, one space: for sentence checks
REF = "--input examples/explain/reference_dialogue_c.json"
DENSE = "--tokens 是 的 ， 等于 2 ！ --token-scores 0.2 0.2 0.2 0.2 0.2 0.2 --values 0 0 0 0 0 0 --lam 1"


def ledger(args: str):
    argv = ["explain", *(str(ROOT / a) if a.startswith("examples/") else a for a in shlex.split(args))]
    return explain.build_ledger(explain_input.from_args(build_parser(only="explain").parse_args(argv)))


def tokens(args: str):
    return ledger(args).responses[0].tokens


def marked_tables() -> list[tuple[str, list[list[str]]]]:
    """(ARGS, rows of cells, header first) for each table under a ledger marker."""
    out = []
    lines = DOC.splitlines()
    for k, line in enumerate(lines):
        m = re.fullmatch(r"<!-- ledger: (.*) -->", line.strip())
        if m:
            table = []
            for row in lines[k + 1 :]:
                if not row.startswith("|"):
                    break
                table.append([c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]])
            out.append((m.group(1), [table[0], *table[2:]]))  # drop the alignment row
    return out


def test_the_page_has_the_expected_tables():
    assert [args for args, _ in marked_tables()] == [
        REF,
        f"{REF} --lam 0",
        f"{REF} --lam 1",
        "--input examples/explain/observation_tokens.json",
    ]


@pytest.mark.parametrize(("args", "table"), marked_tables(), ids=[a for a, _ in marked_tables()])
def test_marked_table_equals_the_ledger(args, table):
    computed = ledger(args)
    shown = columns(computed)
    from glassrl.ledger import SYMBOLS

    assert table[0] == [SYMBOLS[name] for name in shown]
    rows = computed.responses[0].tokens
    assert len(table) - 1 == len(rows)
    for row, cells in zip(rows, table[1:]):
        for name, got in zip(shown, cells):
            assert got == cell(row, name), (
                f"{args}: row {row.index}, column {name}: doc {got}, glassrl {cell(row, name)}"
            )
    assert set(shown) <= set(COLUMNS)


def computed_numbers() -> set[str]:
    """Every number glassrl computes for the page's examples, formatted as the page shows them."""
    numbers = set()
    for args in (
        REF,
        f"{REF} --lam 0",
        f"{REF} --lam 1",
        "--input examples/explain/observation_tokens.json",
        "--input examples/explain/grpo_group.json",
        DENSE,
    ):
        for resp in ledger(args).responses:
            numbers.add(fmt(sequence_score(resp)))
            for row in resp.tokens:
                for value in vars(row).values():
                    if isinstance(value, float):
                        numbers |= {fmt(value), fmt(abs(value))}  # abs: "a − 0.0100" shows a negative r
    numbers |= {fmt(t.whitened_advantages + t.values) for t in tokens(REF)}
    scores = [sequence_score(r) for r in ledger("--input examples/explain/grpo_group.json").responses]
    numbers |= {fmt(statistics.fmean(scores)), fmt(statistics.stdev(scores))}
    return numbers


def test_every_four_decimal_number_is_computed_by_glassrl():
    on_page = set(re.findall(r"-?\d+\.\d{4}(?!\d)", DOC.replace("−", "-")))
    assert on_page, "the page should show numbers"
    assert on_page - computed_numbers() == set()


def test_legend_block_is_the_commands_legend():
    for line in legend_lines(ledger(REF), 0, 0):
        assert line in DOC, line


def test_v_includes_r0_sentence():
    mc = tokens(f"{REF} --lam 1")
    assert mc[0].returns - 1.0 * mc[1].returns == pytest.approx(mc[0].token_rewards)  # γ = 1
    assert f"R_0 - γ·R_1 = {fmt(mc[0].returns)} - {fmt(mc[1].returns)} = {fmt(mc[0].token_rewards)} = r_0" in PROSE


def test_whitened_returns_sentence():
    ref = tokens(REF)
    wrong = [fmt(t.whitened_advantages + t.values) for t in ref]
    assert f"Â_i + V(s_i)` would be `[{', '.join(wrong)}]`" in PROSE
    assert f"r_5 = {fmt(ref[5].token_rewards)}`, the target would be `{wrong[5]}`" in PROSE
    assert ref[5].whitened_advantages + ref[5].values < 0 < ref[5].token_rewards


def test_lambda_sentences():
    td, mc, ref = tokens(f"{REF} --lam 0"), tokens(f"{REF} --lam 1"), tokens(REF)
    assert [t.advantages for t in td] == pytest.approx([t.deltas for t in td])
    assert f"R_0 = r_0 + γ·V(s_1) = {fmt(td[0].token_rewards)} + {fmt(td[1].values)} = {fmt(td[0].returns)}" in PROSE
    rewards = [t.token_rewards for t in mc]
    total = fmt(rewards[0]) + "".join(f" - {fmt(-r)}" if r < 0 else f" + {fmt(r)}" for r in rewards[1:])
    assert mc[0].returns == pytest.approx(sum(rewards))
    assert f"R_0 = {total} = {fmt(mc[0].returns)}" in PROSE
    assert f"A_0 = {fmt(mc[0].returns)} - {fmt(mc[0].values)} = {fmt(mc[0].advantages)}" in PROSE
    assert td[0].advantages < ref[0].advantages < mc[0].advantages
    assert f"λ = 0.95 lies between: `A_0 = {fmt(ref[0].advantages)}`" in PROSE


def test_observation_sentence():
    obs = tokens("--input examples/explain/observation_tokens.json")
    assert [t.response_mask for t in obs[2:7]] == [True, False, False, False, True]
    assert (
        f"δ_2 = r_2 + γ·V(s_6) - V(s_2) = {fmt(obs[2].token_rewards)} + {fmt(obs[6].values)} - "
        f"{fmt(obs[2].values)} = {fmt(obs[2].deltas)}" in PROSE
    )
    assert (
        f"A_2 = δ_2 + γλ·A_6 = {fmt(obs[2].deltas)} + 0.95·{fmt(obs[6].advantages)} = {fmt(obs[2].advantages)}" in PROSE
    )
    assert f"observation positions ({fmt(obs[3].values)})" in PROSE


def test_group_table_and_sentences():
    group = ledger("--input examples/explain/grpo_group.json").responses
    scores = [sequence_score(r) for r in group]
    assert f"mean `{fmt(statistics.fmean(scores))}`" in PROSE
    assert f"deviation `{fmt(statistics.stdev(scores))}`" in PROSE
    for resp in group:
        assert len({t.advantages for t in resp.tokens}) == 1  # broadcast
        assert f"| {resp.response} | {fmt(sequence_score(resp))} | {fmt(resp.tokens[0].advantages)} |" in DOC
    ref = tokens(REF)
    assert f"(`{fmt(ref[0].advantages)}` for 是 down to `{fmt(ref[5].advantages)}` for ！" in PROSE


def test_monotonicity_sentences():
    mc = tokens(f"{REF} --lam 1")
    assert f"`R` goes from `{fmt(mc[0].returns)}` to `{fmt(mc[5].returns)}`" in PROSE
    assert mc[2].kl < 0 < mc[2].token_rewards and mc[2].returns > mc[3].returns
    assert f"(`kl_2 = {fmt(mc[2].kl)}`), which turns `r_2 = {fmt(mc[2].token_rewards)}`" in PROSE
    assert f"R_2 = {fmt(mc[2].returns)} > R_3 = {fmt(mc[3].returns)}" in PROSE
    dense = [fmt(t.returns) for t in tokens(DENSE)]
    assert f"returns `[{', '.join(dense)}]`" in PROSE
    assert f"glassrl explain {DENSE}" in DOC


def test_every_command_on_the_page_runs(tmp_path):
    commands = re.findall(r"^glassrl (explain .*)$", DOC, flags=re.M)
    assert len(commands) == 5
    for k, command in enumerate(commands):
        argv = [str(ROOT / a) if a.startswith("examples/") else a for a in shlex.split(command)]
        assert cli.main([*argv, "--out", str(tmp_path / f"{k}.txt")]) == 0, command
