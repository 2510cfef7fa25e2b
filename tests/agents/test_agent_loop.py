"""The multi-turn loop with a scripted sampler: layout of turns and observations in the batch,
the context each turn was sampled from, finish reasons, bad calls as observations, the turn and
token limits, tools stepped concurrently across the batch, and the hermes format end to end."""

from __future__ import annotations

import re
import threading

import pytest
import torch

from glassrl.agents import AgentRolloutEngine, StepResult, ToolEnvironment, reward_parts
from glassrl.agents.calculator import Calculator
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.rollout.base import ROLE_GENERATED, ROLE_OBSERVATION, ROLE_PAD, SamplingParams, concat_rollouts

RECORD = PromptRecord("4821+975=?", "5796", {"sum": 5796}, "t#0")
PARAMS = SamplingParams(max_new_tokens=64)


def calculator_env():
    return ToolEnvironment([Calculator()], valid_call_reward=0.1)


def tool_add_script(context: str) -> str:
    """Call the calculator on the question, then answer with the result."""
    results = re.findall(r"<result>(.*?)</result>", context)
    if results:
        return results[-1]
    return "<call>calculator " + re.search(r"(\d+\+\d+)=\?", context).group(1) + "</call>"


def run(engine, records, n=1, params=PARAMS):
    prompts = engine.format_prompts(records)
    return engine.generate(prompts, n=n, params=params, generator=torch.Generator().manual_seed(0), records=records)


def test_one_tool_call_then_the_answer(tokenizer, scripted):
    sampler = scripted(tokenizer, tool_add_script)
    engine = AgentRolloutEngine(sampler, tokenizer, calculator_env, describe_tools=False)
    batch = run(engine, [RECORD])
    (turns,) = batch.turns
    call, answer = turns
    assert (call.finish_reason, answer.finish_reason, batch.finish_reasons) == ("tool_call", "stop", ["stop"])
    assert call.text == "<call>calculator 4821+975</call>" and call.observation == " <result>5796</result>\n"
    assert call.tool_calls[0] | {"seconds": 0} == {
        "name": "calculator",
        "arguments": "4821+975",
        "status": "ok",
        "seconds": 0,
    }
    assert answer.text == "5796" and batch.texts == ["5796"]
    assert reward_parts(turns) == {"valid_call": 0.1}

    # Layout: generated, observation, generated (EOS included), then padding.
    n_call = len(tokenizer.encode(call.text, add_special_tokens=False))
    n_obs = len(tokenizer.encode(call.observation, add_special_tokens=False))
    n_answer = len(tokenizer.encode("5796", add_special_tokens=False)) + 1
    assert (call.start, call.end, call.observation_end) == (0, n_call, n_call + n_obs)
    end = n_call + n_obs + n_answer
    assert (answer.start, answer.end, answer.observation_end) == (n_call + n_obs, end, end)
    roles = [ROLE_GENERATED] * n_call + [ROLE_OBSERVATION] * n_obs + [ROLE_GENERATED] * n_answer
    assert batch.token_roles[0].tolist() == roles
    assert batch.response_mask[0].tolist() == [r == ROLE_GENERATED for r in roles]
    assert batch.response_context_mask[0].all() and batch.context_lengths.tolist() == [len(roles)]
    assert batch.lengths.tolist() == [n_call + n_answer]
    assert batch.response_ids[0, -1] == tokenizer.eos_token_id
    assert torch.equal(batch.attention_mask, torch.cat([batch.prompt_mask, batch.response_context_mask], 1))

    # The second turn was sampled from exactly the prompt, the first turn and the observation.
    prompt = batch.prompt_ids[0][batch.prompt_mask[0]].tolist()
    assert sampler.contexts[1] == [prompt + batch.response_ids[0, : n_call + n_obs].tolist()]


def test_bad_calls_become_observations_that_say_what_was_wrong(tokenizer, scripted):
    turns = iter(
        [
            '<call>calculator {"expression": 4821+}</call>',
            "<call>calculater 4821+975</call>",
            '<call>calculator {"expr": "4821+975"}</call>',
            "<call>calculator 4821/0</call>",
            "I give up",
        ]
    )
    engine = AgentRolloutEngine(
        scripted(tokenizer, lambda _: next(turns)), tokenizer, calculator_env, describe_tools=False, max_turns=5
    )
    batch = run(engine, [RECORD], params=SamplingParams(max_new_tokens=512))
    observations = [t.observation for t in batch.turns[0]]
    assert (
        observations[0]
        == " <result>error: malformed JSON arguments: Expecting ',' delimiter at character 19</result>\n"
    )
    assert observations[1] == " <result>error: unknown tool 'calculater' (available: calculator)</result>\n"
    assert observations[2].startswith(" <result>error: calculator: missing argument 'expression'")
    assert observations[3] == " <result>error: calculator: ZeroDivisionError: division by zero</result>\n"
    assert [t.finish_reason for t in batch.turns[0]] == ["tool_call"] * 4 + ["stop"]
    assert [c["status"] for t in batch.turns[0][:4] for c in t.tool_calls] == ["error"] * 4
    assert reward_parts(batch.turns[0]) == {} and batch.texts == ["I give up"]


def test_turn_limit_ends_without_an_observation_and_without_an_answer(tokenizer, scripted):
    engine = AgentRolloutEngine(
        scripted(tokenizer, lambda _: "<call>calculator 1+1</call>"), tokenizer, calculator_env, max_turns=2
    )
    batch = run(engine, [RECORD])
    first, last = batch.turns[0]
    assert first.finish_reason == "tool_call" and first.observation == " <result>2</result>\n"
    assert last.finish_reason == "turn_limit" and last.observation == "" and last.observation_end == last.end
    assert last.tool_calls == () and first.tool_calls[0]["status"] == "ok"  # the last call was not run
    assert batch.finish_reasons == ["turn_limit"] and batch.texts == [""]
    assert batch.context_lengths.tolist() == [last.end]


def test_token_budget_cuts_a_turn_or_an_observation(tokenizer, scripted):
    engine = AgentRolloutEngine(scripted(tokenizer, tool_add_script), tokenizer, calculator_env, describe_tools=False)
    n_call = len(tokenizer.encode("<call>calculator 4821+975</call>", add_special_tokens=False))
    cut = run(engine, [RECORD], params=SamplingParams(max_new_tokens=5))
    (turn,) = cut.turns[0]
    assert turn.finish_reason == "length" and turn.end == 5 and cut.texts == [""]  # a call was opened: no answer
    no_room = run(engine, [RECORD], params=SamplingParams(max_new_tokens=n_call + 3))
    (turn,) = no_room.turns[0]
    assert turn.finish_reason == "length" and turn.end == n_call and turn.observation == ""
    assert no_room.response_ids.shape[1] == n_call


def test_rows_layout_groups_and_one_environment_per_response(tokenizer, scripted):
    seen = []

    class Recording(ToolEnvironment):
        def reset(self, record):
            super().reset(record)
            seen.append((id(self), record.source))

    records = [RECORD, PromptRecord("12+30=?", "42", {"sum": 42}, "t#1")]
    engine = AgentRolloutEngine(
        scripted(tokenizer, tool_add_script), tokenizer, lambda: Recording([Calculator()]), describe_tools=False
    )
    batch = run(engine, records, n=3)
    assert batch.group_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert batch.texts == ["5796"] * 3 + ["42"] * 3
    generate_resets = seen[len(records) :]  # format_prompts reset one environment per record first
    assert [s for _, s in generate_resets] == ["t#0"] * 3 + ["t#1"] * 3
    assert len({i for i, _ in generate_resets}) == 6


def test_environments_step_concurrently_across_the_batch(tokenizer, scripted):
    """Four responses call a tool that returns only when all four calls are in flight at once."""
    barrier = threading.Barrier(4, timeout=20)

    class Meet:
        name, description = "meet", "waits for the other calls"
        parameters = {"type": "object", "properties": {}, "required": []}

        def call(self, arguments):
            barrier.wait()
            return "met"

    script = lambda c: "done" if "<result>" in c else "<call>meet</call>"  # noqa: E731
    engine = AgentRolloutEngine(
        scripted(tokenizer, script),
        tokenizer,
        lambda: ToolEnvironment([Meet()], call_timeout_s=30),
        describe_tools=False,
        tool_workers=4,
    )
    batch = run(engine, [RECORD], n=4)
    assert [t[0].observation for t in batch.turns] == [" <result>met</result>\n"] * 4, batch.turns


def test_an_environment_that_raises_names_the_record(tokenizer, scripted):
    class Broken(ToolEnvironment):
        def step(self, text, calls):
            raise KeyError("oops")

    engine = AgentRolloutEngine(scripted(tokenizer, tool_add_script), tokenizer, lambda: Broken([Calculator()]))
    with pytest.raises(GlassrlError, match=r"t#0: environment Broken.step raised KeyError\('oops'\)"):
        run(engine, [RECORD])


def test_an_environment_without_tools_can_continue_without_calls(tokenizer, scripted):
    class Quiz:
        tools = ()

        def reset(self, record):
            self.asked = 0

        def step(self, text, calls):
            self.asked += 1
            return StepResult(("again?",) if self.asked < 2 else (), done=self.asked >= 2, reward_parts={"turn": 1.0})

    engine = AgentRolloutEngine(scripted(tokenizer, lambda _: "yes"), tokenizer, Quiz)
    batch = run(engine, [RECORD])
    assert [t.finish_reason for t in batch.turns[0]] == ["continue", "stop"]
    assert reward_parts(batch.turns[0]) == {"turn": 2.0}


def test_hermes_format_end_to_end(qwen_tokenizer, scripted):
    def script(context):
        if "<tool_response>" in context:
            return re.findall(r"<tool_response>\n(.*?)\n</tool_response>", context)[-1]
        return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "4821+975"}}\n</tool_call>'

    sampler = scripted(qwen_tokenizer, script)
    engine = AgentRolloutEngine(sampler, qwen_tokenizer, calculator_env)
    batch = run(engine, [RECORD], params=SamplingParams(max_new_tokens=200))
    call, answer = batch.turns[0]
    assert call.finish_reason == "tool_call" and call.tool_calls[0]["arguments"] == {"expression": "4821+975"}
    assert call.observation.startswith("\n<|im_start|>user\n<tool_response>\n5796\n")
    assert batch.texts == ["5796"] and batch.finish_reasons == ["stop"]
    # The call turn ends with the generated <|im_end|> (it trains); the observation follows it.
    assert batch.response_ids[0, call.end - 1] == qwen_tokenizer.eos_token_id and batch.response_mask[0, call.end - 1]
    prompt = qwen_tokenizer.decode(sampler.contexts[0][0])
    assert '"name": "calculator"' in prompt  # the tools were rendered by the template


def test_select_and_concat_keep_the_multi_turn_fields(tokenizer, scripted):
    engine = AgentRolloutEngine(
        scripted(tokenizer, tool_add_script), tokenizer, calculator_env, describe_tools=False, sampling_logprobs=True
    )
    a = run(engine, [RECORD], n=2)
    b = run(engine, [PromptRecord("1+2=?", "3", {"sum": 3}, "t#9")], n=1)
    both = concat_rollouts([a, b], tokenizer.pad_token_id)
    assert both.turns == a.turns + b.turns and both.rollout_logprobs.shape == both.response_ids.shape
    assert torch.equal(both.token_roles[2, : b.response_ids.shape[1]], b.token_roles[0])
    assert (both.token_roles[2, b.response_ids.shape[1] :] == ROLE_PAD).all()
    picked = both.select(torch.tensor([2, 0]))
    assert picked.turns == [b.turns[0], a.turns[0]]
    assert torch.equal(picked.response_context_mask[1], both.response_context_mask[0])
    single = a.select(torch.tensor([0]))
    single.turns = None
    with pytest.raises(ValueError, match="single- vs multi-turn"):
        concat_rollouts([single, a], tokenizer.pad_token_id)


def test_max_turns_must_be_positive(tokenizer):
    with pytest.raises(GlassrlError, match="max_turns"):
        AgentRolloutEngine(None, tokenizer, calculator_env, max_turns=0)


def test_the_tool_add_task_end_to_end_with_its_environment_and_verifier(tokenizer, scripted):
    from glassrl.agents import task_environment
    from glassrl.data.tasks import tool_add
    from glassrl.rewards import NumericVerifier, RewardRequest

    records = tool_add.records("test", 0, 3)
    engine = AgentRolloutEngine(
        scripted(tokenizer, tool_add_script), tokenizer, task_environment("tool-add"), describe_tools=False
    )
    batch = run(engine, records, n=2)
    scores = NumericVerifier().score(
        [RewardRequest(r.prompt, t, r) for r, t in zip([r for r in records for _ in "ab"], batch.texts)]
    )
    assert [s.score for s in scores] == [1.0] * 6
    assert [reward_parts(t) for t in batch.turns] == [{"valid_call": tool_add.VALID_CALL_REWARD}] * 6
    with pytest.raises(GlassrlError, match="agentic tasks: tool-add, research"):
        task_environment("add")
