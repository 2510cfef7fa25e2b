"""The tool-add agent as a plain OpenAI-client program (docs/agentic.md, "Bring your agent").

It is the native loop of ``examples/tool_add.yaml`` written against the OpenAI API: ask, run the
calculator for each call the model makes (at most ``MAX_CALLS`` a turn, results cut at
``MAX_RESULT_CHARS``), send the results back as tool messages, stop at an answer, or at a call in
the last of ``MAX_TURNS`` turns (not run). glassrl serves the policy at ``base_url`` during rollouts
and records every call token-exact; the run's reward (``numeric``) judges the final answer, and the
agent adds the environment's format reward (``valid_call``: 0.1 once a call ran).

    glassrl train examples/agents/tool_add_endpoint.yaml    # agent(base_url, task) in threads
    OPENAI_BASE_URL=… GLASSRL_TASK=… python tool_add_agent.py   # as a command (rollout.agent.endpoint.command)
"""

from __future__ import annotations

import json
import os

from openai import OpenAI

from glassrl.agents.calculator import Calculator
from glassrl.agents.tools import ToolCall, run_call

MAX_TURNS = 3
MAX_CALLS = 4
MAX_RESULT_CHARS = 2000
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


def run_tool(call) -> tuple[str, bool]:
    """The calculator's answer to one call, and whether it ran; a bad call is answered with glassrl's own
    words (run_call, and the parse error the endpoint sends with a call it could not parse)."""
    name, arguments = call.function.name, call.function.arguments
    error = (call.model_extra or {}).get("error")
    if error is not None:
        parsed = ToolCall(name, error=error)
    elif name != CALCULATOR.name:
        parsed = ToolCall(name, arguments={})  # an unknown tool is named as such, whatever its arguments
    else:
        try:
            parsed = ToolCall(name, arguments=json.loads(arguments))
        except json.JSONDecodeError as err:
            parsed = ToolCall(name, error=f"malformed JSON arguments: {err.msg} at character {err.pos}")
    result = run_call({CALCULATOR.name: CALCULATOR}, parsed, timeout_s=30.0)
    text = result.text
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"…[cut at {MAX_RESULT_CHARS} characters]"
    return text, result.status == "ok"


def agent(base_url: str, task: dict) -> dict[str, float]:
    client = OpenAI(base_url=base_url, api_key="glassrl", max_retries=0)  # the endpoint reads no key
    messages = [{"role": "user", "content": task["prompt"]}]
    ran = False
    for turn in range(MAX_TURNS):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0]
        message = reply.message
        if not message.tool_calls or reply.finish_reason == "length" or turn == MAX_TURNS - 1:
            break  # an answer, a cut turn, or a call in the last turn (its result could not be read)
        messages.append(message.model_dump(exclude_none=True))
        for k, call in enumerate(message.tool_calls):
            text, ok = run_tool(call) if k < MAX_CALLS else (f"error: at most {MAX_CALLS} calls per turn", False)
            ran = ran or ok
            messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
    return {"valid_call": VALID_CALL_REWARD} if ran else {}


if __name__ == "__main__":
    parts = agent(os.environ["OPENAI_BASE_URL"], json.loads(os.environ["GLASSRL_TASK"]))
    with open(os.environ["GLASSRL_REWARD_FILE"], "w") as f:
        json.dump(parts, f)
