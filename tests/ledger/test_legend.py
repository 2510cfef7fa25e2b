"""glassrl.ledger.legend: the one legend, in every language from one formatting function.

Hand-written lines for the reference example (dialogue c, question 1) in English and
Chinese; the phrase tables agree on keys and slots; every language says the same
numbers in the same order for every estimator; the terminal aligns CJK labels.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

import pytest

from glassrl.algos.advantages import ADVANTAGE_ESTIMATORS
from glassrl.cli import build_parser
from glassrl.commands import explain, explain_input
from glassrl.ledger.legend import (
    ACCOUNTS,
    _width,
    baseline_legend,
    factor,
    fmt,
    terminal_line,
    token_legend,
)
from glassrl.ledger.phrases import LANGUAGES, PHRASES, label, phrase
from glassrl.ledger.render import legend_lines, legend_text

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = str(ROOT / "examples/explain/reference_dialogue_c.json")
GROUP = str(ROOT / "examples/explain/grpo_group.json")
OBSERVATION = str(ROOT / "examples/explain/observation_tokens.json")
NUMBER = re.compile(r"-?\d+\.\d{4}(?!\d)")


def ledger_of(*argv: str):
    args = build_parser(only="explain").parse_args(["explain", *argv])
    return explain.build_ledger(explain_input.from_args(args))


# ---------------------------------------------------------------- hand-written lines


def test_reference_token_0_in_english():
    assert legend_lines(ledger_of("--input", REFERENCE), 0, 0) == [
        "response 0, token 0: a_0 = '是'",
        "  state   s_0 = the prompt = '请问1+1=2？'",
        "  action  a_0 = '是', the token itself",
        "  reward  r_0 = score_0 − β·kl_0 = 0.0000 − 0.1·0.1000 = -0.0100",
        "  value   V(s_0) = 0.2000: the critic's estimate of r_0 + γ·r_1 + …, read before a_0; it includes r_0",
        "  TD      δ_0 = r_0 + γ·V(s_1) − V(s_0) = -0.0100 + 1·0.2500 − 0.2000 = 0.0400",
        "  adv     A_0 = δ_0 + γλ·A_1 = 0.0400 + 0.95·0.6117 = 0.6211",
        "  return  R_0 = A_0 + V(s_0) = 0.6211 + 0.2000 = 0.8211: target of V(s_0), includes r_0; "
        "raw A_0, not the whitened one",
        "  whiten  Â_0 = 0.8224: A_0 whitened over all valid tokens; only the policy loss sees it",
    ]


def test_reference_tokens_in_chinese():
    ledger = ledger_of("--input", REFERENCE)
    assert legend_lines(ledger, 0, 0, "zh") == [
        "回答 0，token 0：a_0 = '是'",
        "  状态    s_0 = prompt 本身 = '请问1+1=2？'",
        "  动作    a_0 = '是'，即这个 token 本身",
        "  奖励    r_0 = score_0 − β·kl_0 = 0.0000 − 0.1·0.1000 = -0.0100",
        "  价值    V(s_0) = 0.2000：critic 对 r_0 + γ·r_1 + … 的估计，在 a_0 之前读出；它包含 r_0",
        "  TD      δ_0 = r_0 + γ·V(s_1) − V(s_0) = -0.0100 + 1·0.2500 − 0.2000 = 0.0400",
        "  优势    A_0 = δ_0 + γλ·A_1 = 0.0400 + 0.95·0.6117 = 0.6211",
        "  回报    R_0 = A_0 + V(s_0) = 0.6211 + 0.2000 = 0.8211：V(s_0) 的训练目标，包含 r_0；"
        "用的是原始的 A_0，不是白化后的",
        "  白化    Â_0 = 0.8224：A_0 在全部有效 token 上白化的结果；只有策略损失使用它",
    ]
    last = legend_lines(ledger, 0, 5, "zh")
    assert (
        last[5]
        == "  TD      δ_5 = r_5 + γ·V(s_6) − V(s_5) = 0.9950 + 1·0 − 0.6000 = 0.3950   （V(s_6) = 0：回答已结束）"
    )
    assert last[6] == "  优势    A_5 = δ_5 = 0.3950   （其后没有 token）"


def test_observation_token_and_carry_in_chinese():
    ledger = ledger_of("--input", OBSERVATION)
    obs = legend_lines(ledger, 0, 4, "zh")
    assert obs[-1].startswith("  a_4 是观测 token（mask 0）：不是策略的动作") and len(obs) == 3
    td = legend_lines(ledger, 0, 2, "zh")[5]
    assert td == (
        "  TD      δ_2 = r_2 + γ·V(s_6) − V(s_2) = -0.0020 + 1·0.8000 − 0.4000 = 0.3980   "
        "（s_6：下一个生成的 token；观测 token 3…5 被跨过）"
    )


def test_group_baselines_in_chinese():
    text = legend_text(ledger_of("--input", GROUP), 0, [0], "zh")
    assert text[:3] == [
        "基线（每个回答的优势如何由它的组或基线得出）：",
        "  组 0：每个回答的 S = Σ_i r_i = [1.0000, 0.0000, 1.0000, 0.0000]，均值 0.5000，标准差 0.5774（无偏）",
        "    回答 0：A = (S − 均值)/(标准差 + ε) = (1.0000 − 0.5000)/(0.5774 + ε) = 0.8660",
    ]
    assert "  优势    A_0 = 0.8660：整个回答的优势（基线见上），每个生成的 token 都相同（任务级信用分配）" in text


# ---------------------------------------------------------------- languages are data


def slots(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_language_has_every_phrase_with_the_same_slots(lang):
    assert set(PHRASES) == set(LANGUAGES)
    assert PHRASES[lang].keys() == PHRASES["en"].keys()
    for key, text in PHRASES[lang].items():
        assert slots(text) == slots(PHRASES["en"][key]), f"{lang} {key}"


def test_every_estimator_has_an_account():
    """Adding an estimator means telling its credit in the legend (docs/algorithms/README.md)."""
    assert ACCOUNTS.keys() == ADVANTAGE_ESTIMATORS.keys()


CASES = ["gae", "gae-observation", "gae-logprobs", *(e for e in ADVANTAGE_ESTIMATORS if e != "gae")]


def case_ledger(name: str, tmp_path: Path):
    """A ledger for each estimator the legend knows, with and without a critic, log-probs, observation tokens."""
    if name == "gae":
        return ledger_of("--input", REFERENCE)
    if name == "gae-observation":
        return ledger_of("--input", OBSERVATION)
    if name == "gae-logprobs":
        return ledger_of(
            "--tokens", "a", "b", "--score", "1", "--values", "0.1", "0.2", "--beta", "0.5",
            "--logprobs", "-1", "-2", "--ref-logprobs", "-1.5", "-1",
        )  # fmt: skip
    if name == "grpo_process":
        data = {
            "estimator": name,
            "responses": [
                {"tokens": ["a", "b", "c", "d"], "step_ends": [1, 3], "step_scores": [1.0, 0.0]},
                {"tokens": ["e", "f", "g"], "step_ends": [2], "step_scores": [0.5]},
            ],
        }
    else:  # the GRPO group, with a greedy-response reward so that ReMax can run too
        data = {**json.loads(Path(GROUP).read_text(encoding="utf-8")), "estimator": name}
        for resp in data["responses"]:
            resp["baseline_reward"] = 0.5
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return ledger_of("--input", str(path))


@pytest.mark.parametrize("name", CASES)
def test_every_language_says_the_same_numbers_in_the_same_order(name, tmp_path):
    """One formatting function: a language changes the words, never which lines or which numbers."""
    ledger = case_ledger(name, tmp_path)
    for b, resp in enumerate(ledger.responses):
        for i in range(resp.length):
            lines = {lang: token_legend(ledger, b, i, lang) for lang in LANGUAGES}
            for lang in LANGUAGES:
                assert [x.key for x in lines[lang]] == [x.key for x in lines["en"]], (name, b, i, lang)
                assert [NUMBER.findall(x.text) for x in lines[lang]] == [NUMBER.findall(x.text) for x in lines["en"]]
    baselines = {lang: baseline_legend(ledger, lang) for lang in LANGUAGES}
    for lang in LANGUAGES:
        assert [NUMBER.findall(x) for x in baselines[lang]] == [NUMBER.findall(x) for x in baselines["en"]]
    assert baselines["en"] or name.startswith("gae") or name == "reinforce_pp"


@pytest.mark.parametrize("lang", LANGUAGES)
def test_terminal_labels_line_up_in_display_columns(lang):
    ledger = ledger_of("--input", REFERENCE)
    for line in token_legend(ledger, 0, 1, lang):
        shown = terminal_line(line, lang)
        if line.key in ("token", "obs"):
            continue
        assert shown.endswith(line.text)
        assert _width(shown[: len(shown) - len(line.text)]) == 10, shown  # 2 spaces + an 8-column label
        assert label(line.key, lang) in shown


def test_unknown_language_is_an_error_naming_the_valid_ones():
    with pytest.raises(ValueError, match="legend language 'fr': valid: en, zh"):
        phrase("token", "fr", b=0, i=0, token="'x'")


def test_numbers_are_written_one_way():
    assert [fmt(None), fmt(-0.00001), fmt(0.62108), fmt(float("nan"))] == ["—", "0.0000", "0.6211", "nan"]
    assert [factor(-0.05), factor(0.1), factor(None)] == ["(-0.0500)", "0.1000", "—"]
