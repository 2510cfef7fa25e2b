"""What a new user reads in the report and the docs (issue 31, item 16): a colour per series,
evaluations at few steps as points, a flat axis around its value, the token view opening on a
step whose advantages differ, a note where CJK tokens need a font, docs that cite files the
repository has and the README's demo figures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from glassrl import presets
from glassrl.report.charts import build_charts, flat_range
from glassrl.report.html import CJK_NOTE, _initial, write_run_report
from glassrl.report.run_dir import RunDir

ROOT = Path(__file__).resolve().parents[2]


def _traces(html: str) -> list[dict]:
    rest = html[html.index("Plotly.newPlot(") :]
    data, _ = json.JSONDecoder().raw_decode(rest[rest.index("[") :])
    return data


def _layout(html: str) -> dict:
    rest = html[html.index("Plotly.newPlot(") :]
    decoder = json.JSONDecoder()
    _, end = decoder.raw_decode(rest[rest.index("[") :])
    rest = rest[rest.index("[") + end :]
    layout, _ = decoder.raw_decode(rest[rest.index("{") :])
    return layout


def _run(metrics: list[dict]) -> RunDir:
    return RunDir(Path("run"), "run", "", metrics, {}, {}, "test")


def _chart(run: RunDir, slug: str):
    return next(c for c in build_charts([run]) if c.slug == slug)


METRICS = [
    {"step": s, "perf/rollout_s": 1.0 + s, "perf/reward_s": 0.5, "perf/update_s": 2.0 * s, "kl/beta": 0.001}
    | ({"eval/accuracy": 0.3 + 0.1 * s, "eval/accuracy/en": 0.2 * s} if s in (0, 5) else {})
    for s in range(6)
]


def test_one_run_gives_each_series_its_own_colour():
    traces = _traces(_chart(_run(METRICS), "seconds").html)
    colours = [t["line"]["color"] for t in traces]
    assert len(traces) == 3 and len(set(colours)) == 3
    assert [t["marker"]["color"] for t in traces] == colours


def test_evaluations_at_two_steps_are_points_not_a_trend():
    accuracy = _traces(_chart(_run(METRICS), "accuracy").html)
    assert {t["mode"] for t in accuracy} == {"markers"}
    assert {t["mode"] for t in _traces(_chart(_run(METRICS), "seconds").html)} == {"lines+markers"}


def test_a_flat_beta_axis_spans_its_value_with_few_digits():
    layout = _layout(_chart(_run(METRICS), "kl-beta").html)
    low, high = layout["yaxis"]["range"]
    assert low == pytest.approx(0.0009) and high == pytest.approx(0.0011)
    assert layout["yaxis"]["tickformat"] == ".4~g"
    assert flat_range([0.0, None, 0.0]) == [-1.0, 1.0]
    assert flat_range([1.0, 2.0]) is None and flat_range([None]) is None


def _set_advantages(ledger: Path, value) -> None:
    """Each token's advantage (and return: no values under GRPO) ``value(response_index)``, in place."""
    rows = [json.loads(line) for line in ledger.read_text(encoding="utf-8").splitlines()]
    for row in rows:
        if row["kind"] == "token" and row["advantages"] is not None:
            row["advantages"] = row["returns"] = value(row["response_index"])
    ledger.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def test_the_token_view_opens_on_the_last_step_with_advantage_spread(runs, tmp_path):
    import shutil

    from glassrl.report.run_dir import read_run

    run = tmp_path / "grpo"
    shutil.copytree(runs["grpo"], run)
    first, last = sorted((run / "ledgers").glob("step_*.jsonl"))
    _set_advantages(first, lambda b: 0.5 if b % 2 else -0.5)
    _set_advantages(last, lambda b: 0.0)  # a group that scored alike: nothing to colour
    assert _initial([read_run(run)], None) == (0, 0)  # step 1, the last with spread
    assert _initial([read_run(run)], 2) == (0, 1)  # asked for: shown
    _set_advantages(last, lambda b: float(b))
    assert _initial([read_run(run)], None) == (0, 1)  # both have spread: the last


def test_a_report_with_chinese_tokens_says_they_need_a_font(runs, tmp_path):
    page = write_run_report([runs["grpo"]], tmp_path / "r.html").read_text(encoding="utf-8")
    has_cjk = re.search("[\u4e00-\u9fff]", page.split('id="token-data"')[1]) is not None
    assert (CJK_NOTE in page) == has_cjk
    assert "Noto Sans CJK SC" in page  # the font stacks name CJK fonts


def test_the_docs_cite_files_the_repository_has():
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "src/glassrl/report/templates").iterdir()]
    citing = [p.relative_to(ROOT) for p in pages if "DESIGN §" in p.read_text(encoding="utf-8")]
    assert not citing, f"cite docs/token-convention.md, not DESIGN (not in the repository): {citing}"
    assert (ROOT / "docs/token-convention.md").is_file()


def test_agentic_docs_do_not_call_a_shipped_demo_open():
    text = (ROOT / "docs/agentic.md").read_text(encoding="utf-8")
    for task in presets.TASKS:
        assert not re.search(rf"(?i)still open[^.]*--task {task}", text), task
        assert f"--task {task}" in text


def test_grpo_page_quotes_the_readme_demo_figures():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")  # make demo's printed table
    before, after = re.search(r"│ all +│ +([\d.]+)% │ +([\d.]+)% │", readme).groups()
    assert f"**{before} % → {after} %**" in (ROOT / "docs/algorithms/grpo.md").read_text(encoding="utf-8")
