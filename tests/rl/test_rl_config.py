"""TrainConfig (and the SFT/RM configs): derived sizes with units, range/name/consistency errors
and knobs the chosen algorithm ignores, each naming the key."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from glassrl import presets
from glassrl.algos.advantages import ADVANTAGE_ESTIMATORS, AdvantageParams
from glassrl.algos.losses import POLICY_LOSSES, PolicyLossParams
from glassrl.config import describe, load_config, load_saved_config, print_resolved, to_dict
from glassrl.errors import GlassrlError
from glassrl.rl.checks import ESTIMATOR_KNOBS, POLICY_LOSS_KNOBS
from glassrl.rl.config import AlgoConfig, TrainConfig
from glassrl.rl.resolve import resolve
from glassrl.supervised.preference_config import PreferenceConfig
from glassrl.supervised.rm import RMConfig
from glassrl.supervised.sft import SFTConfig

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
    assert re.search(r"actor learning rate\s+│\s+1e-05\s+│ peak; 0 warm-up optimiser steps, then constant", text)
    assert "critic learning rate" not in text  # GRPO trains no critic
    out = io.StringIO()
    print_resolved(_resolve("algo.advantage=gae", "algo.kl.placement=none"), Console(file=out, width=200))
    assert re.search(r"critic learning rate\s+│\s+0\.0001\s+│", out.getvalue())
    assert re.search(r"KL\s+│\s+none\s+│", out.getvalue())


@pytest.mark.parametrize(
    ("cls", "overrides", "rows"),
    [
        (
            SFTConfig,
            ["steps=50", "optim.lr=3e-4"],
            [r"training length\s+│\s+50 │ optimiser steps", r"│\s+0\.0003 │ peak"],
        ),
        (SFTConfig, ["epochs=2"], [r"training length\s+│\s+2 │ epochs"]),
        (RMConfig, ["batch_size=4", "use_margin=true"], [r"sequences per step\s+│\s+8 │", r"r_c − r_r − m\)"]),
    ],
)
def test_sft_and_rm_tables(cls, overrides, rows):
    out = io.StringIO()
    print_resolved(load_config(cls, None, overrides), Console(file=out, width=200))
    assert out.getvalue().startswith(cls.title)
    for row in rows:
        assert re.search(row, out.getvalue()), row


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
        (["model.critic=/some/critic"], r"model\.critic = '/some/critic': ignored: only a critic uses it"),
        (["algo.lam=0.9", "algo.critic_lam=0.5"], r"algo\.critic_lam = 0\.5: ignored: only a critic uses it"),
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
    with pytest.raises(
        GlassrlError,
        match=r"cfg\.yaml: unknown key algo\.lamda \(did you mean algo\.lam\?\); valid keys here: algo\.adv",
    ):
        load_config(TrainConfig, path)
    path.write_text("algo:\n  lam: 1.0\n")
    with pytest.raises(GlassrlError, match=r"^command line: unknown key batch\.size; valid keys here: batch\.prompts"):
        load_config(TrainConfig, path, ["batch.size=3"])
    with pytest.raises(GlassrlError, match=r"^command line: unknown key algo\.lamm \(did you mean algo\.lam\?\)"):
        load_config(TrainConfig, presets.path("grpo"), ["algo.lamm=0.9"])


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
    assert r.uses_critic
    assert not _resolve("algo.kl.placement=none").uses_reference


def test_resolve_makes_the_config_concrete_once_and_leaves_it_unchanged():
    """The schedules' lengths, the staleness bound and the correction are derived once (glassrl.rl.resolve);
    the config given is not changed (a new one is made concrete: model.dtype auto -> float32 on CPU)."""
    cfg = load_config(TrainConfig, None, ["steps=10", "batch.epochs=2", "model.device=cpu", "rollout.overlap=true"])
    r = resolve(cfg)
    assert (r.total_optimizer_steps, r.actor_optimizer_steps) == (20, 20)  # 10 steps × 2 epochs × 1 mini-batch
    assert r.max_staleness == 1 and r.correction is None  # rollout.overlap is max_staleness 1
    assert (r.cfg.model.dtype, r.cfg.model.compute_dtype) == ("float32", "float32")
    assert (cfg.model.dtype, cfg.model.compute_dtype) == ("auto", "auto")
    warm = resolve(load_config(TrainConfig, None, ["algo.advantage=gae", "algo.value_warmup_steps=3", "steps=10"]))
    assert (warm.total_optimizer_steps, warm.actor_optimizer_steps) == (10, 7)  # no actor step in the warm-up
    tis = resolve(load_config(TrainConfig, None, ["algo.rollout_is.cap=3"]))
    assert tis.correction == ("token_tis", {"cap": 3.0}) and tis.max_staleness == 0


@pytest.mark.parametrize("top", [TrainConfig, SFTConfig, RMConfig, PreferenceConfig])
def test_every_field_has_its_help(top):
    """Each field of the trainers' configs, nested sections included, gives its help
    (glassrl.config.option): the documentation of its key in config show and docs/config.md."""
    missing = [row.key for row in describe(top) if not row.help]
    assert not missing, f"no help: {', '.join(missing)}"


def test_the_presets_are_found():
    names = presets.rl_names()
    supervised = {"sft", "rm", "dpo", "kto", "cpo", "orpo", "bco"}
    assert {"grpo", "ppo", "dapo"} <= set(names) and not supervised & set(names)
    companions = {name for names in presets.COMPANIONS.values() for name in names}
    assert set(presets.names()) == {*names, *supervised, *presets.TASKS.values(), *companions}


@pytest.mark.parametrize("name", presets.rl_names())
def test_presets_resolve(name):
    """Every RL preset loads (no knob its algorithm ignores) and resolves, also by its examples/ path."""
    resolve(load_config(TrainConfig, presets.path(name)))
    assert (EXAMPLES / f"{name}.yaml").read_bytes() == presets.path(name).read_bytes()


@pytest.mark.parametrize(("cls", "name"), [(SFTConfig, "sft"), (RMConfig, "rm")])
def test_sft_and_rm_presets_load(cls, name):
    cfg = load_config(cls, EXAMPLES / f"{name}.yaml")
    assert cfg.optim.decay == "cosine" and cfg.optim.lr > 0


# ---------------------------------------------------------------- knobs the chosen algorithm ignores


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algo.lam=0.9"],
            r"algo\.lam = 0\.9: ignored: algo\.advantage = grpo does not read it \(only gae\); remove it",
        ),
        (["algo.lam=1.0"], r"algo\.lam = 1\.0: ignored"),  # the default, but written: the user meant something
        (["algo.advantage=rloo", "algo.gamma=0.9"], r"algo\.gamma = 0\.9: ignored: .* \(only gae, reinforce_pp\)"),
        (
            ["algo.advantage=gae", "algo.critic_lam=1.0", "algo.length_alpha=2", "algo.lam=0.9"],
            r"algo\.lam = 0\.9: ignored: algo\.length_alpha sets the policy's λ and algo\.critic_lam the critic's",
        ),
        (["algo.length_alpha=2"], r"algo\.length_alpha = 2\.0: ignored: only a critic uses it, .* grpo has none"),
        (["algo.value_clip=0.5"], r"algo\.value_clip = 0\.5: ignored: only a critic uses it"),
        (["algo.value_warmup_steps=1"], r"algo\.value_warmup_steps = 1: ignored: only a critic uses it"),
        (["model.critic_head=token-classification"], r"model\.critic_head = 'token-classification': ignored"),
        (["critic_optim.lr=1e-3"], r"critic_optim\.lr = 0\.001: ignored: only a critic uses it"),
        (
            ["algo.cispo_eps_is_high=0.3"],
            r"algo\.cispo_eps_is_high = 0\.3: ignored: algo\.policy_loss = ppo_clip .*\(only cispo\)",
        ),
        (["algo.clip_cov_r=0.01"], r"algo\.clip_cov_r = 0\.01: ignored: .* \(only clip_cov\)"),
        (["algo.dual_clip_c=2"], r"algo\.dual_clip_c = 2\.0: ignored: .* \(only dual_clip, aspo\)"),
        (
            ["algo.policy_loss=cispo", "algo.clip_high=0.28"],
            r"algo\.clip_high = 0\.28: ignored: algo\.policy_loss = cispo",
        ),
        (["algo.policy_loss=reinforce", "algo.clip_low=0.1"], r"algo\.clip_low = 0\.1: ignored: .*= reinforce"),
        (["algo.norm_length=8"], r"algo\.norm_length = 8: ignored: the L of loss_agg seq-mean-token-sum-norm"),
        (["algo.kl.placement=none", "algo.kl.coef=0.1"], r"algo\.kl\.coef = 0\.1: ignored: algo\.kl\.placement = none"),
        (["algo.kl.placement=none", "model.reference=/ref"], r"model\.reference = '/ref': ignored: .*no reference"),
        (["algo.kl.horizon=100"], r"algo\.kl\.horizon = 100: ignored: .*algo\.kl\.target is null"),
        (["algo.dynamic_sampling_max_rounds=8"], r"algo\.dynamic_sampling_max_rounds = 8: ignored: .* is off"),
        (["data.ptx=task:add"], r"data\.ptx = 'task:add': ignored: .*algo\.ptx_coef = 0"),
    ],
)
def test_a_knob_the_algorithm_ignores_is_an_error(overrides, message):
    with pytest.raises(GlassrlError, match=message):
        load_config(TrainConfig, None, overrides)


def test_knobs_the_algorithm_reads_pass():
    _resolve("algo.advantage=gae", "algo.lam=0.9", "algo.gamma=0.99", "critic_optim.lr=1e-3", "algo.value_clip=0.5")
    _resolve("algo.advantage=reinforce_pp", "rollout.n=1", "algo.gamma=0.9")
    _resolve("algo.policy_loss=aspo", "algo.dual_clip_c=2", "algo.clip_high=0.28")
    _resolve("algo.loss_agg=seq-mean-token-sum-norm", "algo.norm_length=8")
    _resolve("algo.kl.placement=reward", "algo.kl.kind=k1", "algo.kl.target=0.1", "algo.kl.horizon=100")
    _resolve("algo.value_clip=null", "model.critic=null", "algo.norm_length=null")  # null is "off", never set


def test_without_written_keys_a_knob_is_set_when_it_differs_from_its_default(tmp_path):
    """A config built in Python (the trainer's own resolve) or a run's saved config.yaml, where
    every key is present: only values differing from the default count."""
    resolve(TrainConfig(algo=AlgoConfig(lam=1.0)))
    with pytest.raises(GlassrlError, match=r"algo\.lam = 0\.9: ignored"):
        resolve(TrainConfig(algo=AlgoConfig(lam=0.9)))
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(to_dict(load_config(TrainConfig, presets.path("grpo")))))
    assert load_saved_config(TrainConfig, saved).algo.lam == 1.0
    # load_config sees a file with every key: its keys count as written where their values differ
    # from the default (model.critic_head at its default is not "set" under GRPO), and overrides
    # where they are written
    assert load_config(TrainConfig, saved, ["steps=120"]).steps == 120
    with pytest.raises(GlassrlError, match=r"^algo\.lam = 1\.0: ignored: algo\.advantage = grpo"):
        load_config(TrainConfig, saved, ["algo.lam=1.0"])


def test_the_knob_tables_cover_the_registries():
    """Adding an estimator or a policy loss means saying which knobs it reads."""
    assert set(ESTIMATOR_KNOBS) == set(ADVANTAGE_ESTIMATORS)
    assert set(POLICY_LOSS_KNOBS) == set(POLICY_LOSSES)
    advantage_fields = {f.name for f in dataclasses.fields(AdvantageParams)}
    loss_fields = {f.name for f in dataclasses.fields(PolicyLossParams)}
    assert {k for knobs in ESTIMATOR_KNOBS.values() for k in knobs} <= advantage_fields
    assert {k for knobs in POLICY_LOSS_KNOBS.values() for k in knobs} == loss_fields


@pytest.mark.parametrize(
    ("cls", "overrides", "message"),
    [
        (RMConfig, ["batch_size=0"], r"^batch_size = 0: must be >= 1$"),
        (RMConfig, ["optim.grad_clip=0"], r"^optim\.grad_clip = 0\.0: must be > 0 \(or null\)$"),
        (RMConfig, ["data=pairs.jsonl"], r"^eval_data = None: needed when data is a file \(pairs\.jsonl\)"),
        (RMConfig, ["lr=1e-3"], r"unknown key lr \(did you mean optim\.lr\?\)"),
        (SFTConfig, ["steps=0"], r"^steps = 0: must be >= 1$"),
        (SFTConfig, ["optim.lr=0"], r"^optim\.lr = 0\.0: must be > 0$"),
        (SFTConfig, ["steps=10", "epochs=3"], r"^epochs = 3\.0: ignored: steps = 10 sets the length"),
        (SFTConfig, ["epochs=0"], r"^epochs = 0\.0: must be > 0 when steps is null$"),
        (
            SFTConfig,
            ["warmup_steps=5"],
            r"unknown key warmup_steps \(did you mean optim\.warmup_steps\? docs/trl-verl\.md\)",
        ),
    ],
)
def test_sft_and_rm_configs_validate(cls, overrides, message):
    with pytest.raises(GlassrlError, match=message):
        load_config(cls, None, overrides)


def test_sampling_ahead_on_ray_samples_apart_unless_the_placement_is_written():
    cfg = load_config(TrainConfig, presets.path("grpo"), ["trainer.backend=ray", "rollout.max_staleness=2"])
    assert cfg.ray.rollout.placement == "with_actor"  # as written (the default): checking changes nothing
    assert resolve(cfg).cfg.ray.rollout.placement == "apart"  # made concrete by the resolve step
    cfg = load_config(TrainConfig, presets.path("grpo"), ["trainer.backend=ray"])
    assert resolve(cfg).cfg.ray.rollout.placement == "with_actor"  # synchronous: the actor's ranks sample
    with pytest.raises(GlassrlError, match="set ray.rollout.placement: apart"):
        load_config(
            TrainConfig,
            presets.path("grpo"),
            ["trainer.backend=ray", "rollout.max_staleness=2", "ray.rollout.placement=with_actor"],
        )
