"""data.train as one source or a weighted mixture: parsing, defaults, errors naming the entry."""

from __future__ import annotations

import pytest

from glassrl.data.sources import Source, parse_sources, probabilities
from glassrl.errors import GlassrlError

DEFAULTS = Source("", prompt_key="question", answer_key="answer")


def test_a_path_is_one_source_with_the_default_keys():
    assert parse_sources("data/gsm8k.jsonl", "data.train", DEFAULTS) == [
        Source("data/gsm8k.jsonl", 1.0, "question", "answer", None, "data.train")
    ]


def test_a_mixture_keeps_weights_and_each_entrys_own_keys():
    entries = [
        {"path": "data/gsm8k.jsonl", "weight": 3},
        {"path": "data/verl.parquet", "weight": 1, "prompt_key": "prompt", "answer_key": "reward_model.ground_truth"},
        {"path": "task:arith-verify", "metadata_keys": ["lang"]},
    ]
    sources = parse_sources(entries, "data.train", DEFAULTS)
    assert [(s.path, s.weight, s.prompt_key, s.answer_key, s.metadata_keys, s.key) for s in sources] == [
        ("data/gsm8k.jsonl", 3.0, "question", "answer", None, "data.train[0]"),
        ("data/verl.parquet", 1.0, "prompt", "reward_model.ground_truth", None, "data.train[1]"),
        ("task:arith-verify", 1.0, "question", "answer", ("lang",), "data.train[2]"),
    ]
    assert probabilities(sources) == [0.6, 0.2, 0.2]


@pytest.mark.parametrize(
    "value, message",
    [
        ([], "data.train = []: expected a path or a non-empty list"),
        (["a.jsonl"], "data.train[0] = 'a.jsonl': expected a mapping {path, weight}"),
        ([{"weight": 1}], "data.train[0].path = None: expected a dataset path"),
        ([{"path": "a.jsonl", "weight": 0}], "data.train[0].weight = 0: must be a number > 0"),
        ([{"path": "a.jsonl"}, {"path": "b.jsonl", "weight": "x"}], "data.train[1].weight = 'x': must be a number > 0"),
        ([{"path": "a.jsonl", "wieght": 2}], "data.train[0].wieght: unknown key; valid: path, weight, prompt_key"),
        ([{"path": "a.jsonl", "prompt_key": 3}], "data.train[0].prompt_key = 3: expected a field name"),
        ([{"path": "a.jsonl", "metadata_keys": "lang"}], "data.train[0].metadata_keys = 'lang': expected a list"),
    ],
)
def test_bad_entries_name_the_entry_and_key(value, message):
    with pytest.raises(GlassrlError) as info:
        parse_sources(value, "data.train", DEFAULTS)
    assert str(info.value).startswith(message)


def test_the_config_check_rejects_a_bad_mixture():
    from glassrl.config import load_config
    from glassrl.rl.config import TrainConfig

    with pytest.raises(GlassrlError, match=r"data.train\[1\].weight = -1: must be a number > 0"):
        load_config(TrainConfig, None, ["data.train=[{path: a.jsonl}, {path: b.jsonl, weight: -1}]"])
    cfg = load_config(TrainConfig, None, ["data.train=[{path: a.jsonl}, {path: task:add, weight: 2}]"])
    assert cfg.data.train == [{"path": "a.jsonl"}, {"path": "task:add", "weight": 2}]
