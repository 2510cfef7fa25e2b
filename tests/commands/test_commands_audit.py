"""glassrl audit from the command line: a bundled task passes (exit 0); a user's tools file and chat
template that break re-rendering fail (exit 1) with the offending token; bad input is one line (exit 2)."""

from __future__ import annotations

import json

from glassrl.cli import main

TEMPLATE = (
    "<|bos|>{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{{ m['content'] }}<|eos|>"
    "{% elif m['role'] == 'tool' %}<|user|>Result: {{ m['content'] }}"
    "{% else %}<|user|>{{ m['content'] }}{% if tools %} tools: {{ tools | length }}{% endif %}{% endif %}"
    "{% endfor %}"
)
TOOLS = '''
def look() -> str:
    """Look around."""
    return "Y"
'''


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_bundled_task_passes(tiny_model_dir, tmp_path, capsys):
    script = _write(tmp_path / "script.json", json.dumps(["<call>calculator 1+2</call>", "3"]))
    argv = ["audit", "grpo", "data.train=task:tool-add", f"model.actor={tiny_model_dir}", "rollout.max_new_tokens=200"]
    assert main([*argv, "--script", script, "--episodes", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "render        2/2   ok   re-rendering the context reproduces the sampled and observation ids"
    assert len(out) == 10  # the heading and one line per check (calls: the format's round trip)
    assert out[9].startswith("calls         2/2   ok")


def test_a_user_tool_that_merges_with_the_next_turn_fails(tiny_model_dir, tmp_path, capsys):
    tools = _write(tmp_path / "my_tools.py", TOOLS)
    template = _write(tmp_path / "template.jinja", TEMPLATE)
    prompts = _write(tmp_path / "prompts.jsonl", json.dumps({"prompt": "go"}) + "\n")
    call = '<tool_call>{"name": "look", "arguments": {}}</tool_call>'
    script = _write(tmp_path / "script.json", json.dumps([call, "es"]))
    argv = [
        "audit",
        "grpo",
        f"data.train={prompts}",
        f"model.actor={tiny_model_dir}",
        f"rollout.agent.tools=[{tools}:look]",
        "rollout.agent.call_format=hermes",
        "rollout.max_new_tokens=200",
    ]
    assert main([*argv, "--script", script, "--chat-template", template, "--episodes", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("render        0/1   FAIL")
    assert out[-1] == (
        "episode 0 (2 turns, stop) render: re-rendered as 'Yes', context has position 64 ('Y') "
        "in 'Result: ⟦Y⟧es⟪<|eos|>⟫': "
        "the texts of turn 0's observation and turn 1 (generated) merge where they meet when encoded in one piece"
    )


def test_bad_input_is_one_line(tiny_model_dir, tmp_path, capsys):
    bad = _write(tmp_path / "script.json", '{"turns": 1}')
    assert main(["audit", "grpo", "data.train=task:tool-add", "--script", bad]) == 2
    assert (
        capsys.readouterr().err
        == f"glassrl audit: error: --script: {bad}: expected a non-empty JSON list of turn texts\n"
    )
    assert main(["audit", "grpo", f"model.actor={tiny_model_dir}", "--script", bad.replace("script", "nothing")]) == 2
    assert "--script: no file" in capsys.readouterr().err
    script = _write(tmp_path / "ok.json", '["3"]')
    assert main(["audit", "grpo", f"model.actor={tiny_model_dir}", "--script", script]) == 2
    assert capsys.readouterr().err.startswith(
        "glassrl audit: error: not a multi-turn run: set rollout.agent.environment"
    )
