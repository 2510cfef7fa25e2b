"""verifiers (PyPI ``verifiers`` 0.4.0, ``glassrl[verifiers]``): a verifiers environment run through glassrl's endpoint.

verifiers 0.4.0 is the ``verifiers.v1`` stack (``import verifiers.v1 as vf``). An environment is a
taskset (a module exporting a ``vf.Taskset`` subclass, loaded by id: verifiers/v1/utils/loaders.py:71
imports ``verifiers.v1.tasksets.<id>`` or the module ``<id>``) played by a harness (the taskset
module's own exported ``vf.Harness``, else the built-in ``bash``: loaders.py:153). ``load_environment``
(loaders.py:184) builds the ``Env``; ``Env.serving()`` (verifiers/v1/env.py:356) brings up its
interception server, and ``Env.run_episode(task, ctx)`` (env.py:234) runs one episode: the harness
talks to the interception server, which forwards each request to ``ctx.client.base_url``
(``EvalClientConfig``, verifiers/v1/configs/client.py:45) and records it on a ``Trace``; the task's
``@vf.reward`` functions then score the trace (``Trace.rewards``, verifiers/v1/trace.py:407; the
weighted sum is ``Trace.reward``, :473).

:class:`VerifiersAgent` is an endpoint agent (``rollout.agent.endpoint.agent``, docs/agentic.md
"Bring your agent"): per episode it runs the environment's own ``run_episode`` with ``base_url`` =
glassrl's endpoint, so every model call of the harness is captured token-exact by glassrl, and it
returns the environment's own score: each reward of each trace as a reward part ``verifiers/<name>``
(weighted, as ``Trace.reward`` sums them). Which verifiers task an episode plays: the record's
``metadata["verifiers_idx"]`` (the task's position in the taskset, :func:`records` writes it).

The built-in harnesses (``bash``, ``null``) run their chat program as a PEP 723 script through
``uv sync --script`` (verifiers/v1/runtimes/base.py:279), which downloads its dependencies;
:class:`ChatHarness` is the same chat loop in-process (no download): a taskset module exports it
(``__all__``) to make it the taskset's own harness.

Config: ``rollout.agent.endpoint.agent: my_env.py:agent`` with::

    from glassrl.agents.hubs.verifiers import VerifiersAgent
    agent = VerifiersAgent("my_taskset")          # a taskset id, as verifiers' own --env.taskset.id
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from glassrl.agents.hubs import require
from glassrl.errors import GlassrlError

TASK_FIELD = "verifiers_idx"  # a record's verifiers task: its position in the taskset's load()
MODEL = "policy"  # the endpoint's one model (/v1/models)

vf = require("verifiers.v1", "verifiers", "verifiers")
_clients = require("verifiers.v1.clients", "verifiers", "verifiers")


class ChatHarness(vf.Harness[vf.HarnessConfig]):
    """The chat loop of verifiers' ``null`` harness (verifiers/v1/harnesses/null/harness.py), in-process:
    the task's system prompt and prompt, one completion through the rollout's interception endpoint,
    repeated while the model calls tools (none: a chat taskset has none), at most ``MAX_TURNS``."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False
    MAX_TURNS = 1

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        openai = require("openai", "verifiers", "openai")
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages.extend(m.model_dump(exclude_none=True) for m in prompt)
        client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        text = ""
        try:
            for _ in range(self.MAX_TURNS):
                reply = await client.chat.completions.create(model=ctx.model, messages=messages)
                message = reply.choices[0].message
                text = message.content or ""
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    break
        finally:
            await client.close()
        return vf.ProgramResult(exit_code=0, stdout=text, stderr="")


class VerifiersAgent:
    """``agent(base_url, task)``: one verifiers episode through glassrl's endpoint, scored by the environment."""

    def __init__(self, taskset: str, *, env: dict[str, Any] | None = None, timeout_s: float = 600.0) -> None:
        env = dict(env or {})
        env["taskset"] = {"id": taskset, **env.get("taskset", {})}
        env["agent"] = {"runtime": {"type": "subprocess"}, **env.get("agent", {})}  # verifiers': a Prime sandbox
        try:
            self.config = vf.resolve_env_config(env)
            self.tasks = list(vf.load_environment(self.config).taskset)  # in load() order: verifiers_idx
        except Exception as err:  # noqa: BLE001 - verifiers' loaders raise import, type and validation errors
            raise GlassrlError(f"verifiers taskset {taskset!r}: {type(err).__name__}: {err}".splitlines()[0]) from None
        self.timeout_s = timeout_s

    def task(self, task: dict) -> Any:
        idx = (task.get("metadata") or {}).get(TASK_FIELD)
        if not isinstance(idx, int) or not 0 <= idx < len(self.tasks):
            raise GlassrlError(
                f"{task.get('source') or 'a record'}: metadata.{TASK_FIELD} = {idx!r}: expected a task index "
                f"below {len(self.tasks)} (the taskset {self.config.taskset.id!r}'s size)"
            )
        return self.tasks[idx]

    def __call__(self, base_url: str, task: dict) -> dict[str, float]:
        return asyncio.run(self._episode(base_url, self.task(task)))

    async def _episode(self, base_url: str, task: Any) -> dict[str, float]:
        client = _clients.EvalClientConfig(base_url=base_url, api_key_var="GLASSRL_VERIFIERS_KEY")
        ctx = vf.ModelContext(model=MODEL, client=client)
        # an Env per episode: serving() keeps its interception server on the Env (env.py:368), and glassrl
        # runs episodes in threads at once; constructing one loads nothing (Taskset.load runs on iteration)
        env = vf.load_environment(self.config)
        async with env.serving():
            episode = await asyncio.wait_for(env.run_episode(task, ctx), self.timeout_s)
        if not episode.ok:  # Episode.errors, then each Trace.errors (verifiers/v1/trace.py:424)
            errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
            why = f"{errors[0].type}: {errors[0].message}" if errors else "not ok"
            raise GlassrlError(f"verifiers episode of task {task.data.idx} failed: {why}")
        parts: dict[str, float] = {}
        for trace in episode.traces:
            for name, reward in trace.rewards.items():
                if reward is None:
                    raise GlassrlError(f"verifiers task {task.data.idx}: reward {name!r} was not scored")
                key = f"verifiers/{name}"
                parts[key] = parts.get(key, 0.0) + reward.value
        return parts


def records(taskset: str, out: str | Path, *, env: dict[str, Any] | None = None) -> int:
    """The taskset's tasks as glassrl prompt records (JSONL for ``data.train``), each naming its task."""
    agent = VerifiersAgent(taskset, env=env)
    with Path(out).open("w") as f:
        for idx, task in enumerate(agent.tasks):
            prompt = task.data.prompt
            if not isinstance(prompt, str):  # Messages: the chat list glassrl reads as a prompt
                prompt = [m.model_dump(mode="json", exclude_none=True) for m in prompt or []]
            f.write(json.dumps({"prompt": prompt, TASK_FIELD: idx}) + "\n")
    return len(agent.tasks)


def main(argv: list[str] | None = None) -> int:
    """``python -m glassrl.agents.hubs.verifiers TASKSET --out data.jsonl``: the records ``data.train`` reads."""
    parser = argparse.ArgumentParser(prog="python -m glassrl.agents.hubs.verifiers", description=main.__doc__)
    parser.add_argument("taskset", help="a verifiers taskset id (an importable module exporting a vf.Taskset)")
    parser.add_argument("--out", required=True, help="the JSON-lines file to write")
    args = parser.parse_args(argv)
    try:
        print(f"{records(args.taskset, args.out)} tasks of {args.taskset} -> {args.out}")
    except GlassrlError as err:
        print(f"error: {err}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
