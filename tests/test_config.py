"""glassrl.config: YAML + dotted overrides into typed dataclasses, errors that name the key."""

from dataclasses import dataclass, field
from typing import Literal

import pytest
import yaml

from glassrl.config import knob_set, load_config, load_saved_config, to_dict
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


def test_unknown_key_suggests_the_section_that_has_it():
    with pytest.raises(GlassrlError, match=r"unknown key lr \(did you mean optim\.lr\?\); valid keys here: seed, "):
        load_config(Cfg, None, ["lr=1e-3"])


@dataclass
class Checked:
    """A config with a validate step: records what the loader passed to it."""

    seed: int = 0
    optim: Optim = field(default_factory=Optim)
    seen: list = field(default_factory=list)

    def validate(self, written):
        self.seen.append(written)
        if self.seed < 0:
            raise GlassrlError(f"seed = {self.seed}: must be >= 0")


def test_the_loader_validates_with_the_keys_the_user_wrote(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 0.5\n")
    cfg = load_config(Checked, path, ["seed=2"])
    assert cfg.seen == [frozenset({"optim", "optim.lr", "seed"})]
    with pytest.raises(GlassrlError, match="seed = -1: must be >= 0"):
        load_config(Checked, path, ["seed=-1"])
    # a file glassrl wrote holds every key: its knobs are judged by value, not by presence
    saved = tmp_path / "saved.yaml"
    saved.write_text(yaml.safe_dump(to_dict(cfg) | {"seen": []}))
    assert load_saved_config(Checked, saved).seen[-1] is None


def test_knob_set_by_writing_or_by_value():
    cfg = Cfg(seed=0, critic="c", optim=Optim(lr=0.5))
    written = frozenset({"seed", "optim", "optim.warmup_steps"})
    # written: a key counts when the user wrote it (or a key under it), whatever its value; null never counts
    assert knob_set(cfg, "seed", written) and knob_set(cfg, "optim", written)
    assert knob_set(cfg, "optim.warmup_steps", written) and not knob_set(cfg, "optim.lr", written)
    assert not knob_set(cfg, "critic", written) and not knob_set(Cfg(), "critic", {"critic"})
    # not known (a config built in Python): a key counts when it differs from the default
    assert not knob_set(cfg, "seed", None) and knob_set(cfg, "optim.lr", None) and knob_set(cfg, "critic", None)
    assert not knob_set(cfg, "optim.warmup_steps", None) and knob_set(cfg, "optim", None)
