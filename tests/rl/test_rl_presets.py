"""Every algorithm preset (glassrl/presets/, linked from examples/): its defining settings, two
steps on the tiny model, and its page in docs/algorithms/.

grpo and ppo run in test_trainer_loop.py::test_preset_runs_two_steps; the other presets run
here with the same ``fast`` overrides (tests/rl/conftest.py), plus the few a preset
needs to stay valid at that size.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing
from collections import Counter
from pathlib import Path

import pytest
import torch

from glassrl import presets
from glassrl.config import load_config
from glassrl.rl.config import TrainConfig
from glassrl.rl.resolve import resolve

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs" / "algorithms"
PRESETS = presets.rl_names()  # sft and rm are the other trainers' configs
RUN_ELSEWHERE = {"grpo", "ppo"}  # test_trainer_loop.py::test_preset_runs_two_steps

# What makes each preset the algorithm it names (dotted config key -> value).
DEFINING: dict[str, dict[str, object]] = {
    "ppo": {
        "algo.advantage": "gae",
        "algo.policy_loss": "ppo_clip",
        "algo.kl.placement": "reward",
        "algo.whiten_advantages": True,
    },
    "grpo": {
        "algo.advantage": "grpo",
        "algo.policy_loss": "ppo_clip",
        "algo.kl.placement": "loss",
        "algo.kl.kind": "k3",
        "algo.loss_agg": "seq-mean-token-mean",
    },
    "dr_grpo": {"algo.advantage": "dr_grpo", "algo.loss_agg": "seq-mean-token-sum-norm", "algo.kl.placement": "none"},
    "rloo": {
        "algo.advantage": "rloo",
        "algo.policy_loss": "reinforce",
        "algo.kl.placement": "reward",
        "algo.loss_agg": "seq-mean-token-sum",
        "batch.epochs": 1,
    },
    "remax": {
        "algo.advantage": "remax",
        "algo.policy_loss": "reinforce",
        "rollout.n": 1,
        "algo.loss_agg": "seq-mean-token-sum",
        "batch.epochs": 1,
    },
    "reinforce_pp": {
        "algo.advantage": "reinforce_pp",
        "algo.policy_loss": "ppo_clip",
        "algo.kl.placement": "reward",
        "algo.kl.target": None,
    },
    "reinforce_pp_baseline": {
        "algo.advantage": "reinforce_pp_baseline",
        "algo.policy_loss": "ppo_clip",
        "algo.kl.placement": "reward",
    },
    "dapo": {
        "algo.advantage": "grpo",
        "algo.loss_agg": "token-mean",
        "algo.kl.placement": "none",
        "algo.clip_low": 0.2,
        "algo.clip_high": 0.28,
        "algo.dynamic_sampling": True,
    },
    "vapo": {
        "algo.advantage": "gae",
        "algo.critic_lam": 1.0,
        "algo.length_alpha": 2.0,
        "algo.positive_nll_coef": 0.1,
        "algo.loss_agg": "token-mean",
        "algo.clip_high": 0.28,
    },
    "gspo": {
        "algo.advantage": "grpo",
        "algo.policy_loss": "gspo",
        "algo.loss_agg": "seq-mean-token-mean",
        "algo.clip_low": 3e-4,
        "algo.clip_high": 4e-4,
    },
    "cispo": {
        "algo.advantage": "grpo",
        "algo.policy_loss": "cispo",
        "algo.loss_agg": "token-mean",
        "algo.cispo_eps_is_low": 1.0,
    },
    "aspo": {
        "algo.advantage": "grpo",
        "algo.policy_loss": "aspo",
        "algo.loss_agg": "token-mean",
        "algo.dual_clip_c": 3.0,
    },
    "dual_clip_ppo": {
        "algo.advantage": "gae",
        "algo.policy_loss": "dual_clip",
        "algo.dual_clip_c": 3.0,
        "algo.kl.placement": "reward",
        "algo.whiten_advantages": True,
    },
    "ttrl": {
        "algo.advantage": "grpo",
        "reward.sources": [{"name": "majority_vote", "weight": 1.0}],
        "data.test": "task:arith-verify/test",
    },
    "clip_cov": {
        "algo.advantage": "grpo",
        "algo.policy_loss": "clip_cov",
        "algo.clip_cov_r": 2e-4,
        "algo.clip_cov_omega_low": 1.0,
        "algo.clip_cov_omega_high": 5.0,
    },
}

# Metrics the preset's algorithm must emit (besides the common ones checked for all).
EMITS: dict[str, set[str]] = {
    "dr_grpo": {"actor/clip_frac_low", "actor/clip_frac_high"},
    "rloo": {"kl/mean", "kl/beta"},
    "remax": set(),
    "reinforce_pp": {"kl/mean", "kl/beta", "actor/clip_frac_high"},
    "reinforce_pp_baseline": {"kl/mean", "kl/beta", "actor/clip_frac_high"},
    "dapo": {"actor/clip_frac_low", "actor/clip_frac_high"},
    "vapo": {
        "critic/value_loss",
        "critic/vf_clip_frac",
        "critic/explained_variance",
        "returns/mean",
        "actor/positive_nll_loss",
        "actor/clip_frac_high",
    },
    "gspo": {"actor/clip_frac_low", "actor/clip_frac_high"},
    "cispo": {"actor/clip_frac_low", "actor/clip_frac_high"},
    "aspo": {"actor/clip_frac_low", "actor/clip_frac_high", "actor/dual_clip_frac"},
    "dual_clip_ppo": {"actor/dual_clip_frac", "critic/value_loss", "critic/explained_variance", "kl/mean"},
    "ttrl": {"reward/majority_vote/mean", "actor/kl_loss", "kl/mean"},
    "clip_cov": {"actor/cov_clip_frac", "actor/clip_frac_low"},
}

# Overrides a preset needs on top of ``fast`` (4 prompts × 4, mini-batch 2 prompts, micro 4).
EXTRA: dict[str, list[str]] = {
    "remax": ["rollout.n=1", "batch.mini_batch_prompts=4"],  # one sample per prompt, one optimiser step
    "rloo": ["batch.mini_batch_prompts=4"],  # one on-policy optimiser step
    "vapo": ["algo.value_warmup_steps=1"],  # must be < steps = 2: step 1 critic only, step 2 both
}
PARTIAL_CREDIT = "[{name: arith_verify, weight: 1.0, partial_credit: true}]"


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _config(preset: str, overrides=()) -> TrainConfig:
    return load_config(TrainConfig, presets.path(preset), list(overrides))


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _unlabelled(prompt_file: Path, out: Path) -> Path:
    """The prompts of ``prompt_file`` with nothing else: no answer, no metadata (TTRL's data)."""
    rows = [json.loads(line) for line in prompt_file.read_text(encoding="utf-8").splitlines()]
    out.write_text(
        "".join(json.dumps({"prompt": r["prompt"]}, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
    )
    return out


def _run(preset: str, fast: list[str], extra: list[str], tmp_path: Path) -> tuple[list[dict], Path]:
    from glassrl.rl.loop import Trainer

    trainer = Trainer(_config(preset, [*fast, *EXTRA.get(preset, []), *extra]), progress=False)
    trainer.train()
    return _rows(tmp_path / "run"), tmp_path / "run"


# ---------------------------------------------------------------- the YAML files


def test_examples_link_to_the_packaged_presets():
    """One copy of each file: examples/<name>.yaml is a relative symlink into the package."""
    assert sorted(p.stem for p in EXAMPLES.glob("*.yaml")) == presets.names()
    for name in presets.names():
        link = EXAMPLES / f"{name}.yaml"
        assert link.is_symlink() and link.readlink() == Path(f"../src/glassrl/presets/{name}.yaml"), name


def test_the_issue_presets_are_all_here():
    expected = {
        "ppo",
        "grpo",
        "dr_grpo",
        "rloo",
        "remax",
        "reinforce_pp",
        "reinforce_pp_baseline",
        "dapo",
        "vapo",
        "gspo",
        "cispo",
        "aspo",
        "dual_clip_ppo",
        "ttrl",
        "clip_cov",
    }
    assert set(PRESETS) == expected == set(DEFINING)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_has_its_defining_settings(preset):
    cfg = _config(preset)
    resolved = resolve(cfg)  # every size divides; names exist in their registries
    for key, value in DEFINING[preset].items():
        assert _get(cfg, key) == value, key
    a = cfg.algo
    assert cfg.model.actor == "default"
    assert resolved.uses_reference == (a.kl.placement != "none")
    if preset == "ttrl":  # label-free: the training prompts carry no answer and no metadata
        rows = [json.loads(line) for line in (ROOT / cfg.data.train).read_text(encoding="utf-8").splitlines()]
        assert rows and all(set(row) == {"prompt"} for row in rows)
    else:
        assert cfg.data.train == "task:arith-verify"
    if preset in ("dapo", "vapo"):  # clip-higher
        assert a.clip_high > a.clip_low
    if preset == "dapo":
        assert a.overlong is not None and a.overlong.cache_length < a.overlong.max_length <= cfg.rollout.max_new_tokens
    if preset == "vapo":  # value pre-training, decoupled λ, group sampling
        assert 0 < a.value_warmup_steps < cfg.steps and cfg.rollout.n > 1 and resolved.uses_critic
    if preset == "ppo":  # adaptive KL controller in the reward, value clipping (whitening: above)
        assert a.kl.target is not None and a.value_clip is not None and resolved.uses_critic
    if preset in ("rloo", "remax"):  # on-policy REINFORCE: one optimiser step per batch
        assert resolved.optimizer_steps_per_step == 1
    if preset in ("gspo", "cispo", "aspo", "dual_clip_ppo"):  # off-policy updates, where their clips act
        assert resolved.optimizer_steps_per_step > 1


# ---------------------------------------------------------------- two steps on the tiny model


RUN_CASES = [pytest.param(p, [], id=p) for p in PRESETS if p not in RUN_ELSEWHERE]
# DAPO's other three parts (clip-higher, token-mean, overlong shaping) run without dynamic sampling.
RUN_CASES.append(pytest.param("dapo", ["algo.dynamic_sampling=false"], id="dapo-without-dynamic-sampling"))


@pytest.mark.parametrize(("preset", "overrides"), RUN_CASES)
def test_preset_runs_two_steps(preset, overrides, fast, prompt_files, tmp_path):
    from glassrl.ledger import read_jsonl
    from glassrl.report.metrics_doc import undocumented

    extra = [*overrides, "logging.ledger_samples=16"]  # the ledger holds the whole step: groups can be checked
    if preset == "ttrl":
        extra.append(f"data.train={_unlabelled(prompt_files[0], tmp_path / 'unlabelled.jsonl')}")
    else:  # the tiny model's sums are mostly wrong; its verdicts are not: scores (and advantages) differ
        extra.append(f"reward.sources={PARTIAL_CREDIT}")
    rows, run = _run(preset, fast, extra, tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    keys = {k for r in rows for k in r if k != "step"}
    assert undocumented(keys) == []
    assert EMITS[preset] <= keys, EMITS[preset] - keys
    cfg = _config(preset)
    if cfg.algo.kl.placement == "none":
        assert not {"kl/mean", "actor/kl_loss"} & keys  # no reference policy at all
    if not resolve(cfg).uses_critic:
        assert not any(k.startswith("critic/") for k in keys)
    assert math.isfinite(rows[0]["eval/accuracy"]) and math.isfinite(rows[-1]["eval/accuracy"])
    for r in rows[1:]:
        assert math.isfinite(r["reward/mean"])
        losses = [k for k in r if k.endswith("_loss") or k.endswith("grad_norm")]
        assert all(r[k] is not None and math.isfinite(r[k]) for k in losses), {k: r[k] for k in losses}
    trained = [r for r in rows[1:] if "actor/policy_loss" in r]
    assert [r["step"] for r in trained] == ([2] if preset == "vapo" else [1, 2])
    assert rows[-1]["advantage/std"] > 0  # scores differ, so there is something to learn from
    _check_ledger(preset, read_jsonl(run / "ledgers" / "step_000002.jsonl"), rows[-1])


def _valid(response):
    return [t for t in response.tokens if t.response_mask]


def _groups(ledger) -> dict[int, list]:
    groups: dict[int, list] = {}
    for response in ledger.responses:
        groups.setdefault(response.group_id, []).append(response)
    return groups


def _check_ledger(preset: str, ledger, last: dict) -> None:
    """Recompute the preset's advantages (or rewards) from the ledger of step 2."""
    assert len(ledger.responses) == 4 * (1 if preset == "remax" else 4)
    trained = [r for r in ledger.responses if _valid(r)]
    assert trained
    seq = {id(r): sum(t.token_rewards for t in _valid(r)) for r in trained}  # R_i, KL included

    def advantage(r):
        values = {round(t.advantages, 5) for t in _valid(r)}
        assert len(values) == 1  # task-level credit: one advantage per response
        return values.pop()

    if preset == "remax":
        for r in trained:
            assert r.baseline_reward is not None
            assert advantage(r) == pytest.approx(r.score - r.baseline_reward, abs=1e-4)
    if preset in ("rloo", "dr_grpo"):
        for members in _groups(ledger).values():
            live = [r for r in members if _valid(r)]
            total = sum(seq[id(r)] for r in live)
            for r in live:
                if preset == "rloo":
                    expected = seq[id(r)] - (total - seq[id(r)]) / (len(live) - 1)
                else:
                    expected = seq[id(r)] - total / len(live)
                assert advantage(r) == pytest.approx(expected, abs=1e-4)
    if preset in ("reinforce_pp", "reinforce_pp_baseline"):
        for r in trained:  # raw returns: the return-to-go (γ = 1), or the group-centred sequence reward
            valid = _valid(r)
            if preset == "reinforce_pp":
                expected = [sum(u.token_rewards for u in valid[i:]) for i in range(len(valid))]
            else:
                live = [m for m in _groups(ledger)[r.group_id] if _valid(m)]
                expected = [seq[id(r)] - sum(seq[id(m)] for m in live) / len(live)] * len(valid)
            assert [t.returns for t in valid] == pytest.approx(expected, abs=1e-4)
        # the advantages are those returns whitened over every valid token of the step (global)
        returns = torch.tensor([t.returns for r in trained for t in _valid(r)], dtype=torch.float64)
        whitened = (returns - returns.mean()) / (returns.var() + 1e-8).sqrt()
        advantages = [t.advantages for r in trained for t in _valid(r)]
        assert returns.std() > 0.1 and advantages == pytest.approx(whitened.tolist(), rel=1e-3, abs=1e-3)
    if preset == "vapo":  # decoupled GAE: λ_critic = 1, γ = 1 -> the critic's target is the return-to-go
        for r in trained:
            valid = _valid(r)
            for i, t in enumerate(valid):
                assert t.returns == pytest.approx(sum(u.token_rewards for u in valid[i:]), abs=1e-4)
    if preset == "ttrl":  # reward = agreement with the group's most frequent final number
        from glassrl.rewards.verifiers import extract_last_number

        assert last["task/accuracy"] is None  # no answers: nothing to judge during training
        for members in _groups(ledger).values():
            answers = [extract_last_number(r.response) for r in members]
            votes = Counter(a for a in answers if a is not None)
            first = {a: i for i, a in reversed(list(enumerate(answers)))}
            label = max(votes, key=lambda a: (votes[a], -first[a])) if votes else None  # ties: first seen
            for r, a in zip(members, answers):
                assert r.score == (1.0 if a is not None and a == label else 0.0)


def test_dapo_dynamic_sampling_fills_the_step_with_mixed_groups(fast, tmp_path):
    """DAPO (Yu et al. 2025, eq. 11 constraint): every group of the step has mixed outcomes
    (0 < #correct < G), the step is still full, and the trainer reports how much it over-sampled."""
    from glassrl.algos.shaping import overlong_penalty
    from glassrl.ledger import read_jsonl

    # Partial credit (0.5 for the right verdict): the tiny model's sums are all wrong, its verdicts are not.
    overrides = ["logging.ledger_samples=16", "algo.dynamic_sampling_max_rounds=8", f"reward.sources={PARTIAL_CREDIT}"]
    rows, run = _run("dapo", fast, overrides, tmp_path)
    keys = {k for r in rows for k in r}
    assert any("dynamic" in k or "sampl" in k for k in keys), "no dynamic-sampling counter"
    cfg = _config("dapo")
    for step in (1, 2):
        ledger = read_jsonl(run / "ledgers" / f"step_{step:06d}.jsonl")
        assert len(ledger.responses) == 16
        for members in _groups(ledger).values():
            lengths = torch.tensor([r.length for r in members])
            penalty = overlong_penalty(lengths, cfg.algo.overlong.max_length, cfg.algo.overlong.cache_length)
            task = {round(r.score - float(p), 4) for r, p in zip(members, penalty)}  # the verifier's part
            assert len(task) > 1, f"step {step}: a group whose responses all score the same"


# ---------------------------------------------------------------- docs/algorithms

_TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
_CODE_REF = re.compile(r"`((?:algos|rl|rewards)/\w+\.py):([\w.]+)")
_CONFIG_KEY = re.compile(r"`((?:algo|rollout|batch|reward|data|model|actor_optim|critic_optim)\.[\w.]+)`")


def _has_key(dotted: str) -> bool:
    """``dotted`` names a field of TrainConfig (through nested and optional dataclasses)."""
    node = TrainConfig
    for part in dotted.split("."):
        if node is None or part not in {f.name for f in dataclasses.fields(node)}:
            return False
        hint = typing.get_type_hints(node)[part]
        inner = [t for t in typing.get_args(hint) if dataclasses.is_dataclass(t)]  # X | None
        node = hint if dataclasses.is_dataclass(hint) else (inner[0] if inner else None)
    return True


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_page_names_its_config_keys_and_real_tests(preset):
    page = DOCS / f"{preset}.md"
    assert page.is_file(), f"examples/{preset}.yaml has no page {page.relative_to(ROOT)}"
    text = page.read_text(encoding="utf-8")
    assert f"examples/{preset}.yaml" in text
    assert "arXiv" in text  # the paper, by its identifier
    refs = _TEST_REF.findall(text)
    assert "tests/rl/test_rl_presets.py" in {path for path, _ in refs} or preset in RUN_ELSEWHERE
    assert any(path.startswith("tests/algos/") for path, _ in refs)
    for path, name in refs:
        source = ROOT / path
        assert source.is_file(), f"{page.name}: {path} does not exist"
        assert re.search(rf"^\s*def {name}\(", source.read_text(encoding="utf-8"), re.M), (
            f"{page.name}: no test {name} in {path}"
        )
    code = _CODE_REF.findall(text)
    assert code
    for path, dotted in code:  # `algos/losses_clipped.py:gspo`, `rl/loop.py:Trainer.step`
        source = (ROOT / "src" / "glassrl" / path).read_text(encoding="utf-8")
        for name in dotted.split("."):
            assert re.search(rf"^\s*(def|class) {name}\b|^{name}\b.*=", source, re.M), (
                f"{page.name}: no {name} in src/glassrl/{path}"
            )
    keys = set(_CONFIG_KEY.findall(text))
    assert keys
    for key in keys:
        assert _has_key(key), f"{page.name}: `{key}` is not a TrainConfig key"


def test_index_lists_every_page():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    pages = {p.stem for p in DOCS.glob("*.md") if p.stem != "README"}
    assert pages == set(PRESETS)  # no page without its preset
    for preset in PRESETS:
        assert f"({preset}.md)" in index, f"docs/algorithms/README.md does not link {preset}.md"
