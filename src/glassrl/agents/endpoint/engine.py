"""A RolloutEngine whose episodes are the user's agent program, talking to the policy over the endpoint.

Per ``generate``, for each prompt × n an episode runs the agent with its own base URL:

- a Python function ``agent(base_url, task)`` in a thread; ``task`` is the prompt's record as a dict
  (``prompt``, ``answer``, ``metadata``, ``source``); it returns None, a number (reward part
  ``agent``) or a dict of named reward parts;
- a command (a subprocess) with ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` (any: not read), ``GLASSRL_TASK`` (the task as
  JSON) and ``GLASSRL_REWARD_FILE`` in its environment; it may write its reward (a number or an
  object of parts, JSON) to that file.

Meanwhile the rollout's thread samples the agents' calls in lockstep batches (:mod:`.batcher`) with
the :class:`~glassrl.agents.loop.TurnSampler` it was given: the engine behind the endpoint is the
turn sampler every multi-turn engine uses (Hugging Face decoding today; another engine, vLLM
included, serves it by implementing ``TurnSampler.sample``). When every agent has returned, each
episode's calls become samples (:mod:`.capture`): rows of the RolloutBatch, the samples of prompt
j with group index j, in episode order. An episode that split (a rewritten context) gives more
than one row; the agent's reward parts sit on the last turn of each of its samples; the run's
reward judges each sample's final answer (its last turn, when that is not a call), as in the
native loop.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from numbers import Real
from pathlib import Path
from typing import Any

import torch

from glassrl.agents.endpoint.batcher import Lockstep, gives_top_logprobs, model_top_logprobs, sample_batch
from glassrl.agents.endpoint.capture import Capture, Choice, Sample
from glassrl.agents.endpoint.render import Renderer
from glassrl.agents.endpoint.server import EndpointServer
from glassrl.agents.endpoint.session import Session
from glassrl.agents.formats import CallFormat, build_call_format
from glassrl.agents.loop import TurnSampler
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.models.loading import pad_id
from glassrl.rollout.base import ROLE_GENERATED, ROLE_PAD, RolloutBatch, SamplingParams
from glassrl.rollout.hf import left_pad

Agent = Callable[[str, dict[str, Any]], Any] | Sequence[str]  # a function, or a command's argv


def task_of(record: PromptRecord) -> dict[str, Any]:
    return {"prompt": record.prompt, "answer": record.answer, "metadata": record.metadata, "source": record.source}


class EndpointRolloutEngine:
    """Episodes run by the user's agent over the endpoint (module docstring); a RolloutEngine.

    sampler:           samples the calls' turns (:class:`~glassrl.agents.loop.HFTurnSampler`)
    tokenizer:         the actor's tokenizer
    agent:             a function ``agent(base_url, task)`` or a command (argv list)
    call_format:       how calls are parsed from the sampled text (glassrl.agents.formats)
    chat:              the run's prompts go through the chat template (glassrl.models.chat_rendering)
    on_rewrite:        split (a rewritten context starts a new sample) or refuse (HTTP 400)
    timeout_s:         longest wait for the running agents' next calls, and for a command to end
    sampling_logprobs: keep the log-probs as sampled in the batch (``rollout_logprobs``)
    """

    def __init__(
        self,
        sampler: TurnSampler,
        tokenizer,
        agent: Agent,
        *,
        call_format: str = "auto",
        describe_tools: bool = True,
        chat: bool = False,
        on_rewrite: str = "split",
        timeout_s: float = 600.0,
        sampling_logprobs: bool = False,
    ) -> None:
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.agent = agent
        self.format: CallFormat = build_call_format(tokenizer, call_format, describe_tools=describe_tools)
        # the server's own tokenizer and call format (rendering runs in its thread while the engine samples)
        server_tokenizer = copy.deepcopy(tokenizer)
        own_format = build_call_format(server_tokenizer, call_format, describe_tools=describe_tools)
        self.renderer = Renderer(server_tokenizer, own_format, chat=chat)
        self.on_rewrite = on_rewrite
        self.timeout_s = timeout_s
        self.sampling_logprobs = sampling_logprobs
        self.pad_id = pad_id(tokenizer)
        self.server: EndpointServer | None = None
        self.samples: list[Sample] = []  # the last batch's rows, as captured (glassrl audit reads them)
        self.rollouts = itertools.count()
        kind = "command" if not callable(agent) else "function"
        self.path = (
            f"the agent {kind} over the OpenAI-compatible endpoint ({self.format.name} calls), each call by "
            f"{sampler.path}"
        )

    def generate(
        self,
        prompts: list[list[int]],
        *,
        n: int,
        params: SamplingParams,
        generator: torch.Generator,
        records: Sequence[PromptRecord] | None = None,
    ) -> RolloutBatch:
        """len(records) × n episodes of the agent -> their samples (module docstring)."""
        if records is None:
            raise ValueError("endpoint rollout: needs the prompts' records (each episode's task)")
        if self.server is None:
            self.server = EndpointServer()
        tasks = [r for r in records for _ in range(n)]
        captures = [Capture(params.max_new_tokens, self.on_rewrite, self.tokenizer.decode) for _ in tasks]
        lockstep = Lockstep(len(tasks))
        session = Session(self.renderer, captures, lockstep, str(next(self.rollouts)))
        results: list[Any] = [None] * len(tasks)
        errors: list[BaseException | None] = [None] * len(tasks)
        threads = [
            threading.Thread(
                target=self._episode, args=(i, name, task, session, lockstep, results, errors), daemon=True
            )
            for i, (name, task) in enumerate(zip(session.names(), tasks))
        ]
        top = model_top_logprobs(self.sampler, params)
        session.top_logprobs = gives_top_logprobs(self.sampler)
        self.server.handler = session
        try:
            for thread in threads:
                thread.start()
            while True:
                try:
                    batch = lockstep.next_batch(self.timeout_s)
                except TimeoutError as err:
                    raise GlassrlError(
                        f"endpoint rollout: episodes {err.args[0]} made no call for {self.timeout_s:g} s "
                        "(rollout.agent.endpoint.timeout_s)"
                    ) from None
                if batch is None:
                    break
                sample_batch(self.sampler, batch, replace(params), generator, top)
        finally:
            self.server.handler = None
        for thread in threads:
            thread.join()
        for i, error in enumerate(errors):
            if error is not None:
                raise GlassrlError(f"{tasks[i].source}: the agent failed: {error}") from None
        return self._batch(captures, [_parts(r, tasks[i].source) for i, r in enumerate(results)], len(records), n)

    def _episode(self, i: int, name: str, task: PromptRecord, session: Session, lockstep, results, errors) -> None:
        try:
            results[i] = self._run_agent(self.server.base_url(name), task)
        except BaseException as err:  # noqa: BLE001 - the user's agent; reported with its record
            errors[i] = err if isinstance(err, GlassrlError) else f"{type(err).__name__}: {err}"
        finally:
            lockstep.finish(i)

    def _run_agent(self, base_url: str, record: PromptRecord) -> Any:
        if callable(self.agent):
            return self.agent(base_url, task_of(record))
        with tempfile.TemporaryDirectory(prefix="glassrl-agent-") as directory:
            reward_file = Path(directory) / "reward.json"
            env = os.environ | {
                "OPENAI_BASE_URL": base_url,
                "OPENAI_API_KEY": "glassrl",  # not read: the episode's URL holds its key
                "GLASSRL_TASK": json.dumps(task_of(record), ensure_ascii=False),
                "GLASSRL_REWARD_FILE": str(reward_file),
            }
            try:
                done = subprocess.run(
                    list(self.agent), env=env, capture_output=True, text=True, timeout=self.timeout_s, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as err:
                raise GlassrlError(f"agent command {list(self.agent)}: {err}") from None
            if done.returncode != 0:
                tail = " | ".join(done.stderr.strip().splitlines()[-3:])
                raise GlassrlError(f"agent command {list(self.agent)} exited with {done.returncode}: {tail}")
            if not reward_file.exists():
                return None
            try:
                return json.loads(reward_file.read_text())
            except json.JSONDecodeError as err:
                raise GlassrlError(f"agent command: GLASSRL_REWARD_FILE is not JSON: {err}") from None

    def _final(self, choice: Choice) -> str:
        tokens = choice.turn.tokens
        answer = tokens[:-1] if choice.turn.ended == "eos" else tokens  # a stop token is no text
        return self.tokenizer.decode(answer, skip_special_tokens=True)

    def _is_answer(self, choice: Choice) -> bool:
        """The native loop's rule: a turn that ended the response, and opened no call."""
        return not choice.extended and not choice.rewritten and not self.format.opens_call(choice.text)

    def _batch(self, captures: list[Capture], parts: list[dict[str, float]], prompts: int, n: int) -> RolloutBatch:
        rows: list[Sample] = []
        groups: list[int] = []
        for i, capture in enumerate(captures):
            samples = capture.samples(self._is_answer, self._final)
            if not samples:
                raise GlassrlError(f"endpoint rollout: episode {i} (prompt {i // n}) made no call to the endpoint")
            for s in samples:
                if parts[i]:
                    last = s.turns[-1]
                    reward_parts = {k: last.reward_parts.get(k, 0.0) + v for k, v in parts[i].items()}
                    s.turns[-1] = replace(last, reward_parts=reward_parts)
                rows.append(s)
                groups.append(i // n)
        self.samples = rows
        device = self.sampler.device
        prompt_ids, prompt_mask = left_pad([s.prompt for s in rows], self.pad_id)
        T = max(1, max(len(s.tokens) for s in rows))

        def pad(values: list[list], fill) -> list[list]:
            return [v + [fill] * (T - len(v)) for v in values]

        roles = torch.tensor(pad([s.roles for s in rows], ROLE_PAD), dtype=torch.int8)  # (B, T)
        logprobs = torch.tensor(pad([s.logprobs for s in rows], 0.0), dtype=torch.float32)  # (B, T)
        versions = None
        if getattr(self.sampler, "versions", None) is not None:
            versions = torch.tensor(pad([s.versions for s in rows], -1), dtype=torch.long).to(device)
        return RolloutBatch(
            prompt_ids=prompt_ids.to(device),  # (B, P)
            prompt_mask=prompt_mask.bool().to(device),  # (B, P)
            response_ids=torch.tensor(pad([s.tokens for s in rows], self.pad_id), dtype=torch.long).to(device),
            response_mask=(roles == ROLE_GENERATED).to(device),
            group_index=torch.tensor(groups, dtype=torch.long, device=device),
            finish_reasons=[s.turns[-1].finish_reason for s in rows],
            texts=[s.final_text for s in rows],
            response_context_mask=(roles != ROLE_PAD).to(device),
            turns=[tuple(s.turns) for s in rows],
            rollout_logprobs=logprobs.to(device) if self.sampling_logprobs else None,
            policy_versions=versions,
        )

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def _parts(result: Any, source: str) -> dict[str, float]:
    """The agent's return value as reward parts: None -> none; a number -> {"agent": it}; a dict of numbers."""
    if result is None:
        return {}
    if isinstance(result, Real) and not isinstance(result, bool):
        return {"agent": float(result)}
    if isinstance(result, dict) and all(isinstance(v, Real) and not isinstance(v, bool) for v in result.values()):
        return {str(k): float(v) for k, v in result.items()}
    expected = "None, a number or a dict of numbers"
    raise GlassrlError(f"{source}: the agent returned {type(result).__name__}; expected {expected}")
