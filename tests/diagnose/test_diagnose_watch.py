"""The reward-hacking watch's rules on hand-made metric series: proxy up and gold down is an alert at
the step the divergence passes the threshold; both up is none; a KL or length jump while the proxy
rises, and one criterion saturating alone, are warnings; a rule fires once per onset."""

from __future__ import annotations

import pytest

from glassrl.diagnose.watch import RewardWatch, watch_metrics
from glassrl.errors import GlassrlError


def _rows(**series):
    n = len(next(iter(series.values())))
    return [{"step": s, **{k.replace("__", "/"): v[s] for k, v in series.items()}} for s in range(n)]


def test_proxy_up_gold_down_is_an_alert_once():
    proxy = [0.1 * s for s in range(20)]
    gold = [0.5] * 10 + [0.5 - 0.05 * k for k in range(1, 11)]  # flat, then falls from step 10
    alerts = watch_metrics(_rows(reward__proxy=proxy, reward__gold=gold), window=5, threshold=1.0)
    assert [(a.step, a.kind, a.level) for a in alerts] == [
        (10, "gold_divergence", "alert")
    ]  # the first step gold falls
    assert alerts[0].message.startswith("proxy and gold diverge: over the last 5 steps the proxy moved +")


def test_the_divergence_is_logged_once_a_window_is_full():
    watch = RewardWatch(window=3, threshold=1.0)
    rows = _rows(reward__proxy=[0.0, 1.0, 2.0, 3.0], reward__gold=[0.0, 1.0, 2.0, 3.0])
    for row in rows:
        watch.update(row)
    assert "watch/divergence" not in rows[1]
    assert rows[2]["watch/divergence"] == pytest.approx(0.0) and rows[3]["watch/divergence"] == pytest.approx(0.0)


def test_both_rising_is_no_alert():
    ramp = [0.1 * s for s in range(20)]
    assert watch_metrics(_rows(reward__proxy=ramp, reward__gold=ramp), window=5, threshold=1.0) == []


def test_kl_and_length_jumps_while_the_proxy_rises_are_warnings():
    proxy = [0.1 * s for s in range(12)]
    kl = [1.0, 1.1] * 5 + [1.05, 9.0]
    length = [8.0] * 12
    alerts = watch_metrics(_rows(reward__mean=proxy, kl__sequence=kl, response__length__mean=length), window=5)
    assert [(a.step, a.kind, a.level) for a in alerts] == [(11, "kl_jump", "warning")]
    assert "kl/sequence jumps to 9" in alerts[0].message
    distinct = [0.8, 0.82] * 5 + [0.81, 0.3]  # repetition: distinct bigrams collapse
    alerts = watch_metrics(_rows(reward__mean=proxy, response__distinct_2=distinct), window=5)
    assert [(a.step, a.kind) for a in alerts] == [(11, "repetition_jump")]
    assert "below the window's mean" in alerts[0].message
    # without the proxy rising, the same jump is no warning
    assert watch_metrics(_rows(reward__mean=[1.0] * 12, kl__sequence=kl), window=5) == []


def test_one_criterion_saturating_alone_is_a_warning():
    rising = [0.1 * s for s in range(11)]
    flat = [0.5, 0.52] * 5 + [0.5]
    rows = _rows(reward__format__mean=rising, reward__env__accuracy__mean=flat)
    alerts = watch_metrics(rows, window=5)
    assert [(a.step, a.kind) for a in alerts] == [(4, "criterion_saturates")]
    assert alerts[0].message.startswith("reward/format/mean alone rises to its highest")
    # two criteria rising together: no warning
    assert watch_metrics(_rows(reward__format__mean=rising, reward__env__accuracy__mean=rising), window=5) == []


def test_one_criterion_of_one_rubric_saturating_alone_is_a_warning():
    rising = [0.1 * s for s in range(11)]
    flat = [0.5, 0.52] * 5 + [0.5]
    rows = _rows(
        reward__rubric__mean=rising,  # the source's mean rises with its criterion: not a criterion of it
        reward__rubric__citation__mean=rising,
        reward__rubric__accuracy__mean=flat,
        reward__rubric__temporal__mean=flat,
    )
    alerts = watch_metrics(rows, window=5)
    assert [(a.step, a.kind) for a in alerts] == [(4, "criterion_saturates")]
    assert alerts[0].message.startswith("reward/rubric/citation/mean alone rises")


def test_the_report_draws_the_alerts_and_highlights_their_rows(tmp_path):
    import json

    from glassrl.ledger import Ledger, ResponseLedger, TokenRow
    from glassrl.report.html import write_run_report

    run = tmp_path / "run"
    (run / "ledgers").mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 0\n")
    rows = _rows(reward__proxy=[0.1 * s for s in range(4)], reward__gold=[0.5, 0.4, 0.3, 0.2], reward__mean=[0.0] * 4)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    token = TokenRow(0, 5, "是", -1.0, None, None, None, None, None, None, None, None, None, True, None)
    response = ResponseLedger("1+1=2?", "是", 1.0, 0, 1, "stop", None, (token,))
    Ledger("grpo", 1.0, None, 0.0, None, responses=(response, response), step=3).to_jsonl(
        run / "ledgers" / "step_000003.jsonl"
    )
    alert = {
        "step": 3,
        "kind": "gold_divergence",
        "level": "alert",
        "message": "proxy and gold diverge",
        "rows": [[3, 1]],
    }
    (run / "watch.jsonl").write_text(json.dumps(alert) + "\n")
    page = write_run_report([run], tmp_path / "report.html").read_text(encoding="utf-8")
    assert '<section id="watch"><h2>Reward watch</h2>' in page
    assert '<a href="#tokens" class="alert-row" data-source="0" data-step="3" data-b="1">step 3 response 1</a>' in page
    assert '"flagged": {"1": "gold_divergence"}' in page  # the token view outlines response 1 of step 3
    # a dotted line at step 3 on the one chart against the step (reward/mean)
    assert page.count('"dash":"dot","width":1},"opacity":0.8,"type":"line","x0":3') == 1
    (run / "watch.jsonl").write_text("{oops\n")
    with pytest.raises(GlassrlError, match=r"watch.jsonl:1: not valid JSON"):
        write_run_report([run], tmp_path / "report.html")
