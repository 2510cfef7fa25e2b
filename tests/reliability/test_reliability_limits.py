"""Inputs too deep and outputs too large (issue 33, item 8): a config or a data file nested deeper
than anyone writes is one line, not a RecursionError; a reward function that floods stdout reaches
the terminal capped."""

from __future__ import annotations

import textwrap
import time

import pytest
from harness import assert_one_error_line

from glassrl.data.records import PromptRecord
from glassrl.jsonl import MAX_NESTING
from glassrl.rewards import RewardRequest, UserFunctionSource
from glassrl.rewards.timeout import MAX_OUTPUT_BYTES
from helpers import tiny_run_overrides

DEEP = 5000  # yaml and json both raised RecursionError


@pytest.mark.parametrize(
    ("where", "match"),
    [
        ("file", r"deep\.yaml: not valid YAML: nested deeper than 64 levels"),
        ("override", r"algo: '\[\[\[.*' is not a YAML value: nested deeper than 64 levels"),
        ("file-65", r"deep\.yaml: not valid YAML: nested deeper than 64 levels"),  # loads, but deeper than 64
    ],
    ids=["file", "override", "file-65"],
)
def test_a_config_nested_too_deep_is_one_line(where, match, capsys, tmp_path):
    depth = MAX_NESTING + 1 if where == "file-65" else DEEP
    value = "[" * depth + "]" * depth
    (tmp_path / "deep.yaml").write_text(f"steps: 1\nalgo: {value}\n")
    argv = ["train", str(tmp_path / "deep.yaml")] if where.startswith("file") else ["train", "grpo", f"algo={value}"]
    assert_one_error_line(capsys, argv, match)


def test_a_data_file_nested_too_deep_is_one_line(capsys, tmp_path, tiny_model_dir, prompt_files):
    deep = '{"prompt": "1+1", "answer": "2", "meta": ' + "[" * DEEP + "]" * DEEP + "}"
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "2+2", "answer": "4"}\n' + deep + "\n")
    run = tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "run")
    argv = ["train", "grpo", *run, f"data.train={tmp_path / 'prompts.jsonl'}"]
    assert_one_error_line(capsys, argv, r"prompts\.jsonl:2: nested deeper than 64 levels")


CHATTY = """
import os, subprocess, sys

def chatty(prompt, response, answer, metadata):
    print("o" * 3_000_000, flush=True)
    os.write(2, b"e" * 3_000_000)
    subprocess.run([sys.executable, "-c", "import os; os.write(1, b'c' * 3_000_000)"], check=True)
    return 1.0
"""


def test_a_reward_that_floods_its_output_reaches_the_terminal_capped(tmp_path, monkeypatch, capfd):
    """Was: 9 MB printed by one call went to the trainer's terminal and logs as they were."""
    (tmp_path / "glassrl_chatty_reward.py").write_text(textwrap.dedent(CHATTY))
    monkeypatch.syspath_prepend(str(tmp_path))
    source = UserFunctionSource("glassrl_chatty_reward:chatty", style="glassrl", timeout_s=60.0)
    (result,) = source.score([RewardRequest("p", "r", PromptRecord("p", "a", {}, "t#0"))])
    assert result.status == "ok" and result.score == 1.0
    out = err = ""
    note = f"[glassrl: a reward call wrote more than {MAX_OUTPUT_BYTES} bytes here; the rest is dropped]"
    end = time.monotonic() + 60  # the worker passes its output on from a thread of its own
    while time.monotonic() < end and not (note in out and note in err):
        more = capfd.readouterr()
        out, err = out + more.out, err + more.err
        time.sleep(0.1)
    for text in (out, err):
        assert note in text and len(text) < MAX_OUTPUT_BYTES + 500
    assert out.count("c") < 200  # the child's output shared the call's budget, spent by then
