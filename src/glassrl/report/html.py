"""The run report and the explain page: one self-contained HTML file each (works offline).

    write_run_report(["runs/ppo", "runs/grpo"], "report.html")   # curves, token view, config
    write_explain_html(ledger, "explain.html")                   # the token view of one ledger

The run report has three sections: learning curves (glassrl.report.charts, plotly,
its plotly.js inlined once: no CDN, no request leaves the file), the token view of
the ledger samples, and each run's resolved config and environment. The token
view (templates/token_view.js, plain JS) draws each response as its tokens,
coloured by a chosen quantity on a diverging scale centred at 0; clicking a token
fills a panel with every ledger field and the legend (docs/token-convention.md) with its numbers.
The legend is glassrl.ledger.legend's, written here in Python (``lang``: en or zh)
and embedded as text, one list of lines per token; the page only shows it.

The ledgers travel as JSON in ``<script type="application/json" id="token-data">``
(:func:`token_payload`); a non-finite number travels as the string "nan", "inf" or
"-inf" (JSON has none) and "<" as ``\\u003c`` so that no "</script>" can end the tag.
Element ids and data attributes are fixed (``tok-B-I`` with ``data-b``/``data-i``
per token, ``field-NAME`` per panel field) for tests and for readers' scripts.

A multi-turn response (its ``turns``) is drawn turn by turn: a ``turn K`` tag (``turn-B-K``,
with the turn's finish reason and tool calls) before each turn's generated tokens, its
observation tokens hatched (class ``obs``), and under the tokens the per-turn credit lines of
glassrl.ledger.legend.turn_legend (``turns-B``).

A Ray run's report adds its nodes (glassrl.report.nodes): which node ran which rank, and its calls.
"""

from __future__ import annotations

import html
import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

from glassrl.errors import GlassrlError
from glassrl.files import disk_errors, replaced
from glassrl.ledger import OFF_POLICY_FIELDS, RESPONSE_FIELDS, RUN_FIELDS, SYMBOLS, TOKEN_FIELDS, Ledger, TokenRow
from glassrl.ledger.legend import baseline_legend, token_legend, turn_legend
from glassrl.ledger.phrases import labels, phrase
from glassrl.report.nodes import nodes_section
from glassrl.report.run_dir import RunDir, read_runs

# The quantities a token can be coloured by, in menu order: (ledger field, label).
QUANTITIES = (
    ("advantages", "advantage A_i"),
    ("whitened_advantages", "whitened advantage Â_i"),
    ("kl", "KL kl_i"),
    ("values", "value V(s_i)"),
    ("returns", "return R_i"),
    ("token_rewards", "reward r_i"),
    ("deltas", "TD error δ_i"),
    ("token_scores", "score score_i"),
    ("logprobs", "log-prob log π(a_i|s_i)"),
    ("entropy", "entropy H(π(·|s_i))"),
    ("staleness", "staleness (actor updates behind)"),
    ("logprob_gap", "mismatch |log π_old − log μ|"),
    ("is_weights", "off-policy weight w_i"),
)
# The token view's fields: the ledger's, its off-policy ones, and |Δ log π| derived from them.
VIEW_FIELDS = (*TOKEN_FIELDS, *OFF_POLICY_FIELDS, "logprob_gap")
_PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")


def write_run_report(
    run_dirs: list[str | Path],
    out: str | Path,
    step: int | None = None,
    lang: str = "en",
    name: str | None = None,
    divergence: list[str] | None = None,
) -> Path:
    """Write the report of ``run_dirs`` (overlaid; the first run's ledgers shown first) to ``out``.

    ``step``: the ledger step shown when the page opens (default: the first run's last
    ledger step); GlassrlError when no run has a ledger for it. ``lang``: the language
    of the token legend (glassrl.ledger.phrases.LANGUAGES). ``name``: the one run's name, where its
    directory's is not (a trainer writing the report into its staged outputs). ``divergence``: the lines
    of ``glassrl diff`` for two runs (glassrl.diagnose.diff, computed by the caller: the report only
    renders), shown as their first divergence. Returns ``out``.
    """
    from plotly.offline import get_plotlyjs

    from glassrl.report.charts import build_charts

    runs = read_runs(list(run_dirs))
    if name is not None and len(runs) == 1:
        runs[0].name = name
    initial = _initial(runs, step)
    charts = build_charts(runs)
    names = ", ".join(run.name for run in runs)
    preference = [run for run in runs if run.preference_ledgers]
    watched = [run for run in runs if run.alerts]
    compared = _divergence(divergence) if divergence is not None else ""
    gaps = _mismatch(runs)
    nodes = nodes_section([(run.name, run.path) for run in runs])  # the Ray backend's ranks, node by node
    body = "\n".join(
        [
            '<nav><a href="#curves">learning curves</a> · '
            + ('<a href="#watch">reward watch</a> · ' if watched else "")
            + ('<a href="#divergence">first divergence</a> · ' if compared else "")
            + ('<a href="#mismatch">sampler/trainer gap</a> · ' if gaps else "")
            + '<a href="#tokens">token view</a> · '
            + ('<a href="#preference">preference ledger</a> · ' if preference else "")
            + ('<a href="#nodes">nodes</a> · ' if nodes else "")
            + '<a href="#config">config and environment</a></nav>',
            '<section id="curves"><h2>Learning curves</h2>',
            _curves(charts),
            "</section>",
            *([_watch(watched)] if watched else []),
            compared,
            gaps,
            '<section id="tokens"><h2>Token view</h2>',
            _template("token_view.html"),
            "</section>",
            *([_preference(preference, lang)] if preference else []),
            nodes,
            '<section id="config"><h2>Config and environment</h2>',
            *(_config(run) for run in runs),
            "</section>",
        ]
    )
    payload = token_payload([(run.name, [run.ledger(s) for s in run.ledger_paths]) for run in runs], initial, lang)
    for source, run in zip(payload["sources"], runs):  # the rows each alert points at, highlighted
        flagged = {(step, b): alert["kind"] for alert in run.alerts for step, b in alert["rows"]}
        for lg in source["ledgers"]:
            lg["flagged"] = {str(b): kind for (step, b), kind in flagged.items() if step == lg["step"]}
    head = f'<script type="text/javascript">{get_plotlyjs()}</script>'
    return _write(out, f"glassrl report: {names}", body, payload, head)


def write_audit_html(title: str, checks: list[tuple[str, int, int, str]], failures: list[str], out: str | Path) -> Path:
    """The audit table of ``glassrl audit --html`` (glassrl.diagnose.episode_audit.summary): per check the
    episodes that passed, then each failure with its first offending token in context."""
    rows = "".join(
        f'<tr class="{"ok" if passed == total else "fail"}"><td>{html.escape(name)}</td><td>{passed}/{total}</td>'
        f"<td>{'ok' if passed == total else 'FAIL'}</td><td>{html.escape(what)}</td></tr>"
        for name, passed, total, what in checks
    )
    listed = "".join(f"<li><code>{html.escape(line)}</code></li>" for line in failures)
    body = (
        '<section id="audit"><h2>Audit</h2><table><tr><th>check</th><th>passed</th><th></th><th>what</th></tr>'
        + rows
        + "</table>"
        + (f"<h3>Failures</h3><ul>{listed}</ul>" if failures else "<p>Every check passed.</p>")
        + "</section>"
    )
    return _write(out, title, body, {}, "")


def write_explain_html(ledger: Ledger, out: str | Path, lang: str = "en") -> Path:
    """Write the token view of one explained ledger (``glassrl explain --html FILE``); returns ``out``."""
    body = '<section id="tokens">' + _template("token_view.html") + "</section>"
    return _write(out, "glassrl explain", body, token_payload([("explain", [ledger])], (0, 0), lang), "")


def token_payload(
    sources: list[tuple[str, list[Ledger]]], initial: tuple[int, int], lang: str = "en"
) -> dict[str, Any]:
    """The token view's data: per source (a run) its ledgers; ``initial`` = (source, ledger) shown first.

    Tokens are rows of values in the order of ``token_fields`` (compact: one list per token).
    Each response carries its tokens' legends in ``lang`` (``legend``: per token, [key, text]
    per line; the labels of the keys once, in ``phrases.labels``), each ledger the lines of its
    group baselines (``baselines``, empty for GAE).
    """
    present = [(name, label) for name, label in QUANTITIES if name in VIEW_FIELDS]
    return {
        "token_fields": list(VIEW_FIELDS),
        "run_fields": list(RUN_FIELDS),
        "response_fields": list(RESPONSE_FIELDS),
        "symbols": {**SYMBOLS, "logprob_gap": "|Δ log π|"},
        "quantities": [{"field": n, "label": label} for n, label in present],
        "legend": {"lang": lang, "labels": labels(lang), "baselines_heading": phrase("heading.baselines", lang)},
        "initial": {"source": initial[0], "ledger": initial[1]},
        "sources": [{"name": name, "ledgers": [_ledger_json(lg, lang) for lg in ledgers]} for name, ledgers in sources],
    }


def _ledger_json(ledger: Ledger, lang: str) -> dict[str, Any]:
    return {
        **{name: _finite(getattr(ledger, name)) for name in RUN_FIELDS},
        "baselines": baseline_legend(ledger, lang),
        "responses": [_response_json(ledger, b, lang) for b in range(len(ledger.responses))],
    }


def _response_json(ledger: Ledger, b: int, lang: str) -> dict[str, Any]:
    resp = ledger.responses[b]
    head = {name: _finite(getattr(resp, name)) for name in RESPONSE_FIELDS[1:] if name != "turns"}
    return {
        "response_index": b,
        **head,
        "turns": None if resp.turns is None else [_turn_json(turn) for turn in resp.turns],
        "turn_legend": turn_legend(ledger, b, lang),
        "tokens": [
            [*(_finite(getattr(row, name)) for name in VIEW_FIELDS[:-1]), _finite(_gap(row))] for row in resp.tokens
        ],
        "legend": [[[line.key, line.text] for line in token_legend(ledger, b, i, lang)] for i in range(resp.length)],
    }


def _gap(row: TokenRow) -> float | None:
    """|log π_old(a_i|s_i) − log μ(a_i|s_i)| of a generated token whose rollout log-prob was kept."""
    if not row.response_mask or row.logprobs is None or row.rollout_logprobs is None:
        return None
    return abs(row.logprobs - row.rollout_logprobs)


def _turn_json(turn) -> dict[str, Any]:
    return {
        "start": turn.start,
        "end": turn.end,
        "observation_end": turn.observation_end,
        "finish_reason": turn.finish_reason,
        "tool_calls": [_finite_deep(call) for call in turn.tool_calls],
        "reward_parts": _finite_deep(turn.reward_parts),
    }


def _finite_deep(x: Any) -> Any:
    """:func:`_finite` through dicts and lists (a tool call's arguments are any JSON)."""
    if isinstance(x, dict):
        return {str(k): _finite_deep(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_deep(v) for v in x]
    return _finite(x)


def _finite(x: Any) -> Any:
    """JSON has no NaN/inf: they travel as strings that the page shows as such."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else "inf" if x > 0 else "-inf"
    return x


def _initial(runs: list[RunDir], step: int | None) -> tuple[int, int]:
    """(run index, ledger index) shown first: ``step`` in the first run that has it, else the first
    run's last ledger whose advantages differ between tokens (all 0 — a group that scored alike —
    colours nothing), else its last."""
    if step is None:
        steps = list(runs[0].ledger_paths)
        spread = [k for k, s in enumerate(steps) if _advantage_spread(runs[0].ledger(s))]
        return 0, spread[-1] if spread else max(len(steps) - 1, 0)
    for r, run in enumerate(runs):
        if step in run.ledger_paths:
            return r, list(run.ledger_paths).index(step)
    have = "; ".join(f"{run.name}: {', '.join(map(str, run.ledger_paths)) or 'none'}" for run in runs)
    raise GlassrlError(f"--step {step}: no run has a ledger for that step (steps with a ledger: {have})")


def _advantage_spread(ledger: Ledger) -> bool:
    """Whether the ledger's token advantages A_i (finite ones) are not all one number."""
    values = {
        t.advantages
        for r in ledger.responses
        for t in r.tokens
        if t.advantages is not None and math.isfinite(t.advantages)
    }
    return len(values) > 1


def _curves(charts: list) -> str:
    if not charts:
        return '<p class="empty">No metrics logged yet (metrics.jsonl is empty).</p>'
    figures = [
        f'<figure class="chart" data-chart="{c.slug}" data-keys="{html.escape(" ".join(c.keys))}">{c.html}</figure>'
        for c in charts
    ]
    return '<div class="charts">' + "\n".join(figures) + "</div>"


def _watch(runs: list[RunDir]) -> str:
    """The reward watch's alerts (glassrl.diagnose.training_watch): a row each, its ledger rows linked into
    the token view."""
    rows = []
    for source, run in enumerate(runs):
        for alert in run.alerts:
            links = " ".join(
                f'<a href="#tokens" class="alert-row" data-source="{source}" data-step="{step}" data-b="{b}">'
                f"step {step} response {b}</a>"
                for step, b in alert["rows"]
            )
            rows.append(
                f'<tr class="{html.escape(alert["level"])}"><td>{html.escape(run.name)}</td><td>{alert["step"]}</td>'
                f"<td>{html.escape(alert['level'])}</td><td>{html.escape(alert['kind'])}</td>"
                f"<td>{html.escape(alert['message'])}</td><td>{links or '—'}</td></tr>"
            )
    return (
        '<section id="watch"><h2>Reward watch</h2><p>Alerts of the reward-hacking watch (docs/debugging.md), '
        "dotted lines on the curves; the responses each one points at earned proxy reward the gold did not "
        "give (highlighted in the token view). Rows of rule <em>sync truth</em> are weight syncs the sync truth "
        "check could not prove: the receiver, the version, the tensor and its layer, or the first probe token "
        "whose log-prob moved.</p><table><tr><th>run</th><th>step</th><th>level</th><th>rule</th>"
        "<th>what</th><th>ledger rows</th></tr>" + "".join(rows) + "</table></section>"
    )


def _mismatch(runs: list[RunDir]) -> str:
    """Per ledger step with log μ kept, the distribution of Δ_i = log μ − log π_old over its generated
    tokens (the ledger sample's; the metrics' rollout/logprob_diff_* are over the whole step): count,
    mean Δ, and of |Δ| the mean, median, p99 (nearest rank) and max; "" when no ledger kept log μ."""
    rows = []
    for run in runs:
        for step in run.ledger_paths:
            deltas = [
                t.rollout_logprobs - t.logprobs
                for r in run.ledger(step).responses
                for t in r.tokens
                if t.response_mask and t.rollout_logprobs is not None and t.logprobs is not None
            ]
            if not deltas:
                continue
            size = sorted(abs(d) for d in deltas)
            median, p99 = (size[min(len(size) - 1, math.ceil(q * len(size)) - 1)] for q in (0.5, 0.99))
            cells = (len(deltas), sum(deltas) / len(deltas), sum(size) / len(size), median, p99, size[-1])
            rows.append(
                f"<tr><td>{html.escape(run.name)}</td><td>{step}</td><td>{cells[0]}</td>"
                + "".join(f"<td>{x:.3g}</td>" for x in cells[1:])
                + "</tr>"
            )
    if not rows:
        return ""
    return (
        '<section id="mismatch"><h2>Sampler/trainer gap</h2><p>Δ = log μ − log π_old on the generated tokens '
        "of each ledger sample: what the sampler computed while it sampled against what the trainer "
        "computed again (docs/debugging.md). <code>glassrl explain --mismatch RUN --step N</code> splits a "
        "step's gap among its causes.</p><table><tr><th>run</th><th>step</th><th>tokens</th><th>mean Δ</th>"
        "<th>mean |Δ|</th><th>median |Δ|</th><th>p99 |Δ|</th><th>max |Δ|</th></tr>"
        + "".join(rows)
        + "</table></section>"
    )


def _divergence(lines: list[str]) -> str:
    """Where two runs part (glassrl.diagnose.diff), as ``glassrl diff`` prints it, checkpoints aside."""
    return (
        '<section id="divergence"><h2>First divergence</h2><p>Configs, ledgers and metrics compared '
        "as <code>glassrl diff</code> does; the checkpoints are not read here (<code>glassrl diff</code> "
        'compares them tensor by tensor).</p><pre class="diff">' + html.escape("\n".join(lines)) + "</pre></section>"
    )


def _preference(runs: list[RunDir], lang: str) -> str:
    """The preference ledgers of ``glassrl dpo`` runs: each held-out pair's tokens coloured by their
    implicit reward ρ_i (green above 0, red below), then the ledger's table and legend as text."""
    blocks = ['<section id="preference"><h2>Preference ledger</h2>']
    for r, run in enumerate(runs):
        for k, ledger in enumerate(run.preference_ledgers):
            scale = max((abs(t.reward) for side in (ledger.chosen, ledger.rejected) for t in side.tokens), default=0.0)
            rows = "".join(_preference_tokens(side, scale) for side in (ledger.chosen, ledger.rejected))
            text = html.escape("\n".join(ledger.lines(lang)))
            blocks.append(
                f'<div class="response" id="pair-{r}-{k}"><div class="response-head">'
                f"<b>{html.escape(run.name)}</b> · pair {k} · {html.escape(ledger.source)}</div>"
                f'<div class="prompt">{html.escape(ledger.prompt)}</div>{rows}'
                f'<details><summary>ledger</summary><pre class="ledger">{text}</pre></details></div>'
            )
    return "\n".join([*blocks, "</section>"])


def _preference_tokens(side, scale: float) -> str:
    spans = []
    for t in side.tokens:
        alpha = abs(t.reward) / scale if scale > 0 else 0.0
        colour = f"rgba(26,127,55,{alpha:.3f})" if t.reward > 0 else f"rgba(207,34,46,{alpha:.3f})"
        title = f"ρ_{t.i} = {t.reward:.4f}, log π_θ = {t.logprob:.4f}" + (
            f", log π_ref = {t.ref_logprob:.4f}" if t.ref_logprob is not None else ""
        )
        spans.append(
            f'<span class="tok sample" style="background:{colour}" title="{html.escape(title)}">'
            f"{html.escape(t.token)}</span>"
        )
    head = f"{html.escape(side.name)} · r = {side.reward:.4f}"
    return f'<div class="tokens"><span class="key">{head}</span> {"".join(spans)}</div>'


def _config(run: RunDir) -> str:
    env = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in run.environment.items()
    )
    return (
        f'<details class="run-config" open><summary>{html.escape(run.name)} '
        f'<span class="path">{html.escape(str(run.path))}</span></summary>'
        f'<div class="config-grid"><div><h3>Resolved config</h3><pre class="yaml">{html.escape(run.config_text)}'
        f"</pre></div><div><h3>Environment</h3><table class=\"env\">{env}</table>"
        f'<p class="note">{html.escape(run.environment_source)}</p></div></div></details>'
    )


def _template(name: str) -> str:
    return resources.files("glassrl.report").joinpath("templates", name).read_text(encoding="utf-8")


# CJK ideographs, kana, hangul and their punctuation: tokens a page shows as boxes without a CJK font
_CJK = re.compile("[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef]")
CJK_NOTE = (
    '<p class="note" id="cjk-note">Chinese, Japanese or Korean tokens need a CJK font (Noto Sans CJK, '
    "Source Han Sans, PingFang, Microsoft YaHei or WenQuanYi; Debian/Ubuntu: fonts-noto-cjk): where none "
    "is installed the browser draws them as boxes. The page holds the text itself: copying a token gives it.</p>"
)


def _write(out: str | Path, title: str, body: str, payload: dict[str, Any], head: str) -> Path:
    data = json.dumps(payload, ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")
    if _CJK.search(data):
        body = body.replace('<div id="token-view">', CJK_NOTE + '<div id="token-view">', 1)
    parts = {
        "TITLE": html.escape(title),
        "STYLE": _template("report.css"),
        "HEAD": head,
        "BODY": body,
        "DATA": data,
        "SCRIPT": _template("token_view.js"),
    }
    # One pass over the template: text put in is never scanned for placeholders again.
    page = _PLACEHOLDER.sub(lambda m: parts[m[1]], _template("page.html"))
    out = Path(out)
    # Written beside it and renamed over it: a reader never sees half a page, a link at ``out`` is
    # replaced rather than written through, and a write that fails leaves the old page.
    with disk_errors(str(out), out.parent):
        out.parent.mkdir(parents=True, exist_ok=True)
        with replaced(out) as f:
            f.write(page)
    return out
