"""reward.control (glassrl.rewards.control): the random and shuffled controls of Shao et al. 2025
(arXiv:2506.10947) — what they pay, that they are a pure function of the run (resume draws the same),
and that a control run trains on them while its evaluation, task accuracy and start-up line stay real."""

from __future__ import annotations

import math

import pytest
from tests.helpers import preset_trainer

from glassrl.rewards.base import RewardResult
from glassrl.rewards.control import control_results, control_scores, real_mean, real_results


def test_random_pays_one_with_probability_p_and_nothing_else():
    scores = [0.3] * 4000
    assert control_scores(scores, "random", 0.0, seed=1, step=1) == [0.0] * 4000
    assert control_scores(scores, "random", 1.0, seed=1, step=1) == [1.0] * 4000
    paid = control_scores(scores, "random", 0.25, seed=1, step=1)
    assert set(paid) == {0.0, 1.0}
    # Binomial(4000, 0.25): mean 1000, sd 27.4; 5 sd either side
    assert 1000 - 137 < sum(paid) < 1000 + 137


def test_a_control_is_a_pure_function_of_seed_step_and_index():
    scores = [float(i) for i in range(64)]
    for kind in ("random", "shuffled"):
        first = control_scores(scores, kind, 0.5, seed=7, step=3)
        assert control_scores(scores, kind, 0.5, seed=7, step=3) == first  # a resumed run draws the same
        assert control_scores(scores, kind, 0.5, seed=7, step=4) != first  # another step, other coins
        assert control_scores(scores, kind, 0.5, seed=8, step=3) != first


def test_shuffled_keeps_the_scores_and_breaks_their_bond():
    scores = [float(i) for i in range(32)]
    paid = control_scores(scores, "shuffled", 0.5, seed=0, step=1)
    assert sorted(paid) == scores
    assert sum(a == b for a, b in zip(paid, scores)) < 8  # a permutation that moves most of them


def test_results_keep_failures_and_the_real_score():
    results = [
        RewardResult.ok(1.0, process_rewards=[(3, 0.5)], details={"sources": {}}),
        RewardResult.timeout("slow"),
        RewardResult.ok(0.0),
        RewardResult.error("boom"),
    ]
    paid = control_results(results, "random", 1.0, seed=0, step=1)
    assert [r.status for r in paid] == ["ok", "timeout", "ok", "error"]
    assert [r.score for r in paid] == [1.0, None, 1.0, None]
    assert paid[0].process_rewards == ()  # a coin has no steps
    assert paid[2].details["control"] == {"kind": "random", "real": 0.0}
    assert paid[0].details["sources"] == {}  # what the sources said is kept
    assert [r.score for r in real_results(paid)] == [1.0, None, 0.0, None]
    assert real_mean(paid) == 0.5
    assert control_results(results, "none", 0.5, seed=0, step=1) == results
    assert math.isnan(real_mean(results))


@pytest.mark.parametrize("kind", ["random", "shuffled"])
def test_a_control_run_trains_on_the_control_and_evaluates_on_the_real_reward(fast, tmp_path, capsys, kind):
    from glassrl.report.run_dir import read_metrics

    real_dir, control_dir = tmp_path / "real", tmp_path / "control"
    preset_trainer("grpo", [*fast, f"output_dir={real_dir}"]).train()
    trainer = preset_trainer("grpo", [*fast, f"output_dir={control_dir}", f"reward.control={kind}"])
    assert f"reward: control {kind} (reward.control)" in capsys.readouterr().out
    trainer.train()
    real = {r["step"]: r for r in read_metrics(real_dir / "metrics.jsonl")}
    control = {r["step"]: r for r in read_metrics(control_dir / "metrics.jsonl")}
    # step 0's evaluation and step 1's responses come from the same weights: the same real figures
    assert control[0]["eval/accuracy"] == real[0]["eval/accuracy"]
    assert control[1]["reward/control/real_mean"] == pytest.approx(real[1]["reward/mean"], abs=1e-12)
    assert control[1]["task/accuracy"] == real[1]["task/accuracy"]
    # and what was paid is the control's
    if kind == "random":  # coins, one per response (16 a step here), whatever the responses say
        coins = control_scores([0.0] * 16, "random", 0.5, seed=trainer.cfg.seed, step=1)
        assert control[1]["reward/mean"] == pytest.approx(sum(coins) / 16, abs=1e-12)
    else:  # a permutation keeps the mean
        assert control[1]["reward/mean"] == pytest.approx(real[1]["reward/mean"], abs=1e-12)
    assert "reward/control/real_mean" not in real[1]
    from glassrl.report.metrics_doc import undocumented

    assert undocumented(k for k in control[1] if k != "step") == []  # docs/metrics.md has the new row


def test_control_p_outside_zero_one_is_one_line(fast, tmp_path):
    from glassrl.errors import GlassrlError

    with pytest.raises(GlassrlError, match=r"reward\.control_p"):
        preset_trainer("grpo", [*fast, f"output_dir={tmp_path}", "reward.control=random", "reward.control_p=1.5"])


def test_a_control_takes_the_environments_turn_rewards_away_too():
    import torch

    from glassrl.rl.phases import turn_rewards, without_turn_rewards
    from glassrl.rollout.base import RolloutBatch, Turn

    turns = [(Turn(0, 2, 4, "tool_call", "<call>", "<result>", (), {"valid_call": 0.1}), Turn(4, 6, 6, "stop", "7"))]
    rollout = RolloutBatch(
        prompt_ids=torch.ones(1, 2, dtype=torch.long),
        prompt_mask=torch.ones(1, 2, dtype=torch.bool),
        response_ids=torch.ones(1, 6, dtype=torch.long),
        response_mask=torch.tensor([[1, 1, 0, 0, 1, 1]], dtype=torch.bool),
        group_index=torch.zeros(1, dtype=torch.long),
        finish_reasons=["stop"],
        texts=["7"],
        turns=turns,
    )
    rewards, _ = turn_rewards(rollout)
    assert rewards.sum().item() == pytest.approx(0.1)  # a valid call pays 0.1 in a real run
    assert turn_rewards(without_turn_rewards(rollout)) is None  # and nothing in a control run
    assert [t.finish_reason for t in rollout.turns[0]] == ["tool_call", "stop"]


@pytest.mark.parametrize("change", ["algo.advantage=remax", "reward.sources=[{name: teacher, model: x}]"])
def test_a_control_refuses_what_pays_outside_the_outcome_score(fast, tmp_path, change):
    from glassrl.errors import GlassrlError

    with pytest.raises(GlassrlError, match=r"reward\.control = 'random': not with"):
        preset_trainer("grpo", [*fast, f"output_dir={tmp_path}", "reward.control=random", change])
