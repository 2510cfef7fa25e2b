"""The RLHF parts of the trainer: score shapers for a learned reward (hand-computed), gold and
proxy metrics, the sequence KL, the critic initialised from the reward model, and their config checks."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.rewards import RewardResult
from glassrl.rl.config import AlgoConfig, TrainConfig
from glassrl.rl.phases import ClipShaper, InitNormShaper, NoEosShaper, score_shapers
from helpers import FixedResults


def _rollout(*finish_reasons: str) -> SimpleNamespace:
    return SimpleNamespace(finish_reasons=list(finish_reasons))


def _close(got: torch.Tensor, expected: list[float]) -> None:
    assert torch.allclose(got, torch.tensor(expected), atol=1e-6), got


# ---------------------------------------------------------------- score shapers, by hand


def test_init_norm_fixes_mean_and_std_on_the_first_batch():
    shaper = InitNormShaper()
    scores = torch.tensor([1.0, 3.0, 5.0, 100.0])
    scored = torch.tensor([True, True, True, False])  # the failed row takes no part in μ₀, σ₀
    # μ₀ = 3, σ₀ = √((4 + 0 + 4) / 2) = 2 (unbiased): (1, 3, 5, 100) → (−1, 0, 1, 48.5)
    _close(shaper(scores, scored, _rollout()), [-1.0, 0.0, 1.0, 48.5])
    assert (shaper.mean, shaper.std) == (3.0, 2.0)
    # later batches use the same μ₀, σ₀: (7, −1) → (2, −2)
    _close(shaper(torch.tensor([7.0, -1.0]), torch.tensor([True, True]), _rollout()), [2.0, -2.0])
    restored = InitNormShaper()
    restored.load_state_dict({name: value for name, (_, value) in shaper.state_dict().items()})
    _close(restored(torch.tensor([9.0]), torch.tensor([True]), _rollout()), [3.0])


def test_init_norm_without_spread_fixes_the_offset_only():
    shaper = InitNormShaper()
    _close(shaper(torch.tensor([2.0, 2.0]), torch.tensor([True, True]), _rollout()), [0.0, 0.0])  # σ₀ = 0: scale 1
    _close(shaper(torch.tensor([5.0]), torch.tensor([True]), _rollout()), [3.0])
    waiting = InitNormShaper()
    _close(waiting(torch.tensor([4.0]), torch.tensor([False]), _rollout()), [4.0])  # nothing scored: not fixed yet
    assert waiting.mean is None


def test_no_eos_score_replaces_the_score_of_cut_off_responses():
    shaper = NoEosShaper(-1.0)
    scores = torch.tensor([0.5, 2.0, 0.0, -3.0])
    scored = torch.tensor([True, True, False, True])
    got = shaper(scores, scored, _rollout("stop", "length", "length", "stop"))
    _close(got, [0.5, -1.0, 0.0, -3.0])  # row 2 failed: it keeps its 0 and does not train anyway


def test_score_clip():
    _close(
        ClipShaper(1.5)(torch.tensor([-3.0, -1.0, 0.2, 2.0]), torch.ones(4, dtype=torch.bool), _rollout()),
        [-1.5, -1.0, 0.2, 1.5],
    )


def test_shapers_apply_in_order_normalise_then_no_eos_then_clip():
    algo = AlgoConfig(reward_init_norm=True, no_eos_score=-1.0, score_clip=0.5)
    shapers = score_shapers(algo)
    assert [type(s) for s in shapers] == [InitNormShaper, NoEosShaper, ClipShaper]
    scores, scored = torch.tensor([1.0, 3.0, 5.0]), torch.ones(3, dtype=torch.bool)
    for shape in shapers:  # (1, 3, 5) → (−1, 0, 1) → (−1, −1, 1) → (−0.5, −0.5, 0.5)
        scores = shape(scores, scored, _rollout("stop", "length", "stop"))
    _close(scores, [-0.5, -0.5, 0.5])


# ---------------------------------------------------------------- gold, proxy, sequence KL


def test_gold_and_proxy_over_the_responses_both_scored():
    from glassrl.data.records import PromptRecord
    from glassrl.rewards import RewardRequest
    from glassrl.rl.metrics import gold_metrics

    record = PromptRecord("p", None, {}, "test")
    requests = [RewardRequest("p", text, record) for text in "abcd"]
    results = [RewardResult.ok(2.0), RewardResult.ok(-1.0), RewardResult.error("rm failed"), RewardResult.ok(0.5)]
    gold = FixedResults(
        {"a": RewardResult.ok(1.0), "b": RewardResult.ok(0.0), "c": RewardResult.ok(1.0), "d": RewardResult.error("x")}
    )
    # rows a and b only: proxy (2 − 1)/2 = 0.5, gold (1 + 0)/2 = 0.5
    assert gold_metrics(gold, requests, results) == {"reward/proxy": 0.5, "reward/gold": 0.5}
    none = gold_metrics(gold, requests[3:], results[3:])
    assert math.isnan(none["reward/proxy"]) and math.isnan(none["reward/gold"])


def test_sequence_kl_sums_valid_tokens_and_averages_responses():
    from glassrl.rl.metrics import sequence_kl

    mask = torch.tensor([[True, True, False], [True, True, True], [False, False, False]])
    kl = torch.tensor([[0.1, 0.3, 9.0], [0.2, -0.1, 0.5], [7.0, 7.0, 7.0]])
    # row 0: 0.1 + 0.3 = 0.4; row 1: 0.2 − 0.1 + 0.5 = 0.6; row 2 has no valid token: left out → 0.5
    assert sequence_kl(kl, mask) == pytest.approx(0.5)
    assert math.isnan(sequence_kl(kl, torch.zeros_like(mask)))


# ---------------------------------------------------------------- config and the critic's start


def _rm_cfg(*overrides: str) -> TrainConfig:
    base = [
        "algo.advantage=gae",
        "model.critic=reward_model",
        "model.critic_head=token-classification",
        "reward.sources=[{name: reward_model, path: runs/rm}]",
    ]
    return load_config(TrainConfig, None, [*base, *overrides])


def test_critic_from_the_reward_model_config():
    from glassrl.rl.resolve import critic_path

    cfg = _rm_cfg()
    assert critic_path(cfg, Path("actor_dir")) == Path("runs/rm")
    with pytest.raises(GlassrlError, match=r"model.critic = 'reward_model': needs a reward_model source"):
        _rm_cfg("reward.sources=[{name: arith_verify}]")
    with pytest.raises(GlassrlError, match=r"model.critic_head = 'value-head'.*token-classification"):
        _rm_cfg("model.critic_head=value-head")
    fresh = load_config(TrainConfig, None, ["algo.advantage=gae"])
    assert critic_path(fresh, Path("actor_dir")) == Path("actor_dir")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.reward_norm=true", "algo.reward_init_norm=true"], r"algo.reward_init_norm = True: algo.reward_norm"),
        (["algo.score_clip=0"], r"algo.score_clip = 0.0: must be > 0"),
        (["reward.gold={name: oracle}"], r"reward.gold.name = 'oracle': unknown"),
    ],
)
def test_rlhf_config_errors(overrides, message):
    with pytest.raises(GlassrlError, match=message):
        load_config(TrainConfig, None, overrides)


# ---------------------------------------------------------------- a run on a tiny reward model


@pytest.fixture(scope="module")
def tiny_rm(tiny_model_dir, tmp_path_factory):
    """A reward model trained for 4 steps from the tiny model on the bundled preference pairs."""
    from glassrl.supervised.rm import RMConfig, train_rm

    out = tmp_path_factory.mktemp("rm")
    cfg = load_config(
        RMConfig, None, [f"model={tiny_model_dir}", "steps=4", "batch_size=8", "log_every=2", f"output_dir={out}"]
    )
    train_rm(cfg)
    return out


@pytest.mark.slow
def test_ppo_on_a_reward_model_logs_gold_and_proxy_and_starts_the_critic_from_it(tiny_rm, fast, tmp_path):
    import json

    from glassrl.models import load_scalar_model
    from glassrl.report.metrics_doc import undocumented
    from glassrl.rl.loop import Trainer

    overrides = [
        *fast,
        "algo.advantage=gae",
        "algo.kl.placement=reward",
        "algo.kl.kind=k1",
        "model.critic=reward_model",
        "model.critic_head=token-classification",
        f"reward.sources=[{{name: reward_model, path: {tiny_rm}, max_length: 64}}]",
        "reward.gold={name: arith_verify}",
        "algo.reward_init_norm=true",
        "algo.no_eos_score=-1.0",
        "algo.score_clip=5.0",
    ]
    trainer = Trainer(load_config(TrainConfig, None, overrides), progress=False)
    rm = load_scalar_model(tiny_rm, head="token-classification", dtype="float32", device="cpu")
    critic = trainer.workers.critic.model.state_dict()
    assert all(torch.equal(critic[k], v) for k, v in rm.state_dict().items())  # body and score head: the RM's
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    for row in steps:
        assert {"reward/proxy", "reward/gold", "kl/sequence"} <= set(row)
        assert row["reward/proxy"] == pytest.approx(row["reward/mean"])  # no failures: the same responses
        assert row["reward/gold"] == pytest.approx(row["task/accuracy"])  # arith_verify is the task's verifier
    assert undocumented({k for r in rows for k in r if k != "step"}) == []
