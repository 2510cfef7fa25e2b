"""The run report (glassrl.report.html, charts, run_dir) built from short real runs of the tiny model.

The ``runs`` fixture (tests/report/conftest.py) trains PPO and GRPO for 2 steps each on
the tiny default-format model; tests/report/test_report_browser.py opens the same runs'
report in Chromium.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from glassrl.errors import GlassrlError
from glassrl.ledger import TOKEN_FIELDS, Ledger, ResponseLedger, TokenRow, read_jsonl
from helpers import EXAMPLES


def embedded_payload(page: str) -> dict:
    """The token view's JSON, cut at the first "</script>" as a browser would."""
    start = page.index('<script type="application/json" id="token-data">') + len(
        '<script type="application/json" id="token-data">'
    )
    return json.loads(page[start : page.index("</script>", start)])


def token_dicts(payload_ledger: dict) -> list[list[dict]]:
    return [[dict(zip(TOKEN_FIELDS, row)) for row in resp["tokens"]] for resp in payload_ledger["responses"]]


@pytest.fixture(scope="module")
def report(runs, tmp_path_factory) -> tuple[Path, str]:
    from glassrl.report.html import write_run_report

    out = write_run_report([runs["ppo"], runs["grpo"]], tmp_path_factory.mktemp("report") / "report.html")
    return out, out.read_text(encoding="utf-8")


def test_report_is_self_contained_with_plotly_inlined_once(report):
    from plotly.offline import get_plotlyjs

    _, page = report
    assert page.count(get_plotlyjs()) == 1
    assert not re.search(r"<script[^>]*\bsrc=", page), "a script loaded from elsewhere: the page must work offline"
    assert not re.search(r"<link[^>]*\bhref=", page)
    assert "cdn.plot.ly" not in page.replace(get_plotlyjs(), "")


def test_every_logged_metric_is_drawn_once_with_both_runs(runs, report):
    from glassrl.report.charts import group_of

    _, page = report
    charts = dict(re.findall(r'<figure class="chart" data-chart="([a-z-]+)" data-keys="([^"]*)"', page))
    drawn = [key for keys in charts.values() for key in keys.split()]
    assert len(drawn) == len(set(drawn))
    logged = set()
    for preset in ("ppo", "grpo"):
        for line in (runs[preset] / "metrics.jsonl").read_text().splitlines():
            logged |= set(json.loads(line)) - {"step"}
    assert set(drawn) == logged
    for slug in (
        "reward",
        "accuracy",
        "kl",
        "entropy",
        "length",
        "clip",
        "losses",
        "explained-variance",
        "tokens-per-s",
    ):
        assert slug in charts and f'id="chart-{slug}"' in page
    assert group_of("critic/explained_variance") == "explained-variance"
    # Both runs appear in the legend of a chart both logged.
    start = page.index('id="chart-entropy"')
    entropy = page[start : page.index("</figure>", start)]
    assert '"name":"ppo"' in entropy and '"name":"grpo"' in entropy


def test_every_documented_metric_has_a_named_chart():
    from glassrl.report.charts import group_of
    from glassrl.report.metrics_doc import documented_patterns

    for pattern in documented_patterns():
        key = re.sub(r"<[a-z_]+>", "x1", pattern)
        assert group_of(key) != "other", f"{pattern} would land in 'Other metrics'"


def test_token_data_holds_every_ledger_exactly(runs, report):
    _, page = report
    payload = embedded_payload(page)
    assert [s["name"] for s in payload["sources"]] == ["ppo", "grpo"]
    assert payload["initial"] == {"source": 0, "ledger": 1}  # the first run's last ledger step
    for source, preset in zip(payload["sources"], ("ppo", "grpo")):
        files = sorted((runs[preset] / "ledgers").glob("step_*.jsonl"))
        assert [lg["step"] for lg in source["ledgers"]] == [1, 2] and len(files) == 2
        for got, file in zip(source["ledgers"], files):
            ledger = read_jsonl(file)
            assert (got["estimator"], got["gamma"], got["lam"], got["beta"]) == (
                ledger.estimator,
                ledger.gamma,
                ledger.lam,
                ledger.beta,
            )
            for resp, rows in zip(ledger.responses, token_dicts(got)):
                assert [TokenRow(**row) for row in rows] == list(resp.tokens)
    fields = [q["field"] for q in payload["quantities"]]
    assert fields[:5] == ["advantages", "whitened_advantages", "kl", "values", "returns"]


def test_config_and_environment_section(runs, report):
    import html

    _, page = report
    config_text = (runs["ppo"] / "config.yaml").read_text(encoding="utf-8")
    assert html.escape(config_text) in page
    # The trainer writes environment.json at the start of a run; the page shows that, not the report's machine.
    import torch

    assert "collected when the report was written" not in page
    assert json.loads((runs["ppo"] / "environment.json").read_text())["torch"] == torch.__version__

    assert f"<th>torch</th><td>{torch.__version__}</td>" in page


def test_trainer_writes_the_report_at_the_end_of_a_run(runs):
    # logging.report defaults to true: the run directory holds its own report, with the last step's ledger.
    for run in runs.values():
        page = (run / "report.html").read_text(encoding="utf-8")
        assert 'id="tokens"' in page and (run / "ledgers" / "step_000002.jsonl").is_file()


def test_a_run_is_reported_where_torch_cannot_be_imported(runs, tmp_path):
    """The report reads run directories and ledgers only: it works offline, without torch."""
    code = (
        "import sys; sys.modules['torch'] = sys.modules['transformers'] = None; "
        "from glassrl.report.html import write_run_report; write_run_report(sys.argv[1:2], sys.argv[2])"
    )
    out = tmp_path / "report.html"
    subprocess.run([sys.executable, "-c", code, str(runs["grpo"]), str(out)], check=True)
    assert "token-data" in out.read_text(encoding="utf-8")


def test_environment_json_is_read_when_present(tmp_path):
    from glassrl.report.run_dir import ENVIRONMENT, collect_environment, read_run

    env = collect_environment()
    assert {"python", "glassrl", "torch", "transformers", "device", "cpu_count"} <= set(env)
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n{"step": 2, "rew')  # killed mid-line
    (run / ENVIRONMENT).write_text(json.dumps({"python": "3.0", "device": "a GPU"}))
    got = read_run(run)
    assert got.environment == {"python": "3.0", "device": "a GPU"}
    assert "written by the run" in got.environment_source
    assert got.metrics == [{"step": 1, "reward/mean": 0.5}] and got.ledger_paths == {}


def test_bad_run_dirs_name_what_is_missing(tmp_path):
    from glassrl.report.run_dir import read_run

    with pytest.raises(GlassrlError, match=r"nowhere: not a directory"):
        read_run(tmp_path / "nowhere")
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    with pytest.raises(GlassrlError, match=rf"{re.escape(str(tmp_path))}: missing metrics.jsonl"):
        read_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(GlassrlError, match=r"metrics.jsonl:2: not valid JSON"):
        read_run(tmp_path)


def test_cli_writes_to_the_first_run_and_checks_step(runs, capsys):
    from glassrl.cli import main

    assert main(["report", str(runs["ppo"]), str(runs["grpo"])]) == 0
    out = runs["ppo"] / "report.html"
    assert capsys.readouterr().out.strip() == str(out) and out.is_file()
    assert embedded_payload(out.read_text(encoding="utf-8"))["initial"] == {"source": 0, "ledger": 1}
    assert main(["report", str(runs["grpo"]), "--step", "1", "--out", str(out)]) == 0
    assert embedded_payload(out.read_text(encoding="utf-8"))["initial"] == {"source": 0, "ledger": 0}
    assert main(["report", str(runs["ppo"]), "--step", "7"]) == 2
    assert "--step 7: no run has a ledger for that step (steps with a ledger: ppo: 1, 2)" in capsys.readouterr().err
    assert main(["report", str(runs["ppo"].parent)]) == 2
    assert "missing config.yaml and metrics.jsonl" in capsys.readouterr().err


def _tricky_ledger() -> Ledger:
    """A token that would end the script tag, a NaN whitened advantage, an observation token."""

    def row(i, token, mask, adv):
        return TokenRow(
            index=i,
            token_id=None,
            token=token,
            logprobs=None,
            ref_logprobs=None,
            kl=0.1,
            token_scores=0.0,
            token_rewards=-0.01 if mask else None,
            values=0.5,
            deltas=None,
            advantages=adv,
            returns=None,
            whitened_advantages=math.nan if mask else None,
            response_mask=mask,
            step_end=None,
        )

    tokens = (row(0, "</script><b>", True, 1.0), row(1, "<!--", False, None), row(2, "\u2028x", True, -1.0))
    resp = ResponseLedger(
        prompt="p</script>",
        response="r",
        score=1.0,
        group_id=0,
        length=3,
        finish_reason="stop",
        baseline_reward=None,
        tokens=tokens,
    )
    return Ledger(estimator="grpo", gamma=1.0, lam=None, beta=0.1, kl_kind=None, responses=(resp,))


def test_explain_html_escapes_and_keeps_every_value(tmp_path):
    from glassrl.report.html import write_explain_html

    ledger = _tricky_ledger()
    page = write_explain_html(ledger, tmp_path / "x" / "explain.html").read_text(encoding="utf-8")
    payload = embedded_payload(page)
    rows = token_dicts(payload["sources"][0]["ledgers"][0])[0]
    assert [r["token"] for r in rows] == ["</script><b>", "<!--", "\u2028x"]
    assert payload["sources"][0]["ledgers"][0]["responses"][0]["prompt"] == "p</script>"
    assert rows[0]["whitened_advantages"] == "nan" and rows[1]["whitened_advantages"] is None
    assert "plotly" not in page.lower()  # the explain page has no charts


def test_explain_html_of_the_reference_example(tmp_path):
    from glassrl.cli import build_parser
    from glassrl.commands import explain, explain_input
    from glassrl.report.html import write_explain_html

    args = build_parser(only="explain").parse_args(
        ["explain", "--input", str(EXAMPLES / "explain" / "observation_tokens.json")]
    )
    ledger = explain.build_ledger(explain_input.from_args(args))
    payload = embedded_payload(write_explain_html(ledger, tmp_path / "e.html").read_text(encoding="utf-8"))
    rows = token_dicts(payload["sources"][0]["ledgers"][0])[0]
    assert [r["response_mask"] for r in rows] == [True, True, True, False, False, False, True, True]
    assert rows[2]["deltas"] == pytest.approx(0.3980, abs=5e-5)  # docs/token-convention.md, δ_2
    assert [
        r == dict(zip(TOKEN_FIELDS, (getattr(t, f) for f in TOKEN_FIELDS)))
        for r, t in zip(rows, ledger.responses[0].tokens)
    ] == [True] * 8


# ---------------------------------------------------------------- the legend: Python's text, shown by the page


def test_token_legend_is_the_python_legend_in_the_chosen_language(runs, tmp_path, capsys):
    from glassrl.cli import main
    from glassrl.ledger.legend import baseline_legend, token_legend
    from glassrl.ledger.phrases import labels, phrase

    for lang in ("en", "zh"):
        out = tmp_path / f"report-{lang}.html"
        assert main(["report", str(runs["ppo"]), str(runs["grpo"]), "--lang", lang, "--out", str(out)]) == 0
        payload = embedded_payload(out.read_text(encoding="utf-8"))
        assert payload["legend"] == {
            "lang": lang,
            "labels": labels(lang),
            "baselines_heading": phrase("heading.baselines", lang),
        }
        for source, preset in zip(payload["sources"], ("ppo", "grpo")):
            for got, file in zip(source["ledgers"], sorted((runs[preset] / "ledgers").glob("step_*.jsonl"))):
                ledger = read_jsonl(file)
                assert got["baselines"] == baseline_legend(ledger, lang)
                assert bool(got["baselines"]) == (preset == "grpo")
                for b, resp in enumerate(ledger.responses):
                    assert got["responses"][b]["legend"] == [
                        [[line.key, line.text] for line in token_legend(ledger, b, i, lang)] for i in range(resp.length)
                    ]
    capsys.readouterr()
    zh = embedded_payload((tmp_path / "report-zh.html").read_text(encoding="utf-8"))
    first = zh["sources"][0]["ledgers"][0]["responses"][0]["legend"][0]
    assert [key for key, _ in first][:4] == ["token", "state", "action", "reward"] and "回答 0，token 0" in first[0][1]


def test_the_page_composes_no_legend_sentence():
    """The JavaScript copy of the legend is gone: no fixed piece of any phrase, in any language, is in the script."""
    from glassrl.ledger.phrases import PHRASES
    from glassrl.report.html import _template

    script = _template("token_view.js")
    for lang, table in PHRASES.items():
        for key, text in table.items():
            if key.startswith("label."):
                continue
            for piece in re.split(r"\{[a-z_A-Z]+\}", text):
                assert len(piece.strip()) < 12 or piece.strip() not in script, (lang, key, piece)
    assert "the critic's estimate" not in script and "γλ" not in script


def test_explain_html_legend_language(tmp_path):
    from glassrl.cli import main
    from glassrl.ledger.legend import token_legend

    out = tmp_path / "e.html"
    argv = ["explain", "--input", str(EXAMPLES / "explain" / "reference_dialogue_c.json"), "--format", "csv"]
    assert main([*argv, "--out", str(tmp_path / "l.csv"), "--html", str(out), "--lang", "zh"]) == 0
    payload = embedded_payload(out.read_text(encoding="utf-8"))
    ledger = ledger_of_reference()
    legend = payload["sources"][0]["ledgers"][0]["responses"][0]["legend"]
    assert legend[0] == [[line.key, line.text] for line in token_legend(ledger, 0, 0, "zh")]
    assert legend[0][4] == ["value", "V(s_0) = 0.2000：critic 对 r_0 + γ·r_1 + … 的估计，在 a_0 之前读出；它包含 r_0"]


def ledger_of_reference():
    from glassrl.cli import build_parser
    from glassrl.commands import explain, explain_input

    args = build_parser(only="explain").parse_args(
        ["explain", "--input", str(EXAMPLES / "explain" / "reference_dialogue_c.json")]
    )
    return explain.build_ledger(explain_input.from_args(args))
