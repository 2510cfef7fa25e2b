"""TrainConfig: derived sizes with units, range/name/consistency errors naming the key."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.trainer import config as config_module
from glassrl.trainer.config import TrainConfig, print_resolved, resolve

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _resolve(*overrides: str):
    return resolve(load_config(TrainConfig, None, list(overrides)))


def test_derived_sizes():
    r = _resolve(
        "steps=10",
        "rollout.n=4",
        "batch.prompts_per_step=8",
        "batch.mini_batch_prompts=2",
        "batch.micro_batch_responses=4",
        "batch.epochs=3",
    )
    assert r.responses_per_step == 32  # 8 prompts × 4
    assert r.mini_batch_responses == 8  # 2 prompts × 4
    assert r.mini_batches_per_epoch == 4  # 8 / 2
    assert r.grad_accum_steps == 2  # 8 / 4
    assert r.optimizer_steps_per_step == 12  # 3 epochs × 4
    assert r.total_optimizer_steps == 120
    assert not r.uses_critic and r.uses_reference  # grpo, KL in the loss
    assert r.norm_length == 16  # rollout.max_new_tokens


def test_table_names_every_size_with_its_unit():
    out = io.StringIO()
    print_resolved(_resolve(), Console(file=out, width=200))
    text = out.getvalue()
    for unit in (
        "prompts, global",
        "responses, global",
        "responses, per optimiser step",
        "responses, per micro-batch, per worker",
        "micro-batches per optimiser step",
        "optimiser steps, whole run",
    ):
        assert unit in text
    assert re.search(r"responses per step\s+│\s+32\s+│", text)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["batch.micro_batch_responses=5"], r"batch\.micro_batch_responses = 5 does not divide .* = 32 responses"),
        (
            ["batch.mini_batch_prompts=3"],
            r"batch\.mini_batch_prompts = 3 does not divide batch\.prompts_per_step = 8 prompts",
        ),
        (["algo.lam=1.5"], r"algo\.lam = 1\.5: must lie in \[0, 1\]"),
        (["algo.gamma=-0.1"], r"algo\.gamma = -0\.1: must lie in \[0, 1\]"),
        (["rollout.temperature=0"], r"rollout\.temperature = 0\.0: must be > 0"),
        (["rollout.top_p=1.5"], r"rollout\.top_p"),
        (["reward.max_failure_rate=2"], r"reward\.max_failure_rate"),
        (["algo.clip_low=1.5"], r"algo\.clip_low = 1\.5"),
        (["algo.dual_clip_c=0.5"], r"algo\.dual_clip_c = 0\.5"),
        (["batch.epochs=0"], r"batch\.epochs = 0: must be >= 1"),
        (["algo.advantage=gea"], r"algo\.advantage = 'gea': unknown; valid: gae, grpo"),
        (["algo.policy_loss=ppo"], r"algo\.policy_loss = 'ppo': unknown; valid: ppo_clip"),
        (["algo.loss_agg=mean"], r"algo\.loss_agg = 'mean': unknown; valid: token-mean"),
        (["algo.kl.kind=k4"], r"algo\.kl\.kind = 'k4': unknown; valid: k1"),
        (["reward.sources=[{name: nope}]"], r"reward\.sources\[0\]\.name = 'nope': unknown; valid: .*arith_verify"),
        (["rollout.n=1"], r"rollout\.n = 1: algo\.advantage = grpo .* needs n >= 2"),
        (["rollout.n=1", "algo.advantage=rloo"], r"rollout\.n = 1: algo\.advantage = rloo"),
        (["model.critic=/some/critic"], r"model\.critic = '/some/critic': only used with a critic"),
        (["algo.lam=0.9", "algo.critic_lam=0.5"], r"algo\.critic_lam = 0\.5: only used with a critic"),
        (["algo.kl.kind=k1"], r"algo\.kl\.kind = 'k1': as a loss term"),
        (["algo.kl.target=0.1"], r"algo\.kl\.target = 0\.1: the adaptive controller .* algo\.kl\.placement = loss"),
        (["algo.advantage=gae", "algo.value_warmup_steps=100"], r"algo\.value_warmup_steps = 100: must be < steps"),
        (["algo.ptx_coef=0.1"], r"algo\.ptx_coef = 0\.1: needs data\.ptx"),
        (["algo.dynamic_sampling=true", "algo.advantage=gae"], r"algo\.dynamic_sampling = True: .* not a group"),
        (["algo.overlong={max_length: 32, cache_length: 4}"], r"algo\.overlong\.max_length = 32: must be <= rollout"),
        (["algo.overlong={max_length: 16, cache_length: 0}"], r"algo\.overlong\.cache_length = 0"),
        (["actor_optim.lr=0"], r"actor_optim\.lr = 0\.0: must be > 0"),
        (["critic_optim.grad_clip=-1"], r"critic_optim\.grad_clip = -1\.0"),
    ],
)
def test_errors_name_the_key(overrides, message):
    with pytest.raises(GlassrlError, match=message):
        _resolve(*overrides)


def test_unknown_key_lists_the_valid_ones(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("algo:\n  lamda: 0.9\n")
    with pytest.raises(GlassrlError, match=r"unknown key algo\.lamda; valid keys here: algo\.advantage, .*algo\.lam,"):
        load_config(TrainConfig, path)
    with pytest.raises(GlassrlError, match=r"unknown key batch\.size; valid keys here: batch\.prompts_per_step"):
        load_config(TrainConfig, None, ["batch.size=3"])


def test_gae_gets_a_critic_and_consistent_options_pass():
    r = _resolve(
        "algo.advantage=gae",
        "algo.lam=0.95",
        "algo.critic_lam=1.0",
        "algo.kl.placement=reward",
        "algo.kl.kind=k1",
        "algo.kl.target=0.05",
        "algo.value_warmup_steps=5",
    )
    assert r.uses_critic and r.actor_warmup_steps == 5
    assert not _resolve("algo.kl.placement=none").uses_reference


def test_every_field_has_a_one_line_comment():
    """Each dataclass field of TrainConfig carries a trailing comment (the documentation of its key)."""
    source = Path(config_module.__file__).read_text(encoding="utf-8").splitlines()
    classes = [TrainConfig]
    seen = set()
    while classes:
        cls = classes.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for f in dataclasses.fields(cls):
            line = next(s for s in source if re.match(rf"\s+{f.name}: ", s) and s.strip().startswith(f.name))
            assert "  # " in line, f"{cls.__name__}.{f.name} has no comment"
            hint = cls.__annotations__[f.name]
            for name in re.findall(r"[A-Z][A-Za-z]+Config", str(hint)):
                classes.append(getattr(config_module, name))


TRAIN_EXAMPLES = sorted(
    p.name for p in EXAMPLES.glob("*.yaml") if "algo" in (yaml.safe_load(p.read_text(encoding="utf-8")) or {})
)


def test_train_examples_are_found():
    assert {"grpo.yaml", "ppo.yaml", "dapo.yaml"} <= set(TRAIN_EXAMPLES) and "sft.yaml" not in TRAIN_EXAMPLES


@pytest.mark.parametrize("name", TRAIN_EXAMPLES)
def test_example_train_configs_resolve(name):
    """Every example that is a training config (it has an ``algo`` section) loads and resolves."""
    resolve(load_config(TrainConfig, EXAMPLES / name))
