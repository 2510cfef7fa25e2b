"""The trainer loop on the tiny model: presets run, reward failures, exclusion from baselines,
exact gradient accumulation, process-reward placement, the prompt stream, the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.rl.config import TrainConfig
from helpers import gradients_before_each_step

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# the configured reward on the evaluation responses (glassrl.rl.evaluation), besides eval/accuracy
EVAL_REWARD = ("eval/reward/mean", "eval/reward/arith_verify/mean", "eval/reward/failure_rate")


def _trainer(path, overrides, **kwargs):
    from glassrl.rl.loop import Trainer

    return Trainer(load_config(TrainConfig, path, overrides), progress=False, **kwargs)


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("preset", ["grpo", "ppo"])
def test_preset_runs_two_steps(preset, fast, tmp_path):
    from glassrl.ledger import read_jsonl
    from glassrl.report.metrics_doc import undocumented

    trainer = _trainer(EXAMPLES / f"{preset}.yaml", fast)
    trainer.train()
    run = tmp_path / "run"
    rows = _rows(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    langs = {"en", "zh"} if trainer.cfg.logging.eval_group_by == "lang" else set()  # grpo and ppo split by language
    assert set(rows[0]) == {"step", "eval/accuracy", *EVAL_REWARD} | {f"eval/accuracy/{lang}" for lang in langs}
    keys = {k for r in rows for k in r if k != "step"}
    assert undocumented(keys) == []
    assert {
        "reward/mean",
        "task/accuracy",
        "actor/policy_loss",
        "actor/grad_norm",
        "kl/mean",
        "response/distinct_2",
        "perf/generate_s",
        "eval/accuracy",
    } <= keys
    if preset == "ppo":
        assert {"critic/value_loss", "critic/explained_variance", "returns/mean", "critic/vf_clip_frac"} <= keys
    ledger = read_jsonl(run / "ledgers" / "step_000002.jsonl")
    assert ledger.step == 2 and ledger.estimator == ("gae" if preset == "ppo" else "grpo")
    for response in ledger.responses:
        valid = [t for t in response.tokens if t.response_mask]
        assert response.length == len(response.tokens) and valid
        last = valid[-1]
        assert last.token_scores == pytest.approx(response.score)  # the outcome score sits on the last token
        for t in valid:
            assert t.token_rewards == pytest.approx(t.token_scores - ledger.beta * t.kl, abs=1e-6)
            if preset == "ppo":
                assert t.returns == pytest.approx(t.advantages + t.values, abs=1e-5)  # raw A (DESIGN §1)
            else:
                assert t.advantages == pytest.approx(valid[0].advantages)  # one advantage per response
    manifest = json.loads((run / "checkpoints" / "step_00000002" / "manifest.json").read_text())
    expected = {"actor", "actor_optim", "rollout_rng", "rng", "data", "counters", "threads", "kl_controller", "config"}
    if preset == "ppo":
        expected |= {"critic", "critic_optim"}
    assert set(manifest["parts"]) == expected
    assert (run / "config.yaml").is_file()


def _marked(prompt_file: Path, out: Path, marks: dict[int, str]) -> Path:
    lines = prompt_file.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    for i, mark in marks.items():
        rows[i]["fail"] = mark
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return out


def _failure_overrides(fast, data: Path, rate: float) -> list[str]:
    source = "[{name: user_function, spec: 'trainer_reward_fns:flaky_reward', timeout_s: 2.0}]"
    return [
        *fast,
        f"data.train={data}",
        "data.eval_size=0",
        f"reward.sources={source}",
        f"reward.max_failure_rate={rate}",
    ]


@pytest.mark.slow
def test_reward_failures_below_the_threshold_are_counted(fast, prompt_files, tmp_path):
    """One prompt raises, one hangs past the timeout: 4 + 4 of 32 responses fail over 2 steps;
    at most half of a step's responses, so the run goes on."""
    data = _marked(prompt_files[0], tmp_path / "marked.jsonl", {0: "raise", 1: "sleep"})
    _trainer(None, _failure_overrides(fast, data, 0.5)).train()
    rows = _rows(tmp_path / "run")
    assert sum(r["reward/failures/error"] for r in rows) == 4
    assert sum(r["reward/failures/timeout"] for r in rows) == 4
    for r in rows:
        assert r["reward/failure_rate"] == (r["reward/failures/error"] + r["reward/failures/timeout"]) / 16


def test_reward_failures_above_the_threshold_stop_the_run(fast, prompt_files, tmp_path):
    data = _marked(prompt_files[0], tmp_path / "marked.jsonl", {0: "raise"})
    with pytest.raises(
        GlassrlError,
        match=r"step [12]: 4 of 16 reward scores failed \(25% > reward\.max_failure_rate "
        r"= 0\.2\); first: error: .*boom on a marked prompt",
    ):
        _trainer(None, _failure_overrides(fast, data, 0.2)).train()


def test_a_failing_user_reward_names_its_line_once_and_writes_its_traceback(fast, prompt_files, tmp_path):
    # issue 31, item 13: the same exception three times, no file:line, no traceback
    data = _marked(prompt_files[0], tmp_path / "marked.jsonl", {0: "raise"})
    with pytest.raises(GlassrlError) as info:
        _trainer(None, _failure_overrides(fast, data, 0.2)).train()
    message, where = str(info.value), f"{Path(__file__).parent / 'trainer_reward_fns.py'}:12"
    assert message.count("boom on a marked prompt") == 1 and message.count(f"(at {where})") == 1
    assert "(×4)" in message
    written = tmp_path / "run" / "reward_traceback.txt"
    assert message.endswith(f"; the first traceback: {written}")
    text = written.read_text(encoding="utf-8")
    assert 'trainer_reward_fns.py", line 12, in flaky_reward' in text and "RuntimeError: boom" in text


def test_failed_responses_leave_group_baselines_and_training():
    """Group 0 = scores [1, 0, 1, failed]: GRPO over the 3 scored ones only; group 1 keeps one
    scored response, no baseline: all of it is left out."""
    from glassrl.data.records import PromptRecord
    from glassrl.rewards.base import RewardResult
    from glassrl.rl.config import AlgoConfig
    from glassrl.rl.phases import Sampled, advantages, score, token_rewards
    from glassrl.rollout.base import RolloutBatch

    B, T = 8, 3
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 2] = False  # a shorter response
    rollout = RolloutBatch(
        torch.zeros(B, 1, dtype=torch.long),
        torch.ones(B, 1, dtype=torch.bool),
        torch.zeros(B, T, dtype=torch.long),
        mask,
        torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
        ["stop"] * B,
        [""] * B,
    )
    ok, failed = RewardResult.ok, RewardResult.error("boom")
    results = [ok(1.0), ok(0.0), ok(1.0), failed, ok(1.0), failed, failed, failed]
    prompts = [PromptRecord("p0"), PromptRecord("p1")]
    exp = score(  # GRPO has no greedy baseline: no rollout or reward worker is called
        Sampled(rollout, prompts, [[0], [0]], results),
        None,
        estimator="grpo",
        shapers=[],
        rollout=None,
        reward=None,
        max_new_tokens=T,
    )
    assert exp.scored.tolist() == [True, True, True, False, True, False, False, False]
    assert exp.response_mask.any(-1).tolist() == [True, True, True, False, False, False, False, False]
    assert exp.token_scores[:, -1].tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]  # on the last token
    token_rewards(exp, beta=0.0, kl_in_reward=False)
    advantages(exp, AlgoConfig(advantage="grpo", whiten_advantages=False))
    std = math.sqrt(1 / 3)  # unbiased std of [1, 0, 1]
    expected = [(1 - 2 / 3) / std, (0 - 2 / 3) / std, (1 - 2 / 3) / std]
    train_mask = exp.response_mask
    for b, value in enumerate(expected):
        assert exp.advantages[b][train_mask[b]].tolist() == pytest.approx([value] * int(train_mask[b].sum()), abs=1e-5)
    assert (exp.advantages[3:] == 0).all() and not exp.response_mask[3:].any()


def test_process_rewards_sit_on_step_end_tokens(tiny_model_dir):
    from glassrl.data.records import PromptRecord
    from glassrl.models import load_tokenizer
    from glassrl.rewards import ArithVerifyVerifier, RewardRequest
    from glassrl.rl.phases import place_scores, step_end_tokens
    from glassrl.rollout.base import RolloutBatch

    tok = load_tokenizer(tiny_model_dir)
    text = "是的，等于12！"
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    pieces = [tok.decode([i]) for i in ids]
    assert pieces[:7] == ["是", "的", "，", "等于", "1", "2", "！"]
    # "，" is character 2 (end 3) -> token 2; "！" is character 7 (end 8) -> token 6
    assert step_end_tokens(tok, ids, text, [3, 8]) == [2, 6]
    record = PromptRecord("请问5+7=12？", "是的，等于12！", {"is_true": True, "sum": 12})
    result = ArithVerifyVerifier(process_rewards=True).score([RewardRequest("", text, record)])[0]
    assert result.process_rewards == ((3, 1.0), (8, 1.0))
    T = len(ids)
    rollout = RolloutBatch(
        torch.ones(1, 1, dtype=torch.long),
        torch.ones(1, 1, dtype=torch.bool),
        torch.tensor([ids]),
        torch.ones(1, T, dtype=torch.bool),
        torch.zeros(1, dtype=torch.long),
        ["stop"],
        [text],
    )
    token_scores, step_end = place_scores([result], torch.tensor([1.0]), rollout, tok)
    assert token_scores[0].tolist() == [0, 0, 1.0, 0, 0, 0, 1.0, 0]
    assert step_end[0].tolist() == [False, False, True, False, False, False, True, False]


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_gradient_accumulation_is_exact(tiny_model_dir, loss_agg):
    """The accumulated gradient of a mini-batch does not depend on the micro-batch size."""
    from functools import partial

    from glassrl.algos.losses import PolicyLossParams
    from glassrl.models import load_causal_lm
    from glassrl.optim import lr_lambda
    from glassrl.rl.loss import actor_forward, actor_terms
    from glassrl.rl.update import run_updates

    generator = torch.Generator().manual_seed(0)
    B, P, T = 8, 4, 6
    input_ids = torch.randint(5, 200, (B, P + T), generator=generator)
    lengths = torch.tensor([6, 1, 3, 6, 2, 5, 4, 6])
    response_mask = torch.arange(T).expand(B, T) < lengths.unsqueeze(1)
    batch = {
        "input_ids": input_ids,
        "attention_mask": torch.cat([torch.ones(B, P, dtype=torch.bool), response_mask], 1),
        "response_mask": response_mask,
        "old_logprobs": -torch.rand(B, T, generator=generator),
        "advantages": torch.randn(B, T, generator=generator),
        "ref_logprobs": -torch.rand(B, T, generator=generator),
    }
    terms = actor_terms(
        policy_loss="ppo_clip",
        params=PolicyLossParams(),
        loss_agg=loss_agg,
        norm_length=T,
        kl_in_loss="k3",
        kl_coef=0.1,
        entropy_coef=0.01,
        positive_nll_coef=0.0,
    )
    grads = []
    for micro in (1, 2, 8):
        model = load_causal_lm(tiny_model_dir, device="cpu")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("constant", 0, 1))
        seen = gradients_before_each_step(model, optimizer)
        metrics = run_updates(
            model,
            optimizer,
            scheduler,
            batch,
            [torch.arange(B)],
            micro_batch=micro,
            grad_clip=None,
            forward=partial(actor_forward, 1.0, True),
            terms=terms,
            prefix="actor",
        )
        grads.append(seen[-1])
        assert {"actor/policy_loss", "actor/kl_loss", "actor/entropy_loss", "actor/grad_norm"} <= set(metrics)
    for other in grads[1:]:
        torch.testing.assert_close(other, grads[0], rtol=1e-4, atol=1e-6)


def test_prompt_stream_epochs_and_position():
    from glassrl.data.records import PromptRecord
    from glassrl.data.stream import PromptStream

    records = [PromptRecord(str(i)) for i in range(5)]
    stream = PromptStream(records, seed=3)
    taken = [r.prompt for r in stream.take(15)]
    for epoch in range(3):
        assert sorted(taken[5 * epoch : 5 * epoch + 5]) == ["0", "1", "2", "3", "4"]
    assert taken[:5] != taken[5:10]  # a fresh order each epoch
    again = PromptStream(records, seed=3)
    again.take(7)
    saved = again.state_dict()
    resumed = PromptStream(records, seed=3)
    resumed.load_state_dict({"data": saved["data"][1]})
    assert [r.prompt for r in resumed.take(8)] == taken[7:15]
    with pytest.raises(GlassrlError, match="resume with the same data"):
        PromptStream(records[:4], seed=3).load_state_dict({"data": saved["data"][1]})


def test_minibatch_plan_is_a_permutation_per_epoch():
    from glassrl.rl.update import minibatch_plan

    plan = minibatch_plan(12, 4, 2, torch.Generator().manual_seed(0))
    assert len(plan) == 6 and all(len(p) == 4 for p in plan)
    for epoch in range(2):
        assert sorted(torch.cat(plan[3 * epoch : 3 * epoch + 3]).tolist()) == list(range(12))


@pytest.mark.slow
def test_cli_train(fast, tmp_path, capsys):
    from glassrl.cli import main

    assert main(["train", str(EXAMPLES / "grpo.yaml"), *fast, "steps=1"]) == 0
    out = capsys.readouterr().out
    assert "resolved sizes" in out and "gradient accumulation" in out and "held-out accuracy" in out
    # a second fresh run into the same directory would mix two runs
    assert main(["train", str(EXAMPLES / "grpo.yaml"), *fast, "steps=1"]) == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    # resuming with another config is refused, naming the key
    assert main(["train", str(EXAMPLES / "grpo.yaml"), *fast, "steps=1", "algo.clip_high=0.3", "--resume"]) == 2
    assert "algo.clip_high" in capsys.readouterr().err
    assert main(["train", str(EXAMPLES / "grpo.yaml"), *fast, "batch.size=3"]) == 2
    assert "unknown key batch.size; valid keys here: batch.prompts_per_step" in capsys.readouterr().err


FEATURES = {
    "remax-greedy-baseline": ["algo.advantage=remax", "rollout.n=2"],
    "grpo-process-rewards": [
        "algo.advantage=grpo_process",
        "reward.sources=[{name: arith_verify, process_rewards: true}]",
    ],
    "overlong-and-reward-norm": ["algo.overlong={max_length: 12, cache_length: 4}", "algo.reward_norm=true"],
    "value-warmup-positive-nll-entropy": [
        "algo.advantage=gae",
        "algo.lam=0.95",
        "algo.value_warmup_steps=1",
        "algo.positive_nll_coef=0.1",
        "algo.entropy_coef=0.01",
        "reward.sources=[{name: arith_verify, partial_credit: true}]",
    ],
}


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_features_run(feature, fast, tmp_path):
    """Each optional part chosen by config runs end to end and leaves its mark in the ledger/metrics."""
    from glassrl.ledger import read_jsonl

    _trainer(EXAMPLES / "grpo.yaml", [*fast, "data.eval_size=0", *FEATURES[feature]]).train()
    rows = _rows(tmp_path / "run")
    ledger = read_jsonl(tmp_path / "run" / "ledgers" / "step_000002.jsonl")
    if feature == "remax-greedy-baseline":
        assert all(r.baseline_reward is not None for r in ledger.responses)
    if feature == "grpo-process-rewards":
        assert any(t.step_end for r in ledger.responses for t in r.tokens)
    if feature == "value-warmup-positive-nll-entropy":
        assert "actor/policy_loss" not in rows[0] and "critic/value_loss" in rows[0]  # step 1: critic only
        assert {"actor/positive_nll_loss", "actor/entropy_loss"} <= set(rows[1])


def test_evaluation_by_group_splits_the_accuracy(fast, prompt_files, tmp_path):
    """eval/accuracy/<value> per metadata value; the groups' accuracies, weighted by their sizes,
    give eval/accuracy back; a key no record has adds nothing."""
    from glassrl.rl.evaluation import metric_segment

    trainer = _trainer(EXAMPLES / "grpo.yaml", [*fast, "steps=1", "logging.eval_group_by=lang"])
    metrics = trainer.evaluate()
    langs = [json.loads(line)["lang"] for line in prompt_files[1].read_text(encoding="utf-8").splitlines()]
    sizes = {lang: langs.count(lang) for lang in set(langs)}
    assert set(metrics) == {"eval/accuracy", *EVAL_REWARD} | {f"eval/accuracy/{lang}" for lang in sizes}
    assert len(sizes) == 2
    weighted = sum(metrics[f"eval/accuracy/{lang}"] * n for lang, n in sizes.items()) / len(langs)
    assert weighted == pytest.approx(metrics["eval/accuracy"], abs=1e-12)
    trainer.cfg.logging.eval_group_by = "no_such_key"
    assert set(trainer.evaluate()) == {"eval/accuracy", *EVAL_REWARD}
    assert [metric_segment(v) for v in ("en", "Zh-CN", "a/b c", True, 3, "///")] == [
        "en",
        "zh-cn",
        "a_b_c",
        "true",
        "3",
        "_",
    ]
