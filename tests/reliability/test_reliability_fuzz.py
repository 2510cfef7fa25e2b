"""Fuzz the places where a user types numbers and structure: the config loader (a YAML file and
dotted overrides), ``glassrl explain``'s arguments, and the data files (prompt sets, SFT pairs,
preference pairs: each row then tokenized and, for prompts, encoded as a checkpoint holds it); and
what a tool says back to the model. Every input must end in success or in one GlassrlError line
(exit code 2 for the command): never a traceback, never a multi-line error. A tool's output, and
a call the model writes, must always reach the model as tokens and the ledger as UTF-8 text.

Under CI=true Hypothesis loads its "ci" profile: derandomized, every CI run draws the same examples.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from pathlib import Path

import pytest
import yaml
from harness import ERROR_LINE, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glassrl.agents.formats import build_call_format
from glassrl.agents.tools import FunctionTool, run_call, tool_map
from glassrl.config import load_config
from glassrl.data.datasets import load_prompts
from glassrl.data.formatting import format_prompts
from glassrl.data.preferences import load_preference_file
from glassrl.errors import GlassrlError
from glassrl.models.loading import load_tokenizer
from glassrl.rl.config import TrainConfig
from glassrl.run import codec
from glassrl.supervised.rm import RMConfig, encode_pairs
from glassrl.supervised.sft import SFTConfig, load_pairs, tokenize_pairs

ARGPARSE_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")  # what argparse takes for a negative number
CONFIG_INPUTS = 200  # examples per config test
EXPLAIN_INPUTS = 150
DATA_INPUTS = 150  # per loader
TOOL_INPUTS = 100  # per call format
# Valid JSON or YAML that is not data (issue 32): lone surrogates, nesting past any limit, an
# integer past Python's int-string limit, a date that is no date.
NOT_DATA = ['"\\ud800"', '"a\\udfff b"', "9" * 5001, "[" * 300 + "]" * 300, "[" * 101 + "]" * 101, "2024-13-45"]


def _keys(cls, prefix: str = "") -> list[str]:
    """Every dotted key of a config class, sections included."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        out.append(prefix + f.name)
        section = next(
            (a for a in typing.get_args(hints[f.name]) or (hints[f.name],) if dataclasses.is_dataclass(a)), None
        )
        if section is not None:
            out += _keys(section, f"{prefix}{f.name}.")
    return out


KEYS = sorted({*_keys(TrainConfig), *_keys(SFTConfig), *_keys(RMConfig)})
# Scalars as YAML writes them: the awkward ones (NaN, ±inf, huge, empty, odd strings) included.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, 1, -1, 10**400, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([".nan", ".inf", "-.inf", "nan", "1e400", "1e-3", "", "~", "default", "task:add", "0x10"]),
    st.text(max_size=12),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
KEY = st.one_of(
    st.sampled_from(KEYS),
    st.text(max_size=10),
    st.sampled_from(["", ".", "a..b", "steps.x", "reward.sources.0.weight"]),
)
# A value written in an override: YAML text, valid or not.
RAW = st.one_of(
    SCALARS.map(lambda v: yaml.safe_dump(v, default_flow_style=True).removesuffix("\n...\n").strip()),
    st.text(max_size=16),
    st.sampled_from(["[1,", "{a: 1, a: 2}", "'", '"', "&a", "*b", "!!python/object:os.system", "{", "- x", ": :"]),
    st.sampled_from(NOT_DATA),
)


def _tree(keys_and_values: list[tuple[str, object]]) -> dict:
    tree: dict = {}
    for key, value in keys_and_values:
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:  # absent, or a key given the value None earlier: a section now
                child = node[part] = {}
            node = child if isinstance(child, dict) else {}
        node[parts[-1]] = value
    return tree


def _loads_or_one_line(cls, path: Path | None, overrides: list[str]) -> None:
    try:
        load_config(cls, path, overrides)
    except GlassrlError as err:
        assert "\n" not in str(err).strip(), str(err)


@settings(max_examples=CONFIG_INPUTS, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cls=st.sampled_from([TrainConfig, SFTConfig, RMConfig]),
    body=st.lists(st.tuples(KEY, VALUES), max_size=5),
    overrides=st.lists(st.tuples(KEY, RAW).map(lambda kv: f"{kv[0]}={kv[1]}") | st.text(max_size=12), max_size=3),
)
@pytest.mark.slow
def test_the_config_loader_succeeds_or_says_one_line(cls, body, overrides, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(_tree(body), allow_unicode=True), encoding="utf-8")
    _loads_or_one_line(cls, path, overrides)


@settings(max_examples=CONFIG_INPUTS, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.one_of(
        st.binary(max_size=64),
        st.text(max_size=64).map(str.encode),
        st.tuples(st.sampled_from(KEYS), st.sampled_from(NOT_DATA)).map(lambda kv: f"{kv[0]}: {kv[1]}\n".encode()),
    )
)
def test_any_file_bytes_succeed_or_say_one_line(data, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_bytes(data)
    _loads_or_one_line(TrainConfig, path, [])


# ---------------------------------------------------------------- glassrl explain

NUMBER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-5, max_value=20).map(str),
    st.sampled_from(["nan", "inf", "1e400", "-1e400", "0", "1", "0.5", "x", "", "１", "1_0", "0x1"]),
).filter(lambda s: not s.startswith("-") or ARGPARSE_NEGATIVE.match(s))  # else argparse reads a flag
# flag -> strategy of its values (each a list of strings); the response's length is 1 to 4 tokens.
FLAGS = {
    "--score": st.lists(NUMBER, min_size=1, max_size=1),
    "--token-scores": st.lists(NUMBER, min_size=1, max_size=5),
    "--values": st.lists(NUMBER, min_size=1, max_size=5),
    "--kl": st.lists(NUMBER, min_size=1, max_size=5),
    "--logprobs": st.lists(NUMBER, min_size=1, max_size=5),
    "--ref-logprobs": st.lists(NUMBER, min_size=1, max_size=5),
    "--mask": st.lists(st.sampled_from(["0", "1", "2", "x"]), min_size=1, max_size=5),
    "--step-ends": st.lists(st.sampled_from(["0", "1", "3", "9", "x"]), min_size=1, max_size=3),
    "--step-scores": st.lists(NUMBER, min_size=1, max_size=3),
    "--baseline-reward": st.lists(NUMBER, min_size=1, max_size=1),
    "--gamma": st.lists(NUMBER, min_size=1, max_size=1),
    "--lam": st.lists(NUMBER, min_size=1, max_size=1),
    "--beta": st.lists(NUMBER, min_size=1, max_size=1),
    "--estimator": st.lists(
        st.sampled_from(["gae", "grpo", "rloo", "remax", "reinforce_pp", "nope"]), min_size=1, max_size=1
    ),
    "--kl-kind": st.lists(st.sampled_from(["k1", "k2", "k3", "abs", "k9"]), min_size=1, max_size=1),
    "--legend-response": st.lists(st.sampled_from(["0", "1", "-1", "x"]), min_size=1, max_size=1),
    "--legend-token": st.lists(st.sampled_from(["0", "2", "9", "x"]), min_size=1, max_size=1),
    "--format": st.lists(st.sampled_from(["jsonl", "csv", "markdown"]), min_size=1, max_size=1),
}


@settings(max_examples=EXPLAIN_INPUTS, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tokens=st.lists(st.sampled_from(["是", "的", "2", "！", "a"]), min_size=1, max_size=4),
    flags=st.dictionaries(st.sampled_from(sorted(FLAGS)), st.just(None), max_size=6).flatmap(
        lambda chosen: st.fixed_dictionaries({flag: FLAGS[flag] for flag in chosen})
    ),
)
def test_explain_succeeds_or_says_one_line(tokens, flags, capsys):
    argv = ["explain", "--tokens", *tokens]
    for flag, values in flags.items():
        argv += [flag, *values]
    if "--format" not in flags:
        argv += ["--format", "jsonl"]  # the table's rendering is tested elsewhere; keep examples fast
    rc, _, err = run_cli(capsys, *argv)
    assert rc in (0, 2), (argv, rc, err)
    if rc == 2:
        assert len(err) == 1 and ERROR_LINE.match(err[0]), (argv, err)


# ---------------------------------------------------------------- data files: prompts, SFT pairs, preferences

# Text as JSON can carry it: lone surrogates too (json.dumps writes them as \udXXX escapes).
SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=())  # else rarely drawn
ANY_TEXT = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=12),
    st.tuples(st.text(max_size=4), SURROGATES, st.text(max_size=4)).map("".join),
)
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),  # Python's json reads and writes NaN, Infinity
    ANY_TEXT,
)
JSON_VALUES = st.recursive(
    JSON_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3), max_leaves=8
)
MESSAGES = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool", "x"]), "content": ANY_TEXT}),
    max_size=3,
)
FIELD_NAMES = ["prompt", "answer", "response", "chosen", "rejected", "margin", "metadata"]
ROWS = st.dictionaries(
    st.sampled_from(FIELD_NAMES) | ANY_TEXT, st.one_of(ANY_TEXT, MESSAGES, JSON_VALUES), max_size=6
).map(json.dumps)
LINES = st.one_of(
    ROWS,
    ROWS.map(lambda row: row[:-1] + ', "x": ' + NOT_DATA[len(row) % len(NOT_DATA)] + "}"),
    st.text(max_size=30),
    st.sampled_from(
        ["", "[]", "null", "NaN", "[" * 5000 + "]" * 5000, "{\"prompt\": 1e400}", "{\"margin\": -Infinity}"]
    ),
)


def _prompts(path, tokenizer):
    records = load_prompts(path)
    format_prompts(tokenizer, [r.prompt for r in records])  # what the policy sees
    codec.encode([r.metadata for r in records])  # DAPO's buffer in a checkpoint


def _sft_pairs(path, tokenizer):
    tokenize_pairs(tokenizer, load_pairs(str(path)), max_length=10**6)


def _preferences(path, tokenizer):
    encode_pairs(tokenizer, load_preference_file(path), max_length=10**6)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@settings(max_examples=DATA_INPUTS, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINES, min_size=1, max_size=4))
@pytest.mark.parametrize("read", [_prompts, _sft_pairs, _preferences], ids=["prompts", "sft-pairs", "preferences"])
def test_a_data_file_is_read_or_says_one_line(read, lines, tokenizer, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        read(path, tokenizer)
    except GlassrlError as err:
        assert "\n" not in str(err).strip() and str(err).startswith(str(path)), str(err)


# ---------------------------------------------------------------- what a tool says back


@settings(max_examples=TOOL_INPUTS, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    returned=st.one_of(ANY_TEXT, JSON_VALUES, st.just(10**5000)),  # str(10**5000) raises: an error observation
    arguments=st.one_of(st.dictionaries(st.just("text") | ANY_TEXT, JSON_VALUES, max_size=2), JSON_VALUES),
    name=st.one_of(st.just("echo"), ANY_TEXT),
)
@pytest.mark.parametrize("call_format", ["tagged", "hermes"])
def test_a_tool_output_reaches_the_model_as_tokens(call_format, returned, arguments, name, tokenizer):
    def echo(text: str) -> str:
        """Says something back."""
        return returned

    fmt = build_call_format(tokenizer, call_format)
    body = json.dumps(arguments)  # a lone surrogate as the model would write it: an escape
    written = (
        f"<call>{name} {body}</call>"
        if call_format == "tagged"
        else f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {body}}}</tool_call>'
    )
    calls = fmt.parse(written)
    results = [run_call(tool_map([FunctionTool(echo)]), call, timeout_s=5) for call in calls]
    text, ids = fmt.observation([r.text for r in results])
    assert ids and text.encode("utf-8")
    records = [r.as_dict(c) for r, c in zip(results, calls)]
    json.dumps(records, ensure_ascii=False).encode("utf-8")  # what the ledger writes
