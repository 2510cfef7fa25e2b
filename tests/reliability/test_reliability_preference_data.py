"""Data that trains nothing or says two things (issue 37, Low): preference pairs whose chosen and
rejected are the same, or empty, are named (a warning; every pair the same: refused); a data row
holding a JSON key twice is one line naming the file and line, not the last value kept silently."""

from __future__ import annotations

import json

import pytest
from harness import assert_one_error_line, run_cli

from glassrl.data.datasets import load_prompts
from glassrl.data.preferences import degenerate_labelled, degenerate_pairs, load_labelled, load_preference_file
from glassrl.data.records import LabelledResponse, PreferencePair
from glassrl.errors import GlassrlError
from glassrl.supervised.sft import load_pairs


def _pairs(*rows: tuple[str, str]) -> list[PreferencePair]:
    return [PreferencePair("1+1=", c, r, source=f"p.jsonl:{i}") for i, (c, r) in enumerate(rows, start=1)]


def test_pairs_that_teach_nothing_are_named():
    line = degenerate_pairs(_pairs(("2", "3"), ("2", "2"), ("", "3"), ("4", "4")), "data")
    assert line == (
        "glassrl: warning: data: 2 of 4 pairs have chosen == rejected (no gradient) (first: p.jsonl:2); "
        "1 of 4 pairs have an empty response (first: p.jsonl:3)"
    )
    assert degenerate_pairs(_pairs(("2", "3")), "data") is None


def test_every_pair_the_same_is_refused():
    with pytest.raises(GlassrlError, match=r"^eval_data: every pair's chosen and rejected responses are the same"):
        degenerate_pairs(_pairs(("2", "2"), ("", "")), "eval_data")


def test_a_response_labelled_both_ways_is_named():
    examples = [
        LabelledResponse("1+1=", "2", True, "k.jsonl:1"),
        LabelledResponse("1+1=", "2", False, "k.jsonl:2"),
        LabelledResponse("1+1=", "3", False, "k.jsonl:3"),
    ]
    assert degenerate_labelled(examples, "data") == (
        "glassrl: warning: data: 1 of 3 examples have a response labelled both desirable and undesirable "
        "(first: k.jsonl:1)"
    )


def _write(path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_dpo_and_rm_say_so(tiny_model_dir, tmp_path, capsys):
    same = _write(tmp_path / "same.jsonl", [{"prompt": "1+1=", "chosen": "2", "rejected": "2"}] * 4)
    mixed = _write(tmp_path / "mixed.jsonl", [{"prompt": "1+1=", "chosen": c, "rejected": "3"} for c in ("2", "3")])
    for command in ("dpo", "rm"):
        argv = [command, command, f"model={tiny_model_dir}", f"output_dir={tmp_path / command}", "steps=1"]
        argv += ["use_margin=false"] if command == "rm" else []  # the preset's margins: none in these rows
        assert_one_error_line(
            capsys,
            [*argv, f"data={same}", f"eval_data={mixed}"],
            rf"^glassrl {command}: error: "
            r"data: every pair's chosen and rejected responses are the same \(first: .*same\.jsonl:1\)",
        )
        rc, out, err = run_cli(capsys, *argv, f"data={mixed}", f"eval_data={mixed}", "batch_size=2")
        assert rc == 0, err
        assert "glassrl: warning: data: 1 of 2 pairs have chosen == rejected (no gradient) (first: " in out


ROW = '{"prompt": "1+1=", "chosen": "2", "rejected": "3", "response": "2", "completion": "2", "label": true}'


@pytest.mark.parametrize("loader", [load_prompts, load_pairs, load_preference_file, load_labelled])
def test_a_key_given_twice_is_one_line_naming_file_and_line(tmp_path, loader):
    path = tmp_path / "rows.jsonl"
    path.write_text(ROW + "\n" + ROW.replace('"chosen": "2"', '"chosen": "2", "chosen": "4"') + "\n", "utf-8")
    with pytest.raises(GlassrlError, match=r"rows\.jsonl:2: the key 'chosen' is given twice in one object"):
        loader(str(path))


def test_kto_eval_data_in_kto_form_is_read(tiny_model_dir, tmp_path, capsys):
    """Held-out rows in KTO's own form (prompt, completion, label) failed as 'missing field "chosen"';
    they are evaluated with the metrics KTO trains with."""
    rows = [
        {"prompt": f"{a}+1=", "completion": str(a + 1 + (k % 2)), "label": k % 2 == 0} for k, a in enumerate(range(6))
    ]
    kto = _write(tmp_path / "kto.jsonl", rows)
    argv = ["dpo", "kto", f"model={tiny_model_dir}", f"data={kto}", f"eval_data={kto}", f"output_dir={tmp_path / 'k'}"]
    rc, _, err = run_cli(capsys, *argv, "steps=2", "batch_size=4")
    assert rc == 0, err
    last = json.loads((tmp_path / "k" / "metrics.jsonl").read_text().splitlines()[-1])
    keys = {"loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "kl", "logps/chosen", "logps/rejected"}
    assert {f"eval/{k}" for k in keys} <= set(last) and "eval/rewards/accuracies" not in last
    assert all(isinstance(last[f"eval/{k}"], float) for k in keys)
