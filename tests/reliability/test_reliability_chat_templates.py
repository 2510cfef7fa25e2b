"""Chat templates are rendered within bounds (issue 45, item 3): a template that would allocate
without end, one that reaches Python's internals and one Jinja cannot parse are each one line;
real templates render to the same text as transformers' apply_chat_template."""

from __future__ import annotations

import copy
import json

import pytest
from harness import assert_one_error_line

from glassrl.data import chat_template
from glassrl.data.chat_template import render_chat, use_template
from glassrl.errors import GlassrlError
from glassrl.models.default_tokenizer import CHAT_TEMPLATE, build_tokenizer
from helpers import QWEN25_TEMPLATE, QWEN_LIKE

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "4821+975=?"},
    {"role": "assistant", "content": "5796"},
    {"role": "user", "content": "and 1+1?"},
]
TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "adds",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
# the issue's three inputs -> the error each is answered with
HOSTILE = {
    "allocates": ("{{ 'x' * 10**10 }}", r"stopped at a bound of chat templates: '\*' would build more than 16777216"),
    "internals": ("{{ cycler.__init__.__globals__ }}", r"reaches what a chat template may not: .*'__init__'"),
    "syntax": ("{% for m in messages %}{{ m['content'] }", r"not a chat template Jinja can read: line 1: "),
}
# other ways to the same ends, each stopped by a bound
BOUNDED = {
    "filter-width": "{{ 'x' | center(10**10) }}",
    "method-width": "{{ 'x'.ljust(10**10) }}",
    "format-width": "{{ '%10000000000d' % 1 }}",
    "list-product": "{{ ([1] * 100000) * 100000 }}",
    "namespace-doubling": (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
    ),
    "output": "{% for i in range(100) %}{{ 'ab' * 1000000 }}{% endfor %}",
    "power": "{{ 10 ** 100000000 }}",
}


@pytest.fixture(scope="module")
def tokenizer():
    tok = build_tokenizer(["4821+975=? 5796 and 1+1? Be brief."] * 5)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    return tok


def _with(tokenizer, template: str):
    tok = copy.deepcopy(tokenizer)
    use_template(tok, template, "my.jinja")
    return tok


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_the_issues_templates_are_one_line(tokenizer, case):
    template, match = HOSTILE[case]
    with pytest.raises(GlassrlError, match="^my.jinja: " + match) as err:
        render_chat(_with(tokenizer, template), CHAT)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("case", sorted(BOUNDED))
def test_every_way_to_build_too_much_is_stopped(tokenizer, case):
    with pytest.raises(GlassrlError, match=r"^my.jinja: stopped at a bound of chat templates: "):
        render_chat(_with(tokenizer, BOUNDED[case]), CHAT)


def test_a_template_that_runs_too_long_is_stopped(tokenizer, monkeypatch):
    monkeypatch.setattr(chat_template, "MAX_SECONDS", 0.2)
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(GlassrlError, match=r"^my.jinja: stopped at a bound of chat templates: rendering took more"):
        render_chat(_with(tokenizer, loops), CHAT)


def test_a_template_raising_is_one_line(tokenizer):
    with pytest.raises(GlassrlError, match="^my.jinja: roles must alternate$"):
        render_chat(_with(tokenizer, "{{ raise_exception('roles must alternate') }}"), CHAT)


@pytest.mark.parametrize("name", ["qwen2.5", "qwen-like", "default"])
@pytest.mark.parametrize("generation", [False, True])
@pytest.mark.parametrize("tools", [None, [TOOL]])
def test_real_templates_render_as_transformers_renders_them(tokenizer, name, generation, tools):
    template = {"qwen2.5": QWEN25_TEMPLATE, "qwen-like": QWEN_LIKE, "default": CHAT_TEMPLATE}[name]
    tok = _with(tokenizer, template)
    theirs = tok.apply_chat_template(CHAT, tools=tools, add_generation_prompt=generation, tokenize=False)
    assert render_chat(tok, CHAT, tools=tools, add_generation_prompt=generation) == theirs


def test_audit_with_a_hostile_template_is_one_line(tiny_model_dir, tmp_path, capsys):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["3"]), encoding="utf-8")
    argv = ["audit", "grpo", "data.train=task:tool-add", f"model.actor={tiny_model_dir}", "--script", str(script)]
    for case, (template, match) in HOSTILE.items():
        path = tmp_path / f"{case}.jinja"
        path.write_text(template, encoding="utf-8")
        hermes = [*argv, "rollout.agent.call_format=hermes", "--chat-template", str(path)]
        assert_one_error_line(capsys, hermes, f"--chat-template {path}: " + match)
