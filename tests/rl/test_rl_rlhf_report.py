"""The report's gold-and-proxy chart: reward/gold and reward/proxy against √KL (Gao et al. 2022)."""

from __future__ import annotations

import json
import math

import pytest

from glassrl.report.charts import build_charts, group_of, sqrt_kl_series
from glassrl.report.run_dir import RunDir


def _run(rows: list[dict]) -> RunDir:
    return RunDir(
        path=None, name="rlhf", config_text="", metrics=rows, ledger_paths={}, environment={}, environment_source="test"
    )


ROWS = [
    {"step": 0, "eval/accuracy": 0.4},  # no kl/sequence: not a point of the chart
    {"step": 1, "reward/gold": 0.5, "reward/proxy": 1.0, "kl/sequence": -0.01},  # noise below 0 → √0
    {"step": 2, "reward/gold": 0.6, "reward/proxy": 2.0, "kl/sequence": 0.25},
    {"step": 3, "reward/gold": 0.4, "reward/proxy": 3.0, "kl/sequence": 4.0},
]


def test_gold_and_proxy_are_drawn_against_the_square_root_of_the_sequence_kl():
    assert group_of("reward/gold") == group_of("reward/proxy") == "gold-proxy"
    assert group_of("kl/sequence") == "kl-sequence"
    x, gold, steps = sqrt_kl_series(_run(ROWS), "reward/gold")
    assert x == [0.0, 0.5, 2.0] and gold == [0.5, 0.6, 0.4] and steps == [1, 2, 3]


def test_the_chart_has_gold_on_the_left_axis_and_proxy_on_the_right():
    charts = {c.slug: c for c in build_charts([_run(ROWS)])}
    chart = charts["gold-proxy"]
    assert set(chart.keys) == {"reward/gold", "reward/proxy"}
    figure = json.loads(chart.html[chart.html.index("[{") : chart.html.index("}],") + 2])  # the traces
    by_name = {trace["name"].split(" · ")[-1]: trace for trace in figure}
    assert by_name["reward/proxy"]["yaxis"] == "y2" and by_name["reward/gold"]["yaxis"] == "y"
    assert by_name["reward/proxy"]["x"] == pytest.approx([0.0, 0.5, 2.0])
    assert '"overlaying":"y"' in chart.html
    assert "√KL(" in chart.html or "\\u221aKL(" in chart.html  # plotly 7 writes √ as is, plotly 6 as \\u221a
    assert not math.isnan(by_name["reward/gold"]["y"][0])
