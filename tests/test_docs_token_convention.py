"""docs/token-convention.md and docs/zh/token-convention.md cannot drift: every table and number is recomputed.

- Each table after a ``<!-- ledger: ARGS -->`` marker must equal, cell by cell, the
  ledger that ``glassrl explain ARGS`` computes.
- Every 4-decimal number on a page must be one that glassrl computed for the
  page's examples; the sentences that do arithmetic are checked one by one.
- Every ``glassrl explain`` command shown on a page runs (exit 0).
- The ``$ glassrl explain`` blocks of README.md and README_zh.md are what the command prints.
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
from glassrl.ledger.legend import sequence_score
from glassrl.ledger.phrases import phrase
from glassrl.ledger.render import COLUMNS, cell, columns, fmt, legend_lines

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "token-convention.md").read_text(encoding="utf-8")
PROSE = re.sub(r"\s+", " ", DOC.replace("−", "-"))  # one spelling of minus, one space: for sentence checks
REF = "--input examples/explain/reference_dialogue_c.json"
DOC_ZH = (ROOT / "docs" / "zh" / "token-convention.md").read_text(encoding="utf-8")
PROSE_ZH = re.sub(r"\s+", " ", DOC_ZH.replace("−", "-"))
DENSE = "--tokens 是 的 ， 等于 2 ！ --token-scores 0.2 0.2 0.2 0.2 0.2 0.2 --values 0 0 0 0 0 0 --lam 1"


def ledger(args: str):
    argv = ["explain", *(str(ROOT / a) if a.startswith("examples/") else a for a in shlex.split(args))]
    return explain.build_ledger(explain_input.from_args(build_parser(only="explain").parse_args(argv)))


def tokens(args: str):
    return ledger(args).responses[0].tokens


def marked_tables(doc: str = DOC) -> list[tuple[str, list[list[str]]]]:
    """(ARGS, rows of cells, header first) for each table under a ledger marker."""
    out = []
    lines = doc.splitlines()
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


TABLES = [(args, table) for doc in (DOC, DOC_ZH) for args, table in marked_tables(doc)]


@pytest.mark.parametrize(("args", "table"), TABLES, ids=[f"{k}: {a}" for k, (a, _) in enumerate(TABLES)])
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


@pytest.mark.parametrize("doc", [DOC, DOC_ZH], ids=["en", "zh"])
def test_every_four_decimal_number_is_computed_by_glassrl(doc):
    on_page = set(re.findall(r"-?\d+\.\d{4}(?!\d)", doc.replace("−", "-")))
    assert on_page, "the page should show numbers"
    assert on_page - computed_numbers() == set()


# The sentences that do arithmetic, per page: the words around the numbers (str.format slots).
SENTENCES = {
    "en": {
        "wrong_targets": "Â_i + V(s_i)` would be `[{wrong}]`",
        "target_5": "r_5 = {r5}`, the target would be `{w5}`",
        "between": "λ = 0.95 lies between: `A_0 = {a0}`",
        "mean": "mean `{mean}`",
        "std": "deviation `{std}`",
        "gae_credit": "(`{a0}` for 是 down to `{a5}` for ！",
        "goes": "`R` goes from `{first}` to `{last}`",
        "negative_kl": "(`kl_2 = {kl}`), which turns `r_2 = {r}`",
        "dense": "returns `[{dense}]`",
    },
    "zh": {
        "wrong_targets": "`Â_i + V(s_i)` 会是 `[{wrong}]`",
        "target_5": "`r_5 = {r5}`，目标却会是 `{w5}`",
        "between": "λ = 0.95 介于两者之间：`A_0 = {a0}`",
        "mean": "组均值 `{mean}`",
        "std": "无偏标准差 `{std}`",
        "gae_credit": "从 是 的 `{a0}` 递减到 ！ 的 `{a5}`",
        "goes": "`R` 从 `{first}` 到 `{last}`，但并不单调",
        "negative_kl": "（`kl_2 = {kl}`），这让 `r_2 = {r}`",
        "dense": "回报是 `[{dense}]`，逐步递减",
    },
}
PAGES = {"en": (DOC, PROSE), "zh": (DOC_ZH, PROSE_ZH)}
LANGS = pytest.mark.parametrize("lang", list(PAGES))


def says(lang: str, key: str, **numbers: str) -> bool:
    return SENTENCES[lang][key].format(**numbers) in PAGES[lang][1]


@LANGS
def test_legend_block_is_the_commands_legend(lang):
    assert "\n".join(legend_lines(ledger(REF), 0, 0, lang)) in PAGES[lang][0]


@LANGS
def test_v_includes_r0_sentence(lang):
    mc = tokens(f"{REF} --lam 1")
    assert mc[0].returns - 1.0 * mc[1].returns == pytest.approx(mc[0].token_rewards)  # γ = 1
    R0, R1, r0 = fmt(mc[0].returns), fmt(mc[1].returns), fmt(mc[0].token_rewards)
    assert f"R_0 - γ·R_1 = {R0} - {R1} = {r0} = r_0" in PAGES[lang][1]


@LANGS
def test_whitened_returns_sentence(lang):
    ref = tokens(REF)
    wrong = [fmt(t.whitened_advantages + t.values) for t in ref]
    assert says(lang, "wrong_targets", wrong=", ".join(wrong))
    assert says(lang, "target_5", r5=fmt(ref[5].token_rewards), w5=wrong[5])
    assert ref[5].whitened_advantages + ref[5].values < 0 < ref[5].token_rewards


@LANGS
def test_lambda_sentences(lang):
    prose = PAGES[lang][1]
    td, mc, ref = tokens(f"{REF} --lam 0"), tokens(f"{REF} --lam 1"), tokens(REF)
    assert [t.advantages for t in td] == pytest.approx([t.deltas for t in td])
    assert f"R_0 = r_0 + γ·V(s_1) = {fmt(td[0].token_rewards)} + {fmt(td[1].values)} = {fmt(td[0].returns)}" in prose
    rewards = [t.token_rewards for t in mc]
    total = fmt(rewards[0]) + "".join(f" - {fmt(-r)}" if r < 0 else f" + {fmt(r)}" for r in rewards[1:])
    assert mc[0].returns == pytest.approx(sum(rewards))
    assert f"R_0 = {total} = {fmt(mc[0].returns)}" in prose
    assert f"A_0 = {fmt(mc[0].returns)} - {fmt(mc[0].values)} = {fmt(mc[0].advantages)}" in prose
    assert td[0].advantages < ref[0].advantages < mc[0].advantages
    assert says(lang, "between", a0=fmt(ref[0].advantages))


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


@LANGS
def test_group_table_and_sentences(lang):
    group = ledger("--input examples/explain/grpo_group.json").responses
    scores = [sequence_score(r) for r in group]
    assert says(lang, "mean", mean=fmt(statistics.fmean(scores)))
    assert says(lang, "std", std=fmt(statistics.stdev(scores)))
    for resp in group:
        assert len({t.advantages for t in resp.tokens}) == 1  # broadcast
        assert {t.advantages for t in resp.tokens} == {t.returns for t in resp.tokens}  # no critic: R = A
        row = f"| {resp.response} | {fmt(sequence_score(resp))} | {fmt(resp.tokens[0].advantages)} |"
        assert row in PAGES[lang][0]
    ref = tokens(REF)
    assert [t.advantages for t in ref] == sorted((t.advantages for t in ref), reverse=True)
    assert says(lang, "gae_credit", a0=fmt(ref[0].advantages), a5=fmt(ref[5].advantages))


@LANGS
def test_monotonicity_sentences(lang):
    mc = tokens(f"{REF} --lam 1")
    assert says(lang, "goes", first=fmt(mc[0].returns), last=fmt(mc[5].returns))
    assert mc[2].kl < 0 < mc[2].token_rewards and mc[2].returns > mc[3].returns
    assert says(lang, "negative_kl", kl=fmt(mc[2].kl), r=fmt(mc[2].token_rewards))
    assert f"R_2 = {fmt(mc[2].returns)} > R_3 = {fmt(mc[3].returns)}" in PAGES[lang][1]
    dense = [t.returns for t in tokens(DENSE)]
    assert dense == sorted(dense, reverse=True)
    assert says(lang, "dense", dense=", ".join(fmt(x) for x in dense))
    assert f"glassrl explain {DENSE}" in PAGES[lang][0]


@LANGS
def test_every_command_on_the_page_runs(lang, tmp_path):
    commands = re.findall(r"^glassrl (explain .*)$", PAGES[lang][0], flags=re.M)
    assert len(commands) == 5
    for k, command in enumerate(commands):
        assert command.endswith("--lang zh") == (lang == "zh"), command
        argv = [str(ROOT / a) if a.startswith("examples/") else a for a in shlex.split(command)]
        out = tmp_path / f"{k}.txt"
        assert cli.main([*argv, "--out", str(out)]) == 0, command
        assert phrase("heading.legend", lang) in out.read_text(encoding="utf-8")


# ---------------------------------------------------------------- docs/zh/token-convention.md


def test_zh_page_answers_the_reference_questions_in_order():
    assert re.findall(r"^## (问题.*)$", DOC_ZH, flags=re.M) == [
        "问题一：V(s_0) 包含 r_0 吗？",
        "问题二：回报为什么用白化前的优势？",
        "问题三：结果奖励加 KL 时，V 沿回答单调递增吗？",
        "问题四：λ = 0 和 λ = 1 时 GAE 变成什么？",
        "问题五：PPO 的 token 级 GAE 与 GRPO 的任务级广播，信用分配有何不同？",
    ]
    assert [args for args, _ in marked_tables(DOC_ZH)] == [REF, f"{REF} --lam 0", f"{REF} --lam 1"]


def glossary() -> dict[str, list[str]]:
    """Chinese term -> the code names (backticked) in its row of the glossary table."""
    section = DOC_ZH.split("## 术语表", 1)[1].split("\n## ", 1)[0]
    rows = [re.split(r"(?<!\\)\|", line)[1:-1] for line in section.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): re.findall(r"`([^`]+)`", cells[2]) for cells in rows[1:]}


def test_zh_glossary_maps_the_reference_terms_to_names_that_exist():
    import importlib

    from glassrl.ledger import RESPONSE_FIELDS, RUN_FIELDS, TOKEN_FIELDS

    terms = glossary()
    expected = {
        "优势": "advantages",
        "回报": "returns",
        "价值": "values",
        "奖励": "token_rewards",
        "白化": "whitened_advantages",
        "掩码": "response_mask",
    }
    for term, name in expected.items():
        assert name in terms[term], (term, terms.get(term))
    assert "glassrl.algos.advantages.compute_advantages" in terms["信用分配"]
    for term, names in terms.items():
        assert names, term
        for name in names:
            if "." in name:
                module, attr = name.rsplit(".", 1)
                assert hasattr(importlib.import_module(module), attr), (term, name)
            else:
                assert name in TOKEN_FIELDS + RESPONSE_FIELDS + RUN_FIELDS, (term, name)


# ---------------------------------------------------------------- the READMEs' explain example


def readme_blocks(name: str) -> list[tuple[str, list[str]]]:
    """(command, printed lines) for each code block of README ``name`` that starts with ``$ glassrl explain``."""
    text = (ROOT / name).read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"^```\n(\$ glassrl explain .*?)^```$", text, flags=re.M | re.S):
        lines = block.rstrip("\n").split("\n")
        k = 0
        while lines[k].endswith("\\"):
            k += 1
        command = " ".join(line.rstrip("\\").strip() for line in lines[: k + 1]).removeprefix("$ glassrl ")
        out.append((command, lines[k + 1 :]))
    return out


@pytest.mark.parametrize("name", ["README.md", "README_zh.md"])
def test_readme_explain_example_is_what_explain_prints(name, tmp_path):
    blocks = readme_blocks(name)
    assert len(blocks) == 1
    command, shown = blocks[0]
    assert ("--lang zh" in command) == (name == "README_zh.md")
    out = tmp_path / "out.txt"
    assert cli.main([*shlex.split(command), "--out", str(out)]) == 0
    printed = [line.rstrip() for line in out.read_text(encoding="utf-8").rstrip("\n").split("\n")]
    assert shown == printed


def test_readmes_link_each_other_and_the_chinese_convention():
    assert "(README_zh.md)" in (ROOT / "README.md").read_text(encoding="utf-8").split("\n## ", 1)[0]
    zh = (ROOT / "README_zh.md").read_text(encoding="utf-8")
    assert "(README.md)" in zh and "(docs/zh/token-convention.md)" in zh and "术语表" in zh
