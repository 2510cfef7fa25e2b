"""Overlaid runs in the report: each run one colour in every chart, no two runs alike."""

from __future__ import annotations

import json
from pathlib import Path

from glassrl.report.charts import RUN_COLOURS, build_charts, run_colour
from glassrl.report.run_dir import RunDir


def _run(i: int) -> RunDir:
    metrics = [{"step": s, "reward/mean": 0.1 * i + s, "kl/mean": 0.01 * s, "actor/grad_norm": 1.0} for s in (1, 2)]
    metrics[0]["critic/grad_norm"] = 2.0
    return RunDir(Path(f"run{i}"), f"run{i}", "", metrics, {}, {}, "test")


def _traces(html: str) -> list[dict]:
    """The traces of a chart div: the array Plotly.newPlot receives after the div id."""
    start = html.index("Plotly.newPlot(")
    rest = html[start:]
    data, _ = json.JSONDecoder().raw_decode(rest[rest.index("[") :])
    return data


def test_run_colours_are_distinct_however_many_runs():
    colours = [run_colour(i) for i in range(40)]
    assert colours[: len(RUN_COLOURS)] == list(RUN_COLOURS)
    assert len(set(colours)) == len(colours)


def test_every_trace_of_a_run_has_the_runs_colour():
    runs = [_run(i) for i in range(11)]  # more runs than the Okabe–Ito palette holds
    charts = build_charts(runs)
    assert {c.slug for c in charts} >= {"reward", "kl", "grad-norm"}
    for chart in charts:
        colours: dict[str, set[str]] = {}
        for trace in _traces(chart.html):
            colours.setdefault(trace["legendgroup"], set()).add(trace["line"]["color"])
        assert colours == {f"run{i}": {run_colour(i)} for i in range(11)}, chart.slug
