"""The tool-add agent as a plain OpenAI-client program (docs/agentic.md, "Bring your agent").

It is the native loop of ``examples/tool_add.yaml`` written against the OpenAI API: ask, run the
calculator for each call the model makes, send the results back as tool messages, stop at an answer
or after ``MAX_TURNS`` turns. glassrl serves the policy at ``base_url`` during rollouts and records
every call token-exact; the run's reward (``numeric``) judges the final answer, and the agent adds
the environment's format reward (``valid_call``, 0.1 for a call that ran).

    glassrl train examples/tool_add_endpoint.yaml          # agent(base_url, task) in threads
    python examples/agents/tool_add_agent.py               # as a command: OPENAI_BASE_URL, GLASSRL_TASK
"""

from __future__ import annotations

import json
import os

from openai import OpenAI

from glassrl.agents.calculator import Calculator
from glassrl.agents.tools import ToolCall, run_call

MAX_TURNS = 3
VALID_CALL_REWARD = 0.1
CALCULATOR = Calculator()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": CALCULATOR.name,
            "description": CALCULATOR.description,
            "parameters": CALCULATOR.parameters,
        },
    }
]


def run_tool(name: str, arguments: str) -> tuple[str, bool]:
    """The tool's answer to one call (glassrl's checks and messages, as the native environment
    answers), and whether it ran."""
    try:
        call = ToolCall(name, arguments=json.loads(arguments))
    except json.JSONDecodeError as err:
        call = ToolCall(name, error=f"malformed JSON arguments: {err.msg} at character {err.pos}")
    result = run_call({CALCULATOR.name: CALCULATOR}, call, timeout_s=30.0)
    return result.text, result.status == "ok"


def agent(base_url: str, task: dict) -> dict[str, float]:
    client = OpenAI(base_url=base_url, api_key="glassrl", max_retries=0)  # the endpoint reads no key
    messages = [{"role": "user", "content": task["prompt"]}]
    ran = False
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0]
        message = reply.message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls or reply.finish_reason == "length":
            break
        for call in message.tool_calls:
            text, ok = run_tool(call.function.name, call.function.arguments)
            ran = ran or ok
            messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
    return {"valid_call": VALID_CALL_REWARD} if ran else {}


if __name__ == "__main__":
    parts = agent(os.environ["OPENAI_BASE_URL"], json.loads(os.environ["GLASSRL_TASK"]))
    with open(os.environ["GLASSRL_REWARD_FILE"], "w") as f:
        json.dump(parts, f)
