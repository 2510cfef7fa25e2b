"""TRL's and verl's names: each answered with real glassrl keys, each in docs/trl-verl.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from glassrl.config import describe, load_config
from glassrl.errors import GlassrlError
from glassrl.rl.config import TrainConfig
from glassrl.rl.foreign_names import TRL, VERL

DOC = (Path(__file__).resolve().parents[2] / "docs" / "trl-verl.md").read_text(encoding="utf-8")
KEYS = {option.key for option in describe(TrainConfig)}
DOTTED = re.compile(r"\b[a-z_]+(?:\.(?:[a-z_0-9]+|\*|N))+")


def _is_key(key: str) -> bool:
    key = re.sub(r"\.(?:N|\d+|\*)(?=\.|$)", "", key)  # a list element or every key of a section
    return key in KEYS or any(k.startswith(key + ".") for k in KEYS) or key.startswith("reward.sources")


@pytest.mark.parametrize("name", sorted({**TRL, **VERL}))
def test_each_hint_names_real_keys_and_the_docs_list_the_name(name):
    hint = {**TRL, **VERL}[name]
    # the glassrl keys it names (not files, not the foreign name itself), a top-level one too ("steps")
    named = [k for k in DOTTED.findall(hint) if not k.endswith((".md", ".py")) and not k.startswith(name)]
    named += [word for word in re.findall(r"^[a-z_]+\b(?!\.)", hint) if word in KEYS]
    assert hint.startswith("no such key") or named, hint
    assert all(_is_key(k) for k in named), (name, [k for k in named if not _is_key(k)])
    assert f"`{name}" in DOC or f"{name}`" in DOC or f".{name}`" in DOC, name


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("num_generations=8", "did you mean rollout.n?"),
        ("beta=0.04", "did you mean algo.kl.coef?"),
        ("loss_type=dr_grpo", "did you mean algo.loss_agg?"),
        ("data.train_batch_size=64", "did you mean batch.prompts_per_step?"),
        ("actor_rollout_ref.rollout.n=8", "did you mean model.actor, rollout.*"),
        ("sync_ref_model=true", "algo.kl.ref_sync_every"),
    ],
)
def test_an_unknown_trl_or_verl_key_says_the_glassrl_one(override, hint):
    with pytest.raises(GlassrlError, match=re.escape(hint) + r".*docs/trl-verl\.md\); valid keys here"):
        load_config(TrainConfig, None, [override])


def test_a_near_miss_still_gets_the_nearest_key():
    with pytest.raises(GlassrlError, match=r"unknown key algo\.lamb \(did you mean algo\.lam\?\)"):
        load_config(TrainConfig, None, ["algo.lamb=0.9"])
