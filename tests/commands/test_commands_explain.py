"""`glassrl explain`: the reference example's numbers, every input path, one-line errors."""

from __future__ import annotations

import csv
import io
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl import cli
from glassrl.cli import build_parser
from glassrl.commands import explain, explain_input
from glassrl.ledger import read_jsonl
from glassrl.ledger.legend import baseline_legend, sequence_score
from glassrl.ledger.render import legend_lines
from helpers import flat_ledger_rows

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = str(ROOT / "examples/explain/reference_dialogue_c.json")
GROUP = str(ROOT / "examples/explain/grpo_group.json")
OBSERVATION = str(ROOT / "examples/explain/observation_tokens.json")
REFERENCE_FLAGS = [
    "--prompt",
    "请问1+1=2？",
    "--tokens",
    "是",
    "的",
    "，",
    "等于",
    "2",
    "！",
    "--score",
    "1",
    "--kl",
    "0.1",
    "0.05",
    "-0.05",
    "0.1",
    "0.2",
    "0.05",
    "--beta",
    "0.1",
    "--values",
    "0.20",
    "0.25",
    "0.30",
    "0.35",
    "0.45",
    "0.60",
    "--gamma",
    "1",
    "--lam",
    "0.95",
]


def run_jsonl(capsys, *argv: str) -> list[dict]:
    assert cli.main(["explain", *argv, "--format", "jsonl"]) == 0
    return flat_ledger_rows(capsys.readouterr().out)


def col(rows: list[dict], name: str) -> list:
    return [r[name] for r in rows]


def error(capsys, *argv: str) -> str:
    """Run explain expecting a user error: exit 2 and one line on stderr; return the message."""
    assert cli.main(["explain", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.removeprefix("glassrl explain: error: ").strip()


def ledger_of(*argv: str):
    args = build_parser(only="explain").parse_args(["explain", *argv])
    return explain.build_ledger(explain_input.from_args(args))


# ---------------------------------------------------------------- the reference example (dialogue c, question 1)


def test_reference_example_numbers(capsys):
    rows = run_jsonl(capsys, "--input", REFERENCE)
    assert col(rows, "token") == ["是", "的", "，", "等于", "2", "！"]
    assert col(rows, "token_scores") == [0, 0, 0, 0, 0, 1.0]
    assert col(rows, "token_rewards") == pytest.approx([-0.01, -0.005, 0.005, -0.01, -0.02, 0.995], abs=1e-12)
    assert col(rows, "deltas") == pytest.approx([0.04, 0.045, 0.055, 0.09, 0.13, 0.395], abs=1e-12)
    assert col(rows, "advantages") == pytest.approx([0.621081, 0.611664, 0.596488, 0.569988, 0.50525, 0.395], abs=1e-6)
    assert col(rows, "returns") == pytest.approx([0.821081, 0.861664, 0.896488, 0.919988, 0.95525, 0.995], abs=1e-6)
    # Hand check of two entries: A_4 = δ_4 + γλ·δ_5; R = A + V with the raw A.
    assert rows[4]["advantages"] == pytest.approx(0.13 + 0.95 * 0.395, abs=1e-12)
    for r in rows:
        assert r["returns"] == pytest.approx(r["advantages"] + r["values"], abs=1e-12)
    white = col(rows, "whitened_advantages")  # PPO whitening: unbiased variance over all 6 valid tokens
    assert statistics.fmean(white) == pytest.approx(0.0, abs=1e-9)
    assert statistics.stdev(white) == pytest.approx(1.0, abs=1e-6)
    assert {r["gamma"] for r in rows} == {1.0} and {r["lam"] for r in rows} == {0.95}


def test_flags_equal_the_file(capsys):
    from_flags = run_jsonl(capsys, *REFERENCE_FLAGS)
    from_file = run_jsonl(capsys, "--input", REFERENCE)
    assert from_flags == from_file


def test_lambda_zero_is_td_error_and_one_is_monte_carlo(capsys):
    td = run_jsonl(capsys, "--input", REFERENCE, "--lam", "0")
    assert col(td, "advantages") == pytest.approx(col(td, "deltas"), abs=1e-12)
    mc = run_jsonl(capsys, "--input", REFERENCE, "--lam", "1")
    rewards, values = col(mc, "token_rewards"), col(mc, "values")
    monte_carlo = [sum(rewards[i:]) for i in range(6)]  # γ = 1
    assert col(mc, "returns") == pytest.approx(monte_carlo, abs=1e-12)
    assert col(mc, "advantages") == pytest.approx([g - v for g, v in zip(monte_carlo, values)], abs=1e-12)


def test_jsonl_out_file_round_trips(tmp_path, capsys):
    out = tmp_path / "ledger.jsonl"
    assert cli.main(["explain", "--input", REFERENCE, "--format", "jsonl", "--out", str(out)]) == 0
    assert capsys.readouterr().out == ""
    assert read_jsonl(out) == ledger_of("--input", REFERENCE)


def test_table_output_has_legend_with_row_arithmetic(capsys):
    assert cli.main(["explain", "--input", REFERENCE]) == 0
    out = capsys.readouterr().out
    assert "V(s_i)" in out and "0.6211" in out
    assert "δ_0 = r_0 + γ·V(s_1) − V(s_0) = -0.0100 + 1·0.2500 − 0.2000 = 0.0400" in out
    assert "A_0 = δ_0 + γλ·A_1 = 0.0400 + 0.95·0.6117 = 0.6211" in out
    assert "R_0 = A_0 + V(s_0) = 0.6211 + 0.2000 = 0.8211" in out
    assert "δ_5 = r_5 + γ·V(s_6) − V(s_5) = 0.9950 + 1·0 − 0.6000 = 0.3950" in out
    assert "s_5 = prompt ⊕ y_<5 = '请问1+1=2？' ⊕ '是的，等于2'" in out
    assert cli.main(["explain", "--input", REFERENCE, "--legend-token", "2"]) == 0
    out = capsys.readouterr().out
    assert "r_2 = score_2 − β·kl_2 = 0.0000 − 0.1·(-0.0500) = 0.0050" in out and "token 0:" not in out


def test_lang_zh_changes_the_legend_and_nothing_else(capsys):
    assert cli.main(["explain", "--input", REFERENCE, "--format", "markdown"]) == 0
    en = capsys.readouterr().out
    assert cli.main(["explain", "--input", REFERENCE, "--format", "markdown", "--lang", "zh"]) == 0
    zh = capsys.readouterr().out
    table, legend_zh = zh.split("```text\n")
    assert table == en.split("```text\n")[0]  # the ledger itself does not depend on the language
    assert legend_zh.splitlines()[:2] == [
        "逐 token 说明（s_i = 生成 token i 之前的状态，a_i = 该 token；values[i] = V(s_i) 在 a_i 之前读出）：",
        "回答 0，token 0：a_0 = '是'",
    ]
    assert "  优势    A_5 = δ_5 = 0.3950   （其后没有 token）" in legend_zh
    assert cli.main(["explain", "--input", GROUP, "--lang", "zh", "--legend-token", "0"]) == 0
    assert "基线（每个回答的优势如何由它的组或基线得出）：" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:  # argparse's choices, as --format's
        cli.main(["explain", "--input", REFERENCE, "--lang", "fr"])
    assert exit_.value.code == 2 and "invalid choice: 'fr'" in capsys.readouterr().err


def test_markdown_and_csv_formats(tmp_path, capsys):
    assert cli.main(["explain", "--input", REFERENCE, "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert "| 5 | ！ | 0.0500 | 1.0000 | 0.9950 | 0.6000 | 0.3950 | 0.3950 | 0.9950 |" in md
    assert "```text\n" in md and "A_5 = δ_5 = 0.3950" in md
    out = tmp_path / "l.csv"
    assert cli.main(["explain", "--input", REFERENCE, "--format", "csv", "--out", str(out)]) == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    assert [float(r["advantages"]) for r in rows] == pytest.approx(
        [0.621081, 0.611664, 0.596488, 0.569988, 0.50525, 0.395], abs=1e-6
    )
    table = tmp_path / "t.txt"
    assert cli.main(["explain", "--input", REFERENCE, "--out", str(table)]) == 0
    assert "0.8211" in table.read_text(encoding="utf-8") and "\x1b[" not in table.read_text(encoding="utf-8")


def test_logprob_pairs_use_the_kl_estimator(capsys):
    lp, ref = ["-1.0", "-2.0"], ["-1.5", "-1.0"]
    base = [
        "--tokens",
        "a",
        "b",
        "--score",
        "1",
        "--values",
        "0",
        "0",
        "--beta",
        "0.5",
        "--logprobs",
        *lp,
        "--ref-logprobs",
        *ref,
        "--no-whiten",
    ]
    k1 = run_jsonl(capsys, *base)
    assert col(k1, "kl") == pytest.approx([0.5, -1.0]) and col(k1, "token_rewards") == pytest.approx([-0.25, 1.5])
    assert k1[0]["kl_kind"] == "k1" and k1[0]["whitened_advantages"] is None
    k3 = run_jsonl(capsys, *base, "--kl-kind", "k3")
    x = -0.5  # log π_ref − log π of token 0; k3 = e^x − x − 1
    assert k3[0]["kl"] == pytest.approx(torch.tensor(x).exp().item() - x - 1)


def test_observation_tokens_are_carried(capsys):
    rows = run_jsonl(capsys, "--input", OBSERVATION)
    masks = col(rows, "response_mask")
    assert False in masks
    first_obs = masks.index(False)
    after = masks.index(True, first_obs)
    before = rows[first_obs - 1]
    g = before["gamma"]
    # the last generated token before the observation bootstraps from the first one after it
    assert before["deltas"] == pytest.approx(before["token_rewards"] + g * rows[after]["values"] - before["values"])
    assert rows[first_obs]["advantages"] is None and rows[first_obs]["token_rewards"] is None
    assert cli.main(["explain", "--input", OBSERVATION, "--legend-token", str(first_obs - 1)]) == 0
    assert f"observation tokens {first_obs}…{after - 1} carried" in capsys.readouterr().out


def test_tokenizer_splits_the_response(tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({"[UNK]": 0, "yes": 1, "it": 2, "is": 3, "2": 4, "!": 5}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    rows = run_jsonl(
        capsys,
        "--response",
        "yes it is 2!",
        "--tokenizer",
        str(tmp_path / "tok"),
        "--score",
        "1",
        "--values",
        "0",
        "0",
        "0",
        "0",
        "0",
    )
    assert col(rows, "token") == ["yes", "it", "is", "2", "!"] and col(rows, "token_id") == [1, 2, 3, 4, 5]
    assert rows[0]["response"] == "yes it is 2!"
    # in a file, "tokenizer" is relative to the file
    (tmp_path / "in.yaml").write_text(
        "tokenizer: tok\nestimator: rloo\nresponses:\n"
        "  - {response: yes it is, score: 1}\n  - {response: '2 !', score: 0}\n",
        encoding="utf-8",
    )
    rows = run_jsonl(capsys, "--input", str(tmp_path / "in.yaml"))
    assert col(rows, "token") == ["yes", "it", "is", "2", "!"] and col(rows, "advantages") == [1, 1, 1, -1, -1]


# ---------------------------------------------------------------- group estimators


def test_grpo_group_broadcasts_one_advantage_per_response(capsys):
    rows = run_jsonl(capsys, "--input", GROUP)
    by_response: dict[int, set] = {}
    for r in rows:
        by_response.setdefault(r["response_index"], set()).add(r["advantages"])
    expected = 0.5 / (statistics.stdev([1, 0, 1, 0]) + 1e-6)
    assert [len(by_response[b]) for b in range(4)] == [1, 1, 1, 1]  # one advantage per response
    assert [by_response[b].pop() for b in range(4)] == pytest.approx([expected, -expected, expected, -expected])
    assert {r["values"] for r in rows} == {None} and {r["deltas"] for r in rows} == {None}
    assert cli.main(["explain", "--input", GROUP]) == 0
    out = capsys.readouterr().out
    assert "mean 0.5000, std 0.5774" in out and "(0.0000 − 0.5000)/(0.5774 + ε) = -0.8660" in out
    assert cli.main(["explain", "--input", GROUP, "--legend-response", "3", "--legend-token", "1"]) == 0
    out = capsys.readouterr().out
    assert "response 3, token 1: a_1 = '11'" in out and "A_1 = -0.8660" in out


def group_file(tmp_path: Path) -> str:
    """The GRPO example with a greedy-response reward of 0.5 for each response, so that ReMax can run too."""
    data = json.loads(Path(GROUP).read_text(encoding="utf-8"))
    for resp in data["responses"]:
        resp["baseline_reward"] = 0.5
    path = tmp_path / "group.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "remax", "reinforce_pp_baseline"])
def test_baseline_legend_agrees_with_the_estimator(tmp_path, estimator):
    """The legend recomputes each baseline in plain Python; it must match what glassrl.algos computed."""
    ledger = ledger_of("--input", group_file(tmp_path), "--estimator", estimator)
    assert baseline_legend(ledger)
    S = [sequence_score(r) for r in ledger.responses]
    mean, std = statistics.fmean(S), statistics.stdev(S)
    for b, resp in enumerate(ledger.responses):
        expected = {
            "grpo": (S[b] - mean) / (std + 1e-6),
            "dr_grpo": S[b] - mean,
            "rloo": S[b] - (sum(S) - S[b]) / (len(S) - 1),
            "remax": S[b] - 0.5,
            "reinforce_pp_baseline": S[b] - mean,  # the raw (pre-whitening) value is R
        }[estimator]
        got = resp.tokens[0].returns if estimator == "reinforce_pp_baseline" else resp.tokens[0].advantages
        assert got == pytest.approx(expected, abs=1e-9)
        assert f"{expected:.4f}" in "\n".join(baseline_legend(ledger))


def test_remax_returns_are_the_reward_to_go(capsys):
    # r = score − β·kl = [0 − 0.5·0.1, 0 − 0.5·0.2, 1 − 0.5·0.3] = [−0.05, −0.1, 0.85]; S = 0.7.
    # A = S − greedy reward = 0.7 − 0.4 = 0.3 on every token; R_i = Σ_{j≥i} r_j = [0.7, 0.75, 0.85].
    rows = run_jsonl(
        capsys,
        *["--tokens", "a", "b", "c", "--score", "1", "--kl", "0.1", "0.2", "0.3", "--beta", "0.5"],
        *["--estimator", "remax", "--baseline-reward", "0.4"],
    )
    assert col(rows, "token_rewards") == pytest.approx([-0.05, -0.1, 0.85], abs=1e-12)
    assert col(rows, "advantages") == pytest.approx([0.3, 0.3, 0.3], abs=1e-12)
    assert col(rows, "returns") == pytest.approx([0.7, 0.75, 0.85], abs=1e-12)


def test_grpo_process_step_rewards(tmp_path, capsys):
    path = tmp_path / "proc.yaml"
    path.write_text(
        "estimator: grpo_process\nresponses:\n"
        "  - {tokens: [a, b, c, d], step_ends: [1, 3], step_scores: [1.0, 0.0]}\n"
        "  - {tokens: [e, f, g], step_ends: [2], step_scores: [0.5]}\n",
        encoding="utf-8",
    )
    rows = run_jsonl(capsys, "--input", str(path))
    # step rewards 1, 0, 0.5: mean 0.5, std 0.5 -> r̃ = 1, −1, 0; A_i = Σ r̃ of steps ending at or after i
    assert col(rows, "advantages") == pytest.approx([0, 0, -1, -1, 0, 0, 0], abs=1e-5)
    assert col(rows, "step_end") == [False, True, False, True, False, False, True]


def test_legend_lines_for_every_estimator(tmp_path):
    for estimator in ("grpo", "dr_grpo", "rloo", "remax", "reinforce_pp", "reinforce_pp_baseline"):
        ledger = ledger_of("--input", group_file(tmp_path), "--estimator", estimator)
        text = "\n".join(legend_lines(ledger, 1, 0))
        assert "state   s_0 = the prompt" in text and "A_0 = " in text


# ---------------------------------------------------------------- errors: one line naming the argument, exit 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--tokens", "a", "b", "--score", "1", "--values", "0.1"],
            "--values: expected 2 numbers (one per token), got 1",
        ),
        (["--input", REFERENCE, "--lam", "1.5"], "--lam: must be in [0, 1], got 1.5"),
        (["--tokens", "a", "b", "--score", "1"], "--values is required by estimator gae"),
        (["--tokens", "a", "--score", "x", "--values", "0"], "--score: expected a number, got 'x'"),
        (
            ["--tokens", "a", "b", "--score", "1", "--values", "0", "0", "--estimator", "ppo"],
            "--estimator: unknown 'ppo'; valid: gae, grpo, dr_grpo, grpo_process, rloo, remax, reinforce_pp, "
            "reinforce_pp_baseline",
        ),
        (
            ["--tokens", "a", "b", "--score", "1", "--values", "0", "0", "--beta", "0.1"],
            "--kl: missing (β = 0.1 needs kl, or logprobs and ref_logprobs)",
        ),
        (
            ["--tokens", "a", "b", "--values", "0", "0"],
            "--score: missing (or give token_scores, or step_ends with step_scores)",
        ),
        (
            ["--tokens", "a", "b", "--score", "1", "--values", "0", "0", "--mask", "1", "2"],
            "--mask: expected 0 or 1 at position 1, got 2",
        ),
        (
            ["--tokens", "a", "b", "--score", "1", "--values", "0", "0", "--logprobs", "-1", "-1"],
            "--ref-logprobs: missing (log-prob pairs need both logprobs and ref_logprobs)",
        ),
        (["--input", REFERENCE, "--tokens", "a"], "--tokens: cannot be combined with --input (put it in the file)"),
        (["--input", REFERENCE, "--legend-token", "6"], "--legend-token: response 0 has tokens 0 … 5, got 6"),
        (["--input", REFERENCE, "--gamma", "-1"], "--gamma: must be in [0, 1], got -1"),
        (
            ["--tokens", "a", "--score", "1", "--values", "0"],
            "--whiten: whitening needs at least 2 generated tokens, the input has 1 (use --no-whiten)",
        ),
        (
            ["--tokens", "a", "b", "--score", "1", "--estimator", "grpo"],
            "--estimator: estimator grpo compares the responses of a group, and group 0 has 1 response "
            "(give at least 2 per group in --input FILE)",
        ),
        (["--input", "/nonexistent/x.json"], "--input: file not found: /nonexistent/x.json"),
        (
            ["--response", "hello", "--score", "1"],
            "--response: needs --tokenizer PATH (a local Hugging Face tokenizer)",
        ),
    ],
)
def test_errors_name_the_argument(capsys, argv, message):
    assert error(capsys, *argv) == message


def test_file_errors_name_file_and_field(tmp_path, capsys):
    data = json.loads(Path(REFERENCE).read_text(encoding="utf-8"))
    data["responses"].append({"tokens": ["x", "y"], "kl": [0, 0], "values": [0, 0]})
    path = tmp_path / "input.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert error(capsys, "--input", str(path)) == (
        f"{path}: responses[1].score: missing (or give token_scores, or step_ends with step_scores)"
    )
    data["responses"][1] = {"tokens": ["x"], "score": 1, "kl": [0], "values": [0]}
    path.write_text(json.dumps(data), encoding="utf-8")
    assert cli.main(["explain", "--input", str(path), "--format", "jsonl"]) == 0  # lengths 6 and 1 are fine
    assert len(capsys.readouterr().out.splitlines()) == 2 + 7  # a row per response, then one per token
    data["responses"][1] = {"tokens": ["x"], "score": 1, "kl": [0]}
    path.write_text(json.dumps(data), encoding="utf-8")
    assert error(capsys, "--input", str(path)) == f"{path}: responses[1].values is required by estimator gae"
    data["lam"] = 2
    path.write_text(json.dumps(data), encoding="utf-8")
    assert error(capsys, "--input", str(path)) == f"{path}: lam: must be in [0, 1], got 2"
    data["lam"], data["responses"][1] = 0.5, {"tokens": ["x"], "score": 1, "kl": [0], "valuez": [0]}
    path.write_text(json.dumps(data), encoding="utf-8")
    assert error(capsys, "--input", str(path)).startswith(f"{path}: responses[1]: unknown key 'valuez'; valid keys:")
    path.write_text("{bad json", encoding="utf-8")
    assert error(capsys, "--input", str(path)).startswith(f"{path}:1: not valid JSON")


@pytest.mark.slow
def test_subprocess_exit_code_and_no_traceback():
    """One real process (the in-process tests cover exit code 0): the error is one line on stderr, exit 2."""
    bad = subprocess.run(
        [sys.executable, "-m", "glassrl.cli", "explain", "--input", REFERENCE, "--lam", "1.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr == "glassrl explain: error: --lam: must be in [0, 1], got 1.5\n"
    assert "Traceback" not in bad.stdout + bad.stderr


# ---------------------------------------------------------------- invariants


@settings(max_examples=30, deadline=None)
@given(
    data=st.data(),
    T=st.integers(2, 7),
    lam=st.sampled_from(["0", "0.5", "0.95", "1"]),
    gamma=st.sampled_from(["1", "0.9"]),
)
def test_gae_ledger_invariants(data, T, lam, gamma):
    num = st.floats(-2, 2, allow_nan=False).map(lambda x: f"{x:.3f}")
    values = data.draw(st.lists(num, min_size=T, max_size=T))
    kl = data.draw(st.lists(num, min_size=T, max_size=T))
    mask = data.draw(st.lists(st.sampled_from(["0", "1"]), min_size=T, max_size=T).filter(lambda m: m.count("1") >= 2))
    ledger = ledger_of(
        "--tokens",
        *[f"t{i}" for i in range(T)],
        "--score",
        "1",
        "--values",
        *values,
        "--kl",
        *kl,
        "--beta",
        "0.1",
        "--mask",
        *mask,
        "--lam",
        lam,
        "--gamma",
        gamma,
    )
    rows = [r for r in ledger.responses[0].tokens if r.response_mask]
    for row in rows:  # R = A + V with the raw A; r = score − β·kl
        assert row.returns == pytest.approx(row.advantages + row.values, abs=1e-9)
        assert row.token_rewards == pytest.approx(row.token_scores - 0.1 * row.kl, abs=1e-9)
    # A_i = δ_i + γλ·A_next over generated tokens (observation tokens carried)
    for row, nxt in zip(rows, rows[1:] + [None]):
        carried = 0.0 if nxt is None else float(gamma) * float(lam) * nxt.advantages
        assert row.advantages == pytest.approx(row.deltas + carried, abs=1e-9)
    assert rows[-1].token_scores == 1.0  # the outcome score sits on the last generated token


def test_html_flag_writes_the_token_view(tmp_path):
    from glassrl.cli import main

    out = tmp_path / "explain.html"
    assert (
        main(
            [
                "explain",
                "--input",
                "examples/explain/reference_dialogue_c.json",
                "--format",
                "jsonl",
                "--out",
                str(tmp_path / "l.jsonl"),
                "--html",
                str(out),
            ]
        )
        == 0
    )
    page = out.read_text(encoding="utf-8")
    assert 'id="tokens"' in page and "等于" in page
