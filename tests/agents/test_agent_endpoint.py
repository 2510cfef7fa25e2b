"""The OpenAI-compatible endpoint with a scripted sampler: what the agent sees (tool calls, n, logprobs,
streaming, /v1/models, errors), what is captured (one sample per extending conversation, observations
masked, the same rows as the native loop), and the rewrite rule (split, or refused naming the token)."""

from __future__ import annotations

import json
import sys

import httpx
import pytest
import torch

from glassrl.agents import AgentRolloutEngine, ToolEnvironment
from glassrl.agents.calculator import Calculator
from glassrl.agents.endpoint import EndpointRolloutEngine
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.rollout.base import ROLE_GENERATED, ROLE_OBSERVATION, SamplingParams

openai = pytest.importorskip("openai")

RECORD = PromptRecord("4821+975=?", "5796", {"sum": 5796}, "t#0")
PARAMS = SamplingParams(max_new_tokens=64)
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": Calculator.description,
                                           "parameters": Calculator.parameters}}]  # fmt: skip


def script(context: str) -> str:
    if "<result>" in context:
        return context.rsplit("<result>", 1)[1].split("</result>")[0]
    return "<call>calculator 4821+975</call>"


def client(base_url: str):
    return openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)


def tool_agent(base_url: str, task: dict):
    c = client(base_url)
    messages = [{"role": "user", "content": task["prompt"]}]
    for _ in range(3):
        message = c.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        if not message.tool_calls:
            return {"agent_said": 1.0}
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = Calculator().call(json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None


def engine(tokenizer, scripted, agent, **kwargs):
    return EndpointRolloutEngine(scripted(tokenizer, script), tokenizer, agent, describe_tools=False, **kwargs)


def generate(e, records=(RECORD,), n=1):
    try:
        return e.generate([[0]] * len(records), n=n, params=PARAMS, generator=torch.Generator(), records=list(records))
    finally:
        e.close()


def test_the_agent_s_conversation_is_one_sample_with_the_native_loop_s_rows(tokenizer, scripted):
    batch = generate(engine(tokenizer, scripted, tool_agent), n=2)
    native = AgentRolloutEngine(
        scripted(tokenizer, script), tokenizer, lambda: ToolEnvironment([Calculator()]), describe_tools=False
    )
    reference = native.generate(
        native.format_prompts([RECORD]), n=2, params=PARAMS, generator=torch.Generator(), records=[RECORD]
    )
    for key in ("prompt_ids", "response_ids", "response_mask", "response_context_mask", "group_index"):
        assert torch.equal(getattr(batch, key), getattr(reference, key)), key
    assert batch.texts == reference.texts == ["5796", "5796"]
    call, answer = batch.turns[0]
    assert (call.finish_reason, answer.finish_reason) == ("tool_call", "stop")
    assert call.observation == " <result>5796</result>\n" and call.tool_calls[0]["name"] == "calculator"
    assert answer.reward_parts == {"agent_said": 1.0}  # the agent's reward, on the last turn
    roles = batch.token_roles[0].tolist()
    assert roles[call.end : call.observation_end] == [ROLE_OBSERVATION] * (call.observation_end - call.end)
    assert roles[call.start : call.end] == [ROLE_GENERATED] * (call.end - call.start)


def test_what_the_agent_sees(tokenizer, scripted):
    seen = {}

    def agent(base_url, task):
        c = client(base_url)
        seen["models"] = [m.id for m in c.models.list().data]
        messages = [{"role": "user", "content": task["prompt"]}]
        r = c.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, n=2, logprobs=True, top_logprobs=0
        )
        seen["reply"] = r
        call = r.choices[0].message.tool_calls[0]
        assert json.loads(call.function.arguments) == {"expression": "4821+975"}
        messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id,
                                                                          "content": "5796"}]  # fmt: skip
        stream = c.chat.completions.create(model="policy", messages=messages, tools=TOOLS, stream=True)
        seen["streamed"] = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        with pytest.raises(openai.BadRequestError, match="tool_choice"):
            c.chat.completions.create(model="policy", messages=messages, tool_choice="required", tools=TOOLS)
        return None

    batch = generate(engine(tokenizer, scripted, agent))
    reply = seen["reply"]
    assert seen["models"] == ["policy"] and len(reply.choices) == 2
    assert reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.content is None
    assert [t.logprob for t in reply.choices[0].logprobs.content] == [-0.5] * len(reply.choices[0].token_ids)
    assert seen["streamed"] == "5796"
    # n = 2: the choice the agent continued is one sample; the other is a sample of its own
    assert len(batch) == 2 and batch.group_index.tolist() == [0, 0]
    assert sorted(r for r in batch.finish_reasons) == ["stop", "turn_limit"]


def summarising_agent(base_url, task):
    c = client(base_url)
    first = c.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["prompt"]}],
                                      tools=TOOLS).choices[0].message  # fmt: skip
    # the context is rewritten: a fresh prompt that holds the result, not the conversation continued
    c.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "4821+975=? <result>5796</result>"}]
    )
    return first and None


def test_a_rewritten_context_becomes_a_new_sample_said_in_the_ledger(tokenizer, scripted):
    batch = generate(engine(tokenizer, scripted, summarising_agent))
    assert len(batch) == 2 and batch.group_index.tolist() == [0, 0]
    assert batch.finish_reasons == ["rewritten", "stop"]
    assert batch.texts == ["", "5796"]


def test_a_rewritten_context_is_refused_naming_the_first_differing_token(tokenizer, scripted):
    with pytest.raises(GlassrlError, match=r"on_rewrite is refuse and .* at token \d+ it has \d+ \(.*\) where"):
        generate(engine(tokenizer, scripted, summarising_agent, on_rewrite="refuse"))


def test_the_budget_ends_a_sample_whose_next_context_does_not_fit(tokenizer, scripted):
    e = engine(tokenizer, scripted, tool_agent)
    budget = len(tokenizer.encode("<call>calculator 4821+975</call>", add_special_tokens=False)) + 2
    try:
        batch = e.generate([[0]], n=1, params=SamplingParams(max_new_tokens=budget), generator=torch.Generator(),
                           records=[RECORD])  # fmt: skip
    finally:
        e.close()
    assert batch.finish_reasons == ["length"] and len(batch.turns[0]) == 1 and batch.texts == [""]


def test_a_command_agent_and_its_reward_file(tokenizer, scripted, tmp_path):
    program = tmp_path / "agent.py"
    program.write_text(
        "import json, os, httpx\n"
        "task = json.loads(os.environ['GLASSRL_TASK'])\n"
        "r = httpx.post(os.environ['OPENAI_BASE_URL'] + '/chat/completions', json={'model': 'policy', "
        "'messages': [{'role': 'user', 'content': task['prompt']}]}).json()\n"
        "reward = 0.5 if r['choices'][0]['message']['tool_calls'] else 0\n"
        "json.dump(reward, open(os.environ['GLASSRL_REWARD_FILE'], 'w'))\n"
    )
    batch = generate(engine(tokenizer, scripted, [sys.executable, str(program)]))
    assert batch.turns[0][-1].reward_parts == {"agent": 0.5} and batch.finish_reasons == ["turn_limit"]


def test_an_agent_that_fails_names_its_record(tokenizer, scripted):
    def agent(base_url, task):
        httpx.post(base_url + "/chat/completions", json={"messages": "hi"}).raise_for_status()

    with pytest.raises(GlassrlError, match=r"t#0: the agent failed: HTTPStatusError"):
        generate(engine(tokenizer, scripted, agent))
