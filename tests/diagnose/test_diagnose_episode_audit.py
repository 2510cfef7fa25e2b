"""The audit of an environment and chat template: a bundled task passes every check; a template that
renders a tool message differently inside the conversation, and a tool whose text merges with the
next turn's tokens, fail the render check with the offending token shown in its context."""

from __future__ import annotations

import dataclasses

import torch

from glassrl.agents import AgentRolloutEngine, FunctionTool, ToolEnvironment, task_environment
from glassrl.data.formatting import plain_ids
from glassrl.data.records import PromptRecord
from glassrl.data.tasks import load_task
from glassrl.diagnose.episode_audit import CHECKS, Recorder, ScriptedTurns, _Shower, audit_batch, shown, table
from glassrl.models.loading import load_tokenizer
from glassrl.rollout.base import SamplingParams

CALL = '<tool_call>{"name": "look", "arguments": {}}</tool_call>'
# A raw-completion template with tools: an assistant turn is its text and EOS, a tool result follows as
# "<|user|>Result: …"; nothing is written before the next assistant turn.
TEMPLATE = (
    "<|bos|>{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{{ m['content'] }}<|eos|>"
    "{% elif m['role'] == 'tool' %}<|user|>Result: {{ TOOL }}"
    "{% else %}<|user|>{{ m['content'] }}{% if tools %} tools: {{ tools | length }}{% endif %}{% endif %}"
    "{% endfor %}"
)
VERBATIM = TEMPLATE.replace("{{ TOOL }}", "{{ m['content'] }}")
# the last message verbatim, an earlier one trimmed: the observation's tokens are not the re-rendered ones
TRIMS_EARLIER = TEMPLATE.replace(
    "{{ TOOL }}", "{% if loop.last %}{{ m['content'] }}{% else %}{{ m['content'] | trim }}{% endif %}"
)


def _audit(tokenizer, make_env, records, turns, *, call_format="auto", max_turns=3, budget=200, n=1):
    recorder = Recorder(make_env)
    engine = AgentRolloutEngine(
        ScriptedTurns(tokenizer, turns), tokenizer, recorder, call_format=call_format, max_turns=max_turns
    )
    prompts = engine.format_prompts(records)
    params = SamplingParams(max_new_tokens=budget, temperature=1.0)
    batch = engine.generate(prompts, n=n, params=params, generator=torch.Generator().manual_seed(0), records=records)
    return audit_batch(batch, records, recorder, engine.format, tokenizer, max_turns=max_turns, budget=budget)


def _look_env(result: str):
    def look() -> str:
        """Look."""
        return result

    return lambda: ToolEnvironment([FunctionTool(look)])


def _failed(audits, check):
    return [r for a in audits for r in a.results if r.check == check and not r.ok]


def test_the_bundled_tool_task_passes_every_check(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    records = load_task("tool-add", "train", size=2)
    audits = _audit(
        tokenizer, task_environment("tool-add"), records, ["<call>calculator 1+2</call>", "3"], budget=200, n=2
    )
    assert len(audits) == 4 and all(a.ok for a in audits), table(audits)
    lines = table(audits)
    assert lines[1:] == [f"{name:<10} {4:>4}/{4:<3} ok   {what}" for name, what in CHECKS.items()]


def test_a_template_that_renders_a_tool_message_differently_is_caught(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.chat_template = TRIMS_EARLIER
    records = [PromptRecord(prompt="go", answer=None)]
    audits = _audit(tokenizer, _look_env(" 7 "), records, [CALL, "ok"], call_format="hermes")
    assert all(a.ok for a in _audit(tokenizer, _look_env("7"), records, [CALL, "ok"], call_format="hermes"))
    (failure,) = _failed(audits, "render")
    # the observation " 7 " is re-rendered trimmed: the first token that differs is its leading space
    assert failure.detail.startswith("re-rendered as '7', context has position ")
    assert "(' ') in 'Result: ⟦ ⟧7 ok⟪<|eos|>⟫'" in failure.detail
    assert [r.check for a in audits for r in a.results if not r.ok] == ["render"]


def test_a_tool_whose_text_merges_with_the_next_turn_is_caught(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.chat_template = VERBATIM
    records = [PromptRecord(prompt="go", answer=None)]
    # "Y" then the model's "es": encoded together they are one token, "Yes" (a merge of the tokenizer)
    audits = _audit(tokenizer, _look_env("Y"), records, [CALL, "es"], call_format="hermes")
    (failure,) = _failed(audits, "render")
    assert "re-rendered as 'Yes', context has position " in failure.detail
    assert failure.detail == (
        "re-rendered as 'Yes', context has position 64 ('Y') in 'Result: ⟦Y⟧es⟪<|eos|>⟫': the texts of turn 0's "
        "observation and turn 1 (generated) merge where they meet when encoded in one piece"
    )


class _OneTokenPerCharacter(ScriptedTurns):
    """The scripted turns, each character its own token: splits the tokenizer never makes, as an
    untrained model samples them."""

    def sample(self, contexts, max_new_tokens, params, generator, stop_strings, with_logprobs):
        turns = super().sample(contexts, max_new_tokens, params, generator, stop_strings, with_logprobs)
        eos = self.tokenizer.eos_token_id
        for turn in turns:
            end = turn.tokens[-1:] if turn.tokens[-1:] == [eos] else []
            text = self.tokenizer.decode(turn.tokens[: len(turn.tokens) - len(end)])
            turn.tokens[:] = [i for c in text for i in self.tokenizer.encode(c, add_special_tokens=False)] + end
            if turn.logprobs is not None:
                turn.logprobs[:] = [0.0] * len(turn.tokens)
        return turns


def test_a_render_failure_says_why_the_model_sampled_a_split_the_tokenizer_never_makes(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    records = load_task("tool-add", "train", size=1)
    recorder = Recorder(task_environment("tool-add"))
    engine = AgentRolloutEngine(_OneTokenPerCharacter(tokenizer, ["Yes, 3"]), tokenizer, recorder)
    params = SamplingParams(max_new_tokens=200)
    prompts = engine.format_prompts(records)
    batch = engine.generate(prompts, n=1, params=params, generator=torch.Generator(), records=records)
    (audit,) = audit_batch(batch, records, recorder, engine.format, tokenizer, max_turns=3, budget=200)
    (failure,) = _failed([audit], "render")
    assert failure.detail.endswith(
        ": turn 0 (generated) is not the tokenizer's encoding of its own text: the model sampled a split of it "
        "that the tokenizer never makes (an untrained or barely trained model does; the format is not at fault: "
        "audit with --script, or a trained model, to check the format)"
    ), failure.detail


def test_a_prompt_position_is_named_so_not_negative(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    ids = tokenizer.encode("4821+975=? 5796", add_special_tokens=False)
    show = _Shower(tokenizer, ids, prompt_length=5)
    assert show(2).startswith("prompt position 2 (")
    assert show(6).startswith("position 1 (")


def test_limits_and_the_stop_token(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    records = load_task("tool-add", "train", size=1)
    # calls in every turn: the last one is cut by the turn limit, and recorded so
    audits = _audit(
        tokenizer, task_environment("tool-add"), records, ["<call>calculator 1+2</call>"], max_turns=2, budget=200
    )
    assert audits[0].finish_reason == "turn_limit" and audits[0].ok
    # a budget the first turn overruns: truncation recorded as "length"
    audits = _audit(tokenizer, task_environment("tool-add"), records, ["<call>calculator 1+2</call>"], budget=10)
    assert audits[0].finish_reason == "length" and audits[0].ok


def test_an_observation_token_that_trains_is_caught(tiny_model_dir):
    # a batch whose mask lets the first observation token train (what a hand-written multi-turn loop gets wrong)
    tokenizer = load_tokenizer(tiny_model_dir)
    records = load_task("tool-add", "train", size=1)
    recorder = Recorder(task_environment("tool-add"))
    engine = AgentRolloutEngine(ScriptedTurns(tokenizer, ["<call>calculator 1+2</call>", "3"]), tokenizer, recorder)
    params = SamplingParams(max_new_tokens=200)
    batch = engine.generate(
        engine.format_prompts(records), n=1, params=params, generator=torch.Generator(), records=records
    )
    first_observation = batch.turns[0][0].end
    mask = batch.response_mask.clone()
    mask[0, first_observation] = True
    broken = dataclasses.replace(batch, response_mask=mask)
    (audit,) = audit_batch(broken, records, recorder, engine.format, tokenizer, max_turns=4, budget=200)
    failed = {r.check: r.detail for r in audit.results if not r.ok}
    assert sorted(failed) == ["gradient", "kl", "length", "mask"]
    where = f"position {first_observation} (' ') in '"
    assert failed["mask"].startswith(f"mask True on an observation token: {where}")
    assert failed["gradient"].startswith(f"gradient reaches observation token: {where}")
    assert failed["length"] == "length counted 27 tokens, the turns generated 26"


def test_special_token_text_in_a_tool_output_passes_the_render_check_and_shows_apart_from_the_token(tiny_model_dir):
    """Issue 37 (low): a tool's output holding "<|eos|>" is escaped into ordinary tokens; the tagged
    re-rendering encoded the decoded context whole, made that text the special token and failed a right
    context, and the detail showed the escaped text and the real token alike."""
    tokenizer = load_tokenizer(tiny_model_dir)
    records = [PromptRecord(prompt="go", answer=None)]
    audits = _audit(tokenizer, _look_env("a<|eos|>b"), records, ["<call>look</call>", "done"], call_format="tagged")
    assert not _failed(audits, "render") and all(a.ok for a in audits)
    eos = tokenizer.eos_token_id
    escaped = plain_ids(tokenizer, "a<|eos|>b")
    assert eos not in escaped
    assert shown(tokenizer, [*escaped, eos]) == "a<|eos|>b⟪<|eos|>⟫"
    show = _Shower(tokenizer, [*escaped, eos], 0)
    assert show(len(escaped)).endswith("<|eos|>b⟦⟪<|eos|>⟫⟧'")  # the text unmarked, the token marked
