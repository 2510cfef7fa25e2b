"""The trainer's ledger and ``glassrl explain --model`` agree, column by column.

Both run glassrl.rl.phases (phases 2–5). Train two steps with a ledger of every response
of each step; the ledger of step 2 was computed with what the checkpoint of step 1 holds — the
actor before step 2's update, the critic, β of the KL controller — and the initial actor as the
reference. Explain opens that checkpoint as ``--model`` does (explain_model.open_run) and
runs on the ledger's prompts and response tokens (explain_rollout, what ``--response`` and
``--sample`` feed). Its batch has the trainer's padding widths and micro-batches, so every
forward pass sees the same tensors and every number is equal exactly, not to a tolerance.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from glassrl.config import load_config
from glassrl.rl.config import TrainConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# A reward most groups of the tiny model disagree on, so that GRPO's step 1 moves the policy
# (under arith_verify the tiny model's groups often all score 0: no gradient).
MIXED_REWARD = "reward.sources=[{name: user_function, spec: 'trainer_reward_fns:says_yes'}]"
CASES = {
    "grpo": [MIXED_REWARD],  # group advantages, KL (k3) in the loss
    "ppo": [],  # critic, GAE, whitening, KL (k1) in the reward with an adaptive β; the task's verifier
    # How the run computed, which explain must compute the same way (its ledger is then exact too):
    "grpo-shared-prefix": [MIXED_REWARD, "model.shared_prefix=true"],
    "ppo-padding-free": ["model.padding_free=true"],
    "grpo-bf16": [MIXED_REWARD, "model.compute_dtype=bfloat16"],
}


@pytest.mark.parametrize("preset", sorted(CASES))
def test_explain_on_the_checkpoint_reproduces_the_trainers_ledger(preset, fast, tmp_path):
    from glassrl.cli import build_parser
    from glassrl.commands import explain_model
    from glassrl.data.formatting import format_prompt
    from glassrl.ledger import read_jsonl
    from glassrl.rl import explain
    from glassrl.rl.loop import Trainer
    from glassrl.rollout.base import concat_rollouts

    overrides = [
        *fast,
        *CASES[preset],
        "steps=2",
        "data.eval_size=0",
        "logging.checkpoint_every=1",
        "logging.keep_checkpoints=2",
        "logging.ledger_samples=64",  # every response: whitening and group baselines see the whole step
        "logging.report=false",
    ]
    trainer = Trainer(load_config(TrainConfig, EXAMPLES / f"{preset.split('-')[0]}.yaml", overrides), progress=False)
    trainer.train()
    run_dir = tmp_path / "run"
    trained = read_jsonl(run_dir / "ledgers" / "step_000002.jsonl")
    assert len(trained.responses) == trainer.resolved.responses_per_step

    checkpoint = run_dir / "checkpoints" / "step_00000001"
    args = build_parser(only="explain").parse_args(["explain", "--model", str(checkpoint), "--prompt", "-"])
    run = explain_model.open_run(args)
    policy = explain.load_policy(run)
    texts = {r.group_id: r.prompt for r in trained.responses}  # group k answers prompt k
    prompts = [explain.prompt_record(texts[g], None) for g in range(len(texts))]
    prompt_ids = [format_prompt(policy.tokenizer, texts[g]) for g in range(len(texts))]
    parts = []
    for response in trained.responses:
        ids = [t.token_id for t in response.tokens]
        part = explain.given_response(policy, prompt_ids[response.group_id], ids, response.finish_reason)
        part.group_index = torch.full_like(part.group_index, response.group_id)
        parts.append(part)
    explained = explain.explain_rollout(run, policy, concat_rollouts(parts, policy.pad_id), prompts, prompt_ids)

    assert explained.step == 1 and trained.step == 2  # the checkpoint's step, the step the ledger was taken at
    for got, want in zip(explained.responses, trained.responses, strict=True):
        for field in dataclasses.fields(want):
            if field.name != "tokens":
                assert getattr(got, field.name) == getattr(want, field.name), field.name
        for a, b in zip(got.tokens, want.tokens, strict=True):
            assert a == b, [f.name for f in dataclasses.fields(b) if getattr(a, f.name) != getattr(b, f.name)]
    assert dataclasses.replace(explained, step=2) == trained  # and the run fields: estimator, γ, λ, β, KL kind
    # the numbers are not trivially equal: the step moved the policy, the scores differ
    tokens = [t for r in trained.responses for t in r.tokens if t.response_mask]
    assert any(t.logprobs != t.ref_logprobs for t in tokens) and len({r.score for r in trained.responses}) > 1
    if preset.startswith("ppo"):
        assert trained.beta > 0 and all(t.values is not None and t.whitened_advantages is not None for t in tokens)
