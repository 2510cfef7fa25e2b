"""Rows that are valid JSON but not data (issue 32): a lone unicode surrogate, nesting ~10⁵ deep,
an integer of 5,001 digits. Each is one line naming the file, the row and, where it can, the
field; a tool's output that holds a lone surrogate reaches the model as text (U+FFFD) instead of
stopping the run in the tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import assert_one_error_line

from glassrl.agents.formats import build_call_format
from glassrl.agents.tools import FunctionTool, run_call, tool_map
from glassrl.data.datasets import load_prompts
from glassrl.data.preferences import load_preference_file
from glassrl.errors import GlassrlError
from glassrl.models.loading import load_tokenizer
from glassrl.supervised.sft import load_pairs
from helpers import tiny_run_overrides

GOOD = '{"prompt": "1+1", "answer": "2", "chosen": "2", "rejected": "3", "response": "2"}'
DEEP = "[" * 100_000 + "]" * 100_000
# id -> (the second row of a file whose first row is good, regex of the error)
ROWS = {
    "surrogate-in-prompt": (
        '{"prompt": "1+1\\ud800", "answer": "2"}',
        r":2: field 'prompt': \\ud800 at character 3 is a lone surrogate",
    ),
    "surrogate-in-a-message": (
        '{"prompt": [{"role": "user", "content": "\\udc00"}]}',
        r":2: field 'prompt\[0\]\.content': \\udc00 at character 0 is a lone surrogate",
    ),
    "surrogate-in-a-key": ('{"prompt": "a", "\\ud83d": 1}', r":2: field '\\ud83d': .*lone surrogate"),
    "nested-deep": ('{"prompt": "a", "meta": ' + DEEP + "}", r":2: nested deeper than 64 levels"),
    "nested-below-recursion": (
        '{"prompt": "a", "meta": ' + "[" * 500 + "]" * 500 + "}",
        r":2: nested deeper than 64 levels",
    ),
    "int-5001-digits": ('{"prompt": "a", "n": ' + "9" * 5001 + "}", r":2: an integer of 5001 digits"),
}
LOADERS = {"prompts": load_prompts, "sft-pairs": load_pairs, "preferences": load_preference_file}


def _file(tmp_path: Path, row: str) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text(f"{GOOD}\n{row}\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("case", sorted(ROWS))
def test_a_row_that_is_json_but_not_data_is_one_line(case, loader, tmp_path):
    row, match = ROWS[case]
    if loader != "prompts":  # the fields these loaders read: the same row with theirs
        row = row.replace('"prompt": "a"', '"prompt": "a", "chosen": "b", "rejected": "c", "response": "d"')
    with pytest.raises(GlassrlError, match=r"rows\.jsonl" + match) as err:
        LOADERS[loader](str(_file(tmp_path, row)))
    assert "\n" not in str(err.value)


def test_a_preference_margin_must_be_finite(tmp_path):
    path = _file(tmp_path, '{"prompt": "a", "chosen": "b", "rejected": "c", "margin": 1e400}')
    with pytest.raises(GlassrlError, match=r'rows\.jsonl:2: field "margin" must be a finite number, got inf'):
        load_preference_file(path)


def test_each_command_says_one_line(capsys, tmp_path, tiny_model_dir, prompt_files):
    """The issue's probe end to end: a TypeError from the tokenizer before."""
    bad = _file(tmp_path, '{"prompt": "1+1\\ud800", "answer": "2", "chosen": "b", "rejected": "c", "response": "d"}')
    run = tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "run")
    assert_one_error_line(capsys, ["train", "grpo", *run, f"data.train={bad}"], r"rows\.jsonl:2: field 'prompt'")
    sft = ["sft", "sft", f"model={tiny_model_dir}", f"output_dir={tmp_path / 'sft'}", f"eval_data={bad}"]
    assert_one_error_line(capsys, [*sft, f"data={bad}"], r"rows\.jsonl:2: field 'prompt': .*lone surrogate")
    rm = ["rm", "rm", f"model={tiny_model_dir}", f"output_dir={tmp_path / 'rm'}", f"eval_data={bad}"]
    assert_one_error_line(capsys, [*rm, f"data={bad}"], r"rows\.jsonl:2: field 'prompt': .*lone surrogate")


def echo(text: str) -> str:
    """Says the text back, with a lone surrogate of its own."""
    return f"got {text}!\udfff"


@pytest.mark.parametrize("call_format", ["tagged", "hermes"])
def test_a_tool_output_with_a_lone_surrogate_reaches_the_model_as_text(call_format, tiny_model_dir):
    """A model can write a lone surrogate into a call (a JSON escape) and a tool can return one: the
    observation holds U+FFFD where each stood, as bytes decoded with errors="replace" would."""
    fmt = build_call_format(load_tokenizer(tiny_model_dir), call_format)
    written = {
        "tagged": '<call>echo {"text": "\\ud800"}</call>',
        "hermes": '<tool_call>{"name": "echo", "arguments": {"text": "\\ud800"}}</tool_call>',
    }[call_format]
    (call,) = fmt.parse(written)
    result = run_call(tool_map([FunctionTool(echo)]), call, timeout_s=5)
    assert result.status == "ok" and result.text == "got \ufffd!\ufffd"
    text, ids = fmt.observation([result.text])
    assert "got \ufffd!\ufffd" in text and ids
