"""Learning curves of the report: one plotly chart per metric group, runs overlaid, x = step.

Each metric key of docs/metrics.md goes to the first group of :data:`GROUPS` whose
pattern matches it in full, so every logged key is drawn exactly once ("Other
metrics" takes what no named group does). A group no run has logged is left out.
Colour tells the runs apart (legend ``run · key``), dash and marker a group's keys; with
one run, colour tells the keys apart too, so no two series of a chart share one. A series
of fewer than :data:`FEW_POINTS` points (evaluations at the first and last step) is drawn
as points: a line between two evaluations is not a trend. A ``null`` in metrics.jsonl
(NaN: a statistic over no token) is a gap, never 0. The y axis shows four significant
digits at most, and a flat chart (a constant β, a learning rate) spans ±10 % of its
value (:func:`flat_range`), not plotly's −1…1 around it, where 0.001 reads as 0.

One group has another x axis: ``reward/gold`` and ``reward/proxy`` (a run with
``reward.gold``) are drawn against √KL, the square root of ``kl/sequence`` at the same
step, as Gao et al. 2022 ("Scaling Laws for Reward Model Overoptimization", Fig. 1) draw
gold and proxy reward-model scores against d = √KL(π ‖ π_init): the proxy keeps rising
with d while the gold peaks and falls once the policy exploits the reward model. Gold
(left axis) and proxy (right axis) have their own scales.

A run's reward-watch alerts (``watch.jsonl``, glassrl.diagnose.training_watch) are dotted vertical lines in its
colour at their steps on every chart against the step.

The charts carry no plotly.js: the page inlines it once (glassrl.report.html).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import plotly.graph_objects as go

from glassrl.report.run_dir import RunDir

# (id, title, y-axis title, pattern) in page order; a key goes to the first full match.
GROUPS: tuple[tuple[str, str, str, str], ...] = (
    (
        "reward",
        "Reward per source",
        "score",
        r"reward/mean|reward/(?!failures/)[^/]+/mean|reward/env/[^/]+/mean|reward/control/real_mean",
    ),
    ("eval-reward", "Held-out reward", "score / fraction", r"eval/reward/.+"),
    ("gold-proxy", "Gold and proxy reward against √KL (Gao et al. 2022)", "gold score", r"reward/(?:gold|proxy)"),
    ("accuracy", "Accuracy", "fraction", r"task/accuracy|eval/accuracy(?:/[^/]+)?|eval/pass_at_\w+"),
    ("kl", "KL", "nats per token", r"kl/mean|actor/approx_kl|actor/kl_loss"),
    ("kl-beta", "KL coefficient β", "β", r"kl/beta"),
    ("kl-sequence", "KL per response", "nats per response", r"kl/sequence"),
    ("entropy", "Entropy", "nats per token", r"actor/entropy|actor/entropy_loss"),
    ("length", "Response length", "tokens", r"response/length/.+"),
    (
        "clip",
        "Clip fractions",
        "fraction of valid tokens",
        r"actor/(?:clip_frac_low|clip_frac_high|dual_clip_frac|cov_clip_frac)|critic/vf_clip_frac",
    ),
    ("losses", "Losses", "loss", r"actor/(?:policy|positive_nll|ptx)_loss|critic/value_loss"),
    ("explained-variance", "Explained variance", "1 − Var[R − V]/Var[R]", r"critic/explained_variance"),
    ("advantages", "Advantages, returns and values", "return units", r"advantage/.+|returns/.+|critic/values/.+"),
    ("grad-norm", "Gradient norms (before clipping)", "L2 norm", r"(?:actor|critic|train)/grad_norm"),
    ("skipped", "Skipped optimiser steps (non-finite)", "steps", r"(?:actor|critic|train)/skipped_steps"),
    ("lr", "Learning rates", "learning rate", r"(?:actor|critic|train)/lr"),
    ("padding", "Padding share of the update's forward passes", "fraction", r"(?:actor|critic)/padding_share"),
    ("teacher", "Teacher: reverse KL and log-probs (on-policy distillation)", "nats", r"teacher/.+"),
    (
        "implicit-rewards",
        "Implicit rewards β·log π/π_ref",
        "nats × β",
        r"(?:train|eval)/rewards/(?:chosen|rejected|margins)",
    ),
    ("preference-accuracy", "Preference accuracy", "fraction", r"(?:train|eval)/rewards/accuracies|train/accuracy"),
    ("logps", "Log-probs of the chosen and rejected responses", "nats per response", r"(?:train|eval)/logps/.+"),
    ("supervised-loss", "Supervised losses", "loss / nats", r"(?:train|eval)/(?:loss|kl)|train/reward_gap"),
    ("tokens-per-s", "Tokens/s per phase", "tokens per second", r"perf/[^/]+_tokens_per_s"),
    ("seconds", "Seconds per phase", "seconds", r"perf/[^/]+_s"),
    (
        "rollout-mismatch",
        "Train/rollout log-prob mismatch |Δ| per step: mean, p99, max (glassrl explain --mismatch: its causes)",
        "|log π_train − log π_rollout|",
        r"rollout/(?:logprob_diff_mean|logprob_diff_p99|logprob_diff_max)|actor/rollout_is_clip_frac",
    ),
    (
        "off-policy",
        "Staleness and off-policy corrections",
        "actor updates / fraction / weight",
        r"rollout/(?:staleness|staleness_max|staleness_share/[^/]+|masked_share|is_weight_mean|is_weight_max)",
    ),
    ("tools", "Tool calls and environment failures", "fraction / calls per response", r"(?:eval/)?tool/.+|agent/.+"),
    ("turns", "Turns and observations", "turns / tokens", r"response/(?:turns|observation_tokens)/mean"),
    ("diversity", "Diversity and truncation", "fraction", r"response/(?:distinct_\d|truncation_rate)"),
    ("data", "Prompts dropped or truncated", "prompts", r"data/prompts_(?:dropped|truncated)"),
    ("watch", "Reward watch: proxy − gold divergence and alerts", "spreads / alerts", r"watch/.+"),
    ("sync", "Sync truth check: checks, tensors, breaches, probe gap", "count / nats", r"sync/.+"),
    ("sampling", "Dynamic sampling", "rounds / groups", r"sampling/.+"),
    ("failures", "Reward spread and failures", "score / count", r"reward/.+"),
    ("other", "Other metrics", "value", r".+"),
)
_COMPILED = tuple((slug, re.compile(pattern)) for slug, _, _, pattern in GROUPS)
# Colours of the runs (Okabe & Ito 2008, distinguishable with colour-blindness); run_colour goes on.
RUN_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "cross")


FEW_POINTS = 3  # a series with fewer points is drawn as markers only


def flat_range(values: list[float | None]) -> list[float] | None:
    """The y range of a chart whose finite values are all one number v: v ± 10 % of |v| (±1 at 0);
    None when they differ (plotly's own range) or there are none."""
    finite = {v for v in values if v is not None and math.isfinite(v)}
    if len(finite) != 1:
        return None
    (v,) = finite
    pad = abs(v) * 0.1 or 1.0
    return [v - pad, v + pad]


def run_colour(index: int) -> str:
    """The colour of the run at ``index``: Okabe–Ito's eight, then hues a golden angle (137.5°)
    apart, so that however many runs are overlaid no two share a colour."""
    if index < len(RUN_COLOURS):
        return RUN_COLOURS[index]
    return f"hsl({(index - len(RUN_COLOURS)) * 137.508 % 360:.1f}, 70%, 40%)"


@dataclass(frozen=True)
class Chart:
    """One rendered chart: its group id (the div is ``chart-<slug>``), title, keys and HTML."""

    slug: str
    title: str
    keys: tuple[str, ...]
    html: str


def group_of(key: str) -> str:
    """The id of the group that draws ``key``."""
    return next(slug for slug, pattern in _COMPILED if pattern.fullmatch(key))


def grouped_keys(runs: list[RunDir]) -> dict[str, list[str]]:
    """{group id: its keys in first-logged order} for the groups some run has logged."""
    keys: dict[str, list[str]] = {slug: [] for slug, *_ in GROUPS}
    for run in runs:
        for row in run.metrics:
            for key in row:
                if key != "step" and key not in keys[group_of(key)]:
                    keys[group_of(key)].append(key)
    return {slug: found for slug, found in keys.items() if found}


def series(run: RunDir, key: str) -> tuple[list[int], list[float | None]]:
    """(steps, values) of ``key`` over the rows of ``run`` that log it; None (NaN) stays None."""
    steps, values = [], []
    for row in run.metrics:
        if key in row:
            steps.append(row["step"])
            values.append(row[key])
    return steps, values


def sqrt_kl_series(run: RunDir, key: str) -> tuple[list[float], list[float | None], list[int]]:
    """(√KL, values, steps) of ``key`` over the rows of ``run`` that log it and ``kl/sequence``;
    √KL = √max(kl/sequence, 0): a sampled KL estimate can dip below 0 by noise."""
    xs, values, steps = [], [], []
    for row in run.metrics:
        kl = row.get("kl/sequence")
        if key in row and kl is not None:
            xs.append(math.sqrt(max(kl, 0.0)))
            values.append(row[key])
            steps.append(row["step"])
    return xs, values, steps


def build_charts(runs: list[RunDir]) -> list[Chart]:
    """One chart per logged group, each run a colour; HTML divs without plotly.js."""
    titles = {slug: (title, axis) for slug, title, axis, _ in GROUPS}
    last = max((row["step"] for run in runs for row in run.metrics), default=0)
    dtick = 1 if last < 10 else None  # a short run: one tick per step, none at 0.5
    charts = []
    for slug, keys in grouped_keys(runs).items():
        title, axis = titles[slug]
        fig = go.Figure()
        against_kl = slug == "gold-proxy"
        drawn: list[float | None] = []
        for r, run in enumerate(runs):
            for k, key in enumerate(keys):
                if against_kl:
                    x, values, steps = sqrt_kl_series(run, key)
                    hover = f"{key}<br>√KL %{{x:.4g}} (step %{{customdata}})<br>%{{y:.6g}}<extra>{run.name}</extra>"
                else:
                    steps, values = series(run, key)
                    x, hover = steps, f"{key}<br>step %{{x}}<br>%{{y:.6g}}<extra>{run.name}</extra>"
                if not steps:
                    continue
                name = run.name if len(keys) == 1 else f"{run.name} · {key}"
                drawn += values if key != "reward/proxy" else []
                colour = run_colour(r if len(runs) > 1 else k)  # one run: a colour per key
                fig.add_trace(
                    go.Scatter(
                        x=x,
                        y=values,
                        customdata=steps,
                        name=name,
                        legendgroup=run.name,
                        mode="lines+markers" if len(steps) >= FEW_POINTS else "markers",
                        connectgaps=False,
                        line={"color": colour, "dash": DASHES[k % len(DASHES)], "width": 2},
                        marker={"color": colour, "symbol": SYMBOLS[k % len(SYMBOLS)], "size": 6},
                        hovertemplate=hover,
                        yaxis="y2" if key == "reward/proxy" else "y",
                    )
                )
        if (
            not against_kl
        ):  # the reward watch's alerts (glassrl.diagnose.training_watch): a dotted line at each one's step
            for r, run in enumerate(runs):
                for alert in run.alerts:
                    fig.add_vline(
                        x=alert["step"], line={"color": run_colour(r), "dash": "dot", "width": 1}, opacity=0.8
                    )
        xaxis = {"title": {"text": "step"}, "rangemode": "tozero", "dtick": dtick}
        extra = {}
        if against_kl:
            xaxis = {"title": {"text": "√KL(π ‖ π_ref), nats^½ per response"}, "rangemode": "tozero"}
            extra = {"yaxis2": {"title": {"text": "proxy score (reward model)"}, "overlaying": "y", "side": "right"}}
        fig.update_layout(
            title={"text": title, "x": 0.01},
            template="plotly_white",
            height=330,
            margin={"l": 60, "r": 60 if against_kl else 10, "t": 40, "b": 40},
            showlegend=True,
            legend={"orientation": "h", "y": -0.22, "font": {"size": 10}},
            xaxis=xaxis,
            yaxis={"title": {"text": axis}, "tickformat": ".4~g", "range": flat_range(drawn)},
            **extra,
        )
        html = fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            div_id=f"chart-{slug}",
            config={"displaylogo": False, "responsive": True},
        )
        charts.append(Chart(slug=slug, title=title, keys=tuple(keys), html=html))
    return charts
