"""glassrl.config: YAML + dotted overrides into typed dataclasses, errors that name the key."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from glassrl.config import load_config, to_dict
from glassrl.errors import GlassrlError


@dataclass
class Optim:
    lr: float = 1e-4
    warmup_steps: int = 0


@dataclass
class Cfg:
    seed: int = 0
    name: str = "run"
    mode: Literal["a", "b"] = "a"
    tags: list[str] = field(default_factory=list)
    critic: str | None = None
    optim: Optim = field(default_factory=Optim)


def test_defaults_file_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 3\noptim:\n  lr: 0.5\n")
    cfg = load_config(Cfg, path, ["optim.warmup_steps=7", "tags=[x, y]", "critic=null"])
    assert cfg == Cfg(seed=3, optim=Optim(lr=0.5, warmup_steps=7), tags=["x", "y"])
    assert to_dict(cfg)["optim"] == {"lr": 0.5, "warmup_steps": 7}


def test_exponent_without_dot_is_a_float():
    # YAML 1.1 reads 1e-3 as a string; a float field must still take it.
    assert load_config(Cfg, None, ["optim.lr=1e-3"]).optim.lr == 1e-3


def test_unknown_key_lists_valid_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lrr: 1\n")
    with pytest.raises(
        GlassrlError, match=r"c.yaml: unknown key optim.lrr; valid keys here: optim.lr, optim.warmup_steps"
    ):
        load_config(Cfg, path)


@pytest.mark.parametrize(
    "override, message",
    [
        ("seed=1.5", "seed must be an integer"),
        ("seed=true", "seed must be an integer"),
        ("optim.lr=fast", "optim.lr must be a number"),
        ("mode=c", "mode='c' is not one of 'a', 'b'"),
        ("tags=x", "tags must be a list"),
        ("seed", "expected dotted.key=value"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(GlassrlError, match=message):
        load_config(Cfg, None, [override])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(GlassrlError, match="config file not found"):
        load_config(Cfg, tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(GlassrlError, match="top level must be a mapping"):
        load_config(Cfg, bad)
