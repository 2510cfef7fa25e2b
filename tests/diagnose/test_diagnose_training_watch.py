"""The reward-hacking watch in the trainer: watch/divergence logged once its window is full, an alert
printed, counted, written to watch.jsonl and pointing at the ledger rows of its step (written even
when logging.ledger_every would not), the rows earning proxy reward the gold does not give."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from glassrl.diagnose.training_watch import TrainingWatch, proxy_only_rows
from glassrl.diagnose.watch import Alert, RewardWatch
from glassrl.errors import GlassrlError
from helpers import preset_trainer


@pytest.mark.slow
def test_the_watch_in_a_run(fast, tmp_path, monkeypatch, capsys):
    update = RewardWatch.update

    def fire_at_step_2(self, row):
        found = update(self, row)
        return [*found, Alert(2, "gold_divergence", "alert", "test")] if row["step"] == 2 else found

    monkeypatch.setattr(RewardWatch, "update", fire_at_step_2)
    run = [*fast, "steps=3", "logging.ledger_every=0", "logging.watch_window=3", "reward.gold={name: arith_verify}"]
    preset_trainer("grpo", run).train()
    out = tmp_path / "run"
    rows = {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert "watch/divergence" not in rows[2]
    assert rows[3]["watch/divergence"] == 0.0  # the gold is the trained reward here: they never part
    assert rows[2]["watch/alerts"] == 1 and "watch/alerts" not in rows[3]
    # logging.ledger_every=0 writes no ledger but the alert's
    assert sorted(p.name for p in (out / "ledgers").iterdir()) == ["step_000002.jsonl"]
    (alert,) = map(json.loads, (out / "watch.jsonl").read_text().splitlines())
    assert alert == {"step": 2, "kind": "gold_divergence", "level": "alert", "message": "test", "rows": []}
    assert (
        "reward watch alert at step 2 (gold_divergence): test; no response of the ledger sample "
        "(ledgers/step_000002.jsonl) earned more proxy reward than the batch's mean and a gold score below its mean"
    ) in capsys.readouterr().out


def test_proxy_only_rows():
    metrics = {"reward/proxy": 0.5, "reward/gold": 0.5}
    proxy, gold = [0.9, 0.9, 0.1, None], [0.0, 1.0, 0.0, 0.0]
    assert proxy_only_rows(7, metrics, proxy, gold) == [(7, 0)]
    assert proxy_only_rows(7, {"reward/mean": 0.5}, proxy, None) == [(7, 0), (7, 1)]


@pytest.mark.parametrize("override", ["logging.watch_window=2", "logging.watch_threshold=0"])
def test_bad_watch_settings(fast, override):
    with pytest.raises(GlassrlError, match=override.split("=")[0]):
        preset_trainer("grpo", [*fast, override])


def test_a_resumed_run_replays_its_metrics_and_drops_later_alerts(tmp_path):
    from rich.console import Console

    from glassrl.diagnose.training_watch import TrainingWatch

    rows = [{"step": s, "reward/proxy": 0.1 * s, "reward/gold": 0.5 - 0.01 * s * s} for s in range(1, 13)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    alerts = [{"step": s, "kind": "gold_divergence", "level": "alert", "message": "m", "rows": []} for s in (5, 12)]
    (tmp_path / "watch.jsonl").write_text("".join(json.dumps(a) + "\n" for a in alerts))
    straight = RewardWatch(window=3, threshold=1.0)
    for row in rows[:10]:
        straight.update(dict(row))
    resumed = TrainingWatch(3, 1.0, tmp_path, Console(), resumed_at=10)
    assert resumed.watch.history == straight.history and resumed.watch.firing == straight.firing
    assert [json.loads(line)["step"] for line in (tmp_path / "watch.jsonl").read_text().splitlines()] == [5]
    metrics = dict(rows[10])
    del metrics["step"]
    assert [a.kind for a in resumed.update(11, metrics)] == [a.kind for a in straight.update(dict(rows[10]))]


def test_an_alert_says_which_responses_it_points_at_and_why(tmp_path):
    console = Console(file=io.StringIO(), width=400)
    watch = TrainingWatch(3, 0.5, tmp_path, console)
    watch.update(4, {"reward/mean": 0.5})  # no gold: the rows are those above the proxy mean
    watch.record([Alert(4, "reward_jump", "warning", "test")], [(4, 1), (4, 3)])
    assert console.file.getvalue() == (
        "reward watch warning at step 4 (reward_jump): test; responses 1, 3 of ledgers/step_000004.jsonl earned "
        "more proxy reward than the batch's mean\n"
    )
