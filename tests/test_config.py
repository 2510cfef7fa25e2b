"""glassrl.config: YAML + dotted overrides into typed dataclasses, errors that name the key."""

from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
import yaml

from glassrl.config import (
    Option,
    describe,
    field_help,
    flatten,
    knob_set,
    load_config,
    load_saved_config,
    option,
    to_dict,
    type_text,
    value_text,
)
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
        GlassrlError,
        match=r"c.yaml: unknown key optim.lrr \(did you mean optim.lr\?\); "
        r"valid keys here: optim.lr, optim.warmup_steps",
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


def test_a_typo_on_the_command_line_is_a_command_line_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 3\noptim:\n  lr: 0.5\n")
    with pytest.raises(GlassrlError, match=r"^command line: unknown key optim\.lrr \(did you mean optim\.lr\?\)"):
        load_config(Cfg, path, ["optim.lrr=1"])
    with pytest.raises(GlassrlError, match=r"^command line: unknown key sede \(did you mean seed\?\)"):
        load_config(Cfg, path, ["sede=1"])
    # a bad value names where it came from: the override that set it, else the file
    with pytest.raises(GlassrlError, match=r"^command line: optim\.lr must be a number, got 'fast'$"):
        load_config(Cfg, path, ["optim.lr=fast"])
    path.write_text("optim:\n  lr: fast\n")
    with pytest.raises(GlassrlError, match=r"c\.yaml: optim\.lr must be a number"):
        load_config(Cfg, path, ["seed=1"])
    load_config(Cfg, path, ["optim.lr=0.1"])  # the override replaces the file's bad value
    with pytest.raises(GlassrlError, match=r"^command line: tags: '\[x' is not a YAML value"):
        load_config(Cfg, None, ["tags=[x"])


@dataclass
class Listed:
    sources: list[dict[str, Any]] = field(default_factory=lambda: [{"name": "a", "weight": 1.0}])
    files: str | list[str] = "x.jsonl"


def test_list_elements_are_overridable(tmp_path):
    # the default list: one key of its first element changes, the others stay
    assert load_config(Listed, None, ["sources.0.weight=2"]).sources == [{"name": "a", "weight": 2}]
    # the file's list; its length appends an element, built by the following overrides
    path = tmp_path / "c.yaml"
    path.write_text("sources:\n  - {name: a, weight: 1.0}\n  - {name: b, weight: 0.5}\nfiles: [p.jsonl, q.jsonl]\n")
    cfg = load_config(Listed, path, ["sources.1.weight=0", "sources.2.name=c", "sources.2.weight=3", "files.0=r.jsonl"])
    assert cfg.sources == [{"name": "a", "weight": 1.0}, {"name": "b", "weight": 0}, {"name": "c", "weight": 3}]
    assert cfg.files == ["r.jsonl", "q.jsonl"]
    with pytest.raises(GlassrlError, match=r"^command line: sources\.5\.weight: sources is a list of 2; index it"):
        load_config(Listed, path, ["sources.5.weight=1"])
    with pytest.raises(GlassrlError, match=r"sources\.first\.weight: sources is a list of 2; index it with 0 to 1"):
        load_config(Listed, path, ["sources.first.weight=1"])


@dataclass
class Tracked:
    seed: int = 0
    optim: Optim | None = None


def test_an_optional_section_takes_true_for_its_defaults_and_false_for_off():
    assert load_config(Tracked, None, ["optim=true"]).optim == Optim()
    assert load_config(Tracked, None, ["optim.lr=0.5"]).optim == Optim(lr=0.5)
    assert load_config(Tracked, None, ["optim=false"]).optim is None
    assert load_config(Tracked, None, ["optim=true", "optim=null"]).optim is None


def test_a_file_with_every_key_counts_as_written_only_where_it_differs_from_the_default(tmp_path):
    """A run's own config.yaml: its keys say nothing about what the user chose; overrides still do."""
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(to_dict(Checked(seed=4)) | {"seen": []}))
    cfg = load_config(Checked, saved, ["optim.warmup_steps=0"])
    assert cfg.seen == [frozenset({"seed", "optim", "optim.warmup_steps"})]
    # a file that leaves a key out is the user's: every key it has counts
    partial = tmp_path / "partial.yaml"
    partial.write_text("seed: 0\noptim: {lr: 1.0e-4}\n")
    assert load_config(Checked, partial).seen == [frozenset({"seed", "optim", "optim.lr"})]


def test_flatten():
    assert flatten({"a": {"b": 1, "c": {"d": None}}, "e": [1, {"f": 2}], "g": {}}) == {
        "a.b": 1,
        "a.c.d": None,
        "e": [1, {"f": 2}],
        "g": {},
    }


@dataclass
class Documented:
    """A docstring is not a field's help."""

    lr: float = option(1e-3, help="peak learning rate")
    mode: Literal["fast", "slow"] = option(
        "fast",
        help="how to go: a help too long for one line is written as strings side by side, which Python joins into one",
    )
    optim: Optim | None = option(None, help="the optimiser; null = none")
    undocumented: int = 0
    title = "not a field"  # a class attribute
    given: list[int] = option(factory=lambda: [1], help="a mutable default, made by a factory")


def test_field_help_is_each_options_help():
    assert field_help(Documented) == {
        "lr": "peak learning rate",
        "mode": "how to go: a help too long for one line is written as strings side by side, "
        "which Python joins into one",
        "optim": "the optimiser; null = none",
        "undocumented": "",
        "given": "a mutable default, made by a factory",
    }
    assert Documented().given == [1] and Documented().given is not Documented().given


def test_describe_lists_every_option_with_type_value_and_help():
    rows = describe(Documented)
    assert rows == [
        Option("lr", "float", "0.001", "peak learning rate", False),
        Option("mode", '"fast" | "slow"', "fast", rows[1].help, False),
        Option("optim", "section | null", "null", "the optimiser; null = none", True),
        Option("optim.lr", "float", "0.0001", "", False),  # what optim=true would give
        Option("optim.warmup_steps", "int", "0", "", False),
        Option("undocumented", "int", "0", "", False),
        Option("given", "list[int]", "[1]", "a mutable default, made by a factory", False),
    ]
    given = describe(Documented, Documented(lr=0.5, optim=Optim(warmup_steps=3)))
    assert [(r.key, r.value) for r in given if r.key in ("lr", "optim", "optim.warmup_steps")] == [
        ("lr", "0.5"),
        ("optim", ""),
        ("optim.warmup_steps", "3"),
    ]


@pytest.mark.parametrize(
    ("hint", "text"),
    [
        (int, "int"),
        (float | None, "float | null"),
        (str | list[str], "str | list[str]"),
        (Literal["reward", "loss"], '"reward" | "loss"'),
        (list[dict[str, Any]], "list[mapping]"),
        (Optim | None, "section | null"),
    ],
)
def test_type_text(hint, text):
    assert type_text(hint) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "null"),
        (True, "true"),
        (1e-5, "1e-05"),
        (0.2, "0.2"),
        (3, "3"),
        ("task:add", "task:add"),
        ("", "''"),
        ([{"name": "a", "weight": 1.0}], "[{name: a, weight: 1.0}]"),
        ([], "[]"),
    ],
)
def test_value_text(value, text):
    assert value_text(value) == text
    assert yaml.safe_load(text) == value or isinstance(value, float)  # YAML 1.1 reads 1e-05 as text


def test_a_section_given_in_part_keeps_its_default_in_the_parent_not_the_class_default():
    # SFTConfig's optimiser defaults to warm-up 10 and cosine, TrainConfig's critic to lr 1e-4:
    # one key of the section set must not send the others back to OptimConfig's own defaults.
    from glassrl.rl.config import TrainConfig
    from glassrl.supervised.sft import SFTConfig

    sft = load_config(SFTConfig, None, ["optim.lr=1e-3"])
    assert (sft.optim.lr, sft.optim.warmup_steps, sft.optim.decay) == (1e-3, 10, "cosine")
    train = load_config(TrainConfig, None, ["algo.advantage=gae", "critic_optim.grad_clip=0.5"])
    assert (train.critic_optim.lr, train.critic_optim.grad_clip) == (1e-4, 0.5)
    ray = load_config(TrainConfig, None, ["trainer.backend=ray", "ray.actor.resources={GPU: 1}"])
    assert ray.ray.actor.resources == {"GPU": 1}  # a mapping is replaced, not merged
