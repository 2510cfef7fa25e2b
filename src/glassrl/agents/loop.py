"""Multi-turn rollout with tools: the model writes a turn, the environment answers, until the end.

One response is a sequence of turns inside one growing context::

    prompt | turn 1 (generated) | observation 1 | turn 2 (generated) | observation 2 | … | final turn

Each turn is sampled with the whole context so far as its prompt: the prompt's tokens, every
earlier generated token and every observation token, exactly as they will sit in the batch.
The batch keeps them in one response row: ``response_mask`` is True on generated tokens only
(they train), ``response_context_mask`` on generated and observation tokens (the batch's
``attention_mask`` uses it), so the log-probs, values and reference log-probs the trainer
recomputes see the context the tokens were sampled in (DESIGN §1: observation tokens are
masked out of every loss and estimator, and GAE carries V and A across them).

Per turn, for the responses still running:
1. sample one turn per response (:class:`TurnSampler`; :class:`HFTurnSampler` wraps
   ``model.generate``); a turn ends at a stop token (EOS, the model's and the chat template's:
   glassrl.rollout.stops), at a stop string of the call format (tagged: ``</call>``) or of
   ``rollout.stop``, or when the response's token budget (``params.max_new_tokens``, generated
   and observation tokens together) runs out;
2. parse the calls (:mod:`.formats`) and step every environment, concurrently (a thread pool
   of ``tool_workers``; each call has its own time limit inside the environment);
3. end the response (final answer, ``turn_limit``, ``length``) or append the observation.

The turn's finish reason is recorded (:class:`glassrl.rollout.base.Turn`); a response's finish
reason is its last turn's. Sampling draws from the caller's generator, turn after turn, so the
same generator state and the same (deterministic) tools give the same batch. Sampling with
:class:`~glassrl.rollout.base.PolicyVersions` (asynchronous training), each generated token records
the version of the weights that sampled it, turn after turn (``RolloutBatch.policy_versions``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from glassrl.agents.environment import Environment, StepResult
from glassrl.agents.formats import CallFormat, build_call_format
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.models.loading import pad_id
from glassrl.rollout.base import (
    ROLE_GENERATED,
    ROLE_OBSERVATION,
    ROLE_PAD,
    PolicyVersions,
    RolloutBatch,
    SamplingParams,
    Turn,
)
from glassrl.rollout.hf import left_pad, sampler_for
from glassrl.rollout.stops import STRING, TOKEN, StopSet, stop_set

Ended = Literal["eos", "stop", "length"]


@dataclass
class SampledTurn:
    """One sampled turn: its tokens (the stop token or the stop string's last token included), how
    it ended ("eos": at a stop token; "stop": at a stop string; "length"), log π of each token
    under softmax(logits / temperature) when asked for, and the version of the weights that sampled
    each token when the sampler has versions; the k most likely tokens at each position with their
    log-probs (the same distribution as ``logprobs``), when asked for from a sampler that gives them as
    it samples (vLLM: glassrl.agents.vllm_turns)."""

    tokens: list[int]
    ended: Ended
    logprobs: list[float] | None = None
    versions: list[int] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None


class TurnSampler(Protocol):
    """Samples one turn for each context (token ids, unpadded): HFTurnSampler, or vLLM (glassrl.agents.vllm_turns)."""

    device: torch.device
    path: str  # how it samples, for the run's start-up lines

    def sample(
        self,
        contexts: list[list[int]],
        max_new_tokens: list[int],
        params: SamplingParams,
        generator: torch.Generator,
        stop_strings: tuple[str, ...],
        with_logprobs: bool,
    ) -> list[SampledTurn]: ...


def trim_turn(
    tokens: list[int], budget: int, stops: StopSet, decode: Callable[[list[int]], str]
) -> tuple[list[int], Ended]:
    """Cut a row of sampled tokens at its end: the first stop token (kept), or the first token
    that completes a stop string (kept), or the row's own ``budget``; whichever comes first
    (:meth:`glassrl.rollout.stops.StopSet.end`).

    Tokens after the end are what ``generate`` wrote for a finished row (padding) or sampled
    past this row's budget; they are dropped.
    """
    tokens = tokens[:budget]
    length, how = stops.end(tokens, decode)
    return tokens[:length], {TOKEN: "eos", STRING: "stop", None: "length"}[how]


class HFTurnSampler:
    """One turn per context, sampled as :mod:`glassrl.rollout.hf` samples (its decoding loop, or
    ``model.generate`` for a model the loop cannot run: the same tokens either way).
    ``stops``: the stop tokens and ``rollout.stop`` strings (glassrl.rollout.stops; default: the
    tokenizer's and the model's stop tokens); each call adds the call format's stop strings.
    ``versions``: the weights' versions, recorded per token (asynchronous training)."""

    def __init__(self, model, tokenizer, stops: StopSet | None = None, versions: PolicyVersions | None = None) -> None:
        self.model = model
        self.versions = versions
        self.tokenizer = tokenizer
        self.stops = stops if stops is not None else stop_set(tokenizer, getattr(model, "generation_config", None))
        self.pad_id = pad_id(tokenizer)
        self.device = next(model.parameters()).device
        self.sample_tokens, self.path = sampler_for(model)  # the decoding loop, else model.generate

    @torch.no_grad()
    def sample(
        self,
        contexts: list[list[int]],
        max_new_tokens: list[int],
        params: SamplingParams,
        generator: torch.Generator,
        stop_strings: tuple[str, ...],
        with_logprobs: bool,
    ) -> list[SampledTurn]:
        ids, mask = left_pad(contexts, self.pad_id)
        ids, mask = ids.to(self.device), mask.bool().to(self.device)  # (b, L)
        stops = self.stops.with_strings(stop_strings)
        steps = max(max_new_tokens)
        logprobs = torch.zeros((len(contexts), steps), device=self.device) if with_logprobs else None
        versions = None
        if self.versions is not None:
            versions = torch.zeros((len(contexts), steps), dtype=torch.long, device=self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            new = self.sample_tokens(
                self.model,
                ids,
                mask,
                dataclasses.replace(params, max_new_tokens=steps),
                stops=stops,
                pad_id=self.pad_id,
                generator=generator,
                logprobs_out=logprobs,
                decode_text=self.tokenizer.batch_decode,
                versions=self.versions,
                versions_out=versions,
            ).tolist()  # (b, steps)
        finally:
            self.model.train(was_training)
        if with_logprobs:
            logprobs = logprobs.tolist()
        if versions is not None:
            versions = versions.tolist()
        turns = []
        for b, row in enumerate(new):
            tokens, ended = trim_turn(row, max_new_tokens[b], stops, self.tokenizer.decode)
            turns.append(
                SampledTurn(
                    tokens,
                    ended,
                    logprobs[b][: len(tokens)] if with_logprobs else None,
                    versions[b][: len(tokens)] if versions is not None else None,
                )
            )
        return turns


@dataclass
class _Episode:
    """One response while it is being written."""

    prompt: list[int]
    record: PromptRecord
    env: Environment
    tokens: list[int] = field(default_factory=list)
    roles: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    final_text: str = ""
    done: bool = False


class AgentRolloutEngine:
    """Multi-turn rollouts with tools (module docstring); a RolloutEngine given the prompts' records.

    sampler:           samples a turn (:class:`HFTurnSampler` on the actor model)
    tokenizer:         the actor's tokenizer (decoding, the call format)
    make_environment:  a fresh environment per response (``ToolEnvironment(tools, ...)``)
    call_format:       "auto" (hermes when the chat template takes ``tools=``, else tagged),
                       "tagged" or "hermes" (:mod:`.formats`)
    describe_tools:    tagged format: describe the tools in the prompt
    max_turns:         generated turns per response, the final answer included
    tool_workers:      environments stepped at once
    sampling_logprobs: keep log π of each generated token as sampled (``rollout_logprobs``);
                       costs the logits of every step, (B, steps, V), while a turn is sampled
    """

    def __init__(
        self,
        sampler: TurnSampler,
        tokenizer,
        make_environment: Callable[[], Environment],
        *,
        call_format: str = "auto",
        describe_tools: bool = True,
        max_turns: int = 4,
        tool_workers: int = 8,
        sampling_logprobs: bool = False,
    ) -> None:
        if max_turns < 1 or tool_workers < 1:
            raise GlassrlError(
                f"agent rollout: max_turns and tool_workers must be >= 1, got {max_turns}, {tool_workers}"
            )
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.make_environment = make_environment
        self.format: CallFormat = build_call_format(tokenizer, call_format, describe_tools=describe_tools)
        self.max_turns = max_turns
        self.tool_workers = tool_workers
        self.sampling_logprobs = sampling_logprobs
        self.pad_id = pad_id(tokenizer)
        self.path = f"multi-turn agent loop ({self.format.name} calls), each turn by {sampler.path}"

    def close(self) -> None:
        """End the environments' worker processes (glassrl.agents.isolated); they start again on use."""
        close(self.make_environment)

    def format_prompts(self, records: Sequence[PromptRecord]) -> list[list[int]]:
        """Token ids of each record's prompt with its environment's tools rendered in (the call format's way)."""
        return agent_prompt_ids(self.format, self.make_environment, records)

    def generate(
        self,
        prompts: list[list[int]],
        *,
        n: int,
        params: SamplingParams,
        generator: torch.Generator,
        records: Sequence[PromptRecord] | None = None,
    ) -> RolloutBatch:
        """``prompts`` (from :meth:`format_prompts`) and their ``records`` -> len(prompts) × n
        multi-turn responses, the n of a prompt adjacent (as every RolloutEngine)."""
        if records is None:
            raise ValueError("agent rollout: needs the prompts' records (each environment is reset with its record)")
        if len(records) != len(prompts):
            raise ValueError(f"agent rollout: {len(prompts)} prompts but {len(records)} records")
        episodes = []
        for prompt, record in zip(prompts, records):
            for _ in range(n):
                episodes.append(_Episode(list(prompt), record, self.make_environment()))
        budget = params.max_new_tokens
        try:
            with ThreadPoolExecutor(max_workers=self.tool_workers, thread_name_prefix="agent-env") as pool:
                list(pool.map(lambda e: e.env.reset(e.record), episodes))  # at once: a worker's start, a slow reset
                for turn_index in range(self.max_turns):
                    running = [e for e in episodes if not e.done]
                    if not running:
                        break
                    last = turn_index == self.max_turns - 1
                    self._turn(running, budget, params, generator, pool, last)
        finally:
            for e in episodes:
                close(e.env)
        return self._batch(episodes, prompts, n)

    def _turn(
        self,
        running: list[_Episode],
        budget: int,
        params: SamplingParams,
        generator: torch.Generator,
        pool: ThreadPoolExecutor,
        last: bool,
    ) -> None:
        sampled = self.sampler.sample(
            [e.prompt + e.tokens for e in running],
            [budget - len(e.tokens) for e in running],
            params,
            generator,
            self.format.stop_strings,
            self.sampling_logprobs,
        )
        # The turn's text leaves its stop token out.
        texts = [self.tokenizer.decode(s.tokens[:-1] if s.ended == "eos" else s.tokens) for s in sampled]
        calls = [self.format.parse(t) if s.ended != "length" else [] for t, s in zip(texts, sampled)]
        # A turn cut by the budget, or calling tools in the last turn allowed, ends the response as it
        # is: its calls are not run (their results could not be read).
        futures = {
            i: pool.submit(_step, e, texts[i], calls[i])
            for i, (e, s) in enumerate(zip(running, sampled))
            if s.ended != "length" and not (last and calls[i])
        }
        for i, (e, s) in enumerate(zip(running, sampled)):
            start = len(e.tokens)
            e.tokens += s.tokens
            e.roles += [ROLE_GENERATED] * len(s.tokens)
            e.logprobs += s.logprobs if s.logprobs is not None else [0.0] * len(s.tokens)
            e.versions += s.versions if s.versions is not None else [-1] * len(s.tokens)
            result = futures[i].result() if i in futures else StepResult()
            reason, observation, obs_ids = self._outcome(e, s, result, calls[i], budget, last)
            end = len(e.tokens)
            e.tokens += obs_ids
            e.roles += [ROLE_OBSERVATION] * len(obs_ids)
            e.logprobs += [0.0] * len(obs_ids)
            e.versions += [-1] * len(obs_ids)
            e.turns.append(
                Turn(
                    start,
                    end,
                    len(e.tokens),
                    reason,
                    texts[i],
                    observation,
                    result.tool_calls,
                    result.reward_parts,
                    result.error,
                )
            )
            if reason not in ("tool_call", "continue"):
                e.done = True
                close(e.env)
                is_answer = reason in ("stop", "length") and not self.format.opens_call(texts[i])
                answer = s.tokens[:-1] if s.ended == "eos" else s.tokens  # a stop token is no text, special or not
                e.final_text = self.tokenizer.decode(answer, skip_special_tokens=True) if is_answer else ""

    def _outcome(
        self, e: _Episode, s: SampledTurn, result: StepResult, calls: list, budget: int, last: bool
    ) -> tuple[str, str, list[int]]:
        """(finish reason, observation text, observation ids) of a turn just sampled."""
        if s.ended == "length":
            return "length", "", []
        if result.error:
            return "env_error", "", []
        if result.done:
            return "stop", "", []
        if last:
            return "turn_limit", "", []
        text, ids = self.format.observation(result.observations) if result.observations else ("", [])
        if len(e.tokens) + len(ids) >= budget:  # no room for the observation and one more token
            return "length", "", []
        return ("tool_call" if calls else "continue"), text, ids

    def _batch(self, episodes: list[_Episode], prompts: list[list[int]], n: int) -> RolloutBatch:
        device = self.sampler.device
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_id)
        T = max(1, max(len(e.tokens) for e in episodes))

        def rows(values: list[list], fill) -> list[list]:
            return [v + [fill] * (T - len(v)) for v in values]

        roles = torch.tensor(rows([e.roles for e in episodes], ROLE_PAD), dtype=torch.int8)  # (B, T)
        rollout_logprobs = policy_versions = None
        if self.sampling_logprobs:
            rollout_logprobs = torch.tensor(rows([e.logprobs for e in episodes], 0.0), dtype=torch.float32)
        if getattr(self.sampler, "versions", None) is not None:
            policy_versions = torch.tensor(rows([e.versions for e in episodes], -1), dtype=torch.long)
        return RolloutBatch(
            prompt_ids=prompt_ids.repeat_interleave(n, dim=0).to(device),  # (B, P)
            prompt_mask=prompt_mask.repeat_interleave(n, dim=0).to(device),  # (B, P)
            response_ids=torch.tensor(rows([e.tokens for e in episodes], self.pad_id), dtype=torch.long).to(device),
            response_mask=(roles == ROLE_GENERATED).to(device),
            group_index=torch.arange(len(prompts), device=device).repeat_interleave(n),
            finish_reasons=[e.turns[-1].finish_reason for e in episodes],
            texts=[e.final_text for e in episodes],
            response_context_mask=(roles != ROLE_PAD).to(device),
            turns=[tuple(e.turns) for e in episodes],
            rollout_logprobs=None if rollout_logprobs is None else rollout_logprobs.to(device),
            policy_versions=None if policy_versions is None else policy_versions.to(device),
        )


def _step(e: _Episode, text: str, calls: list) -> StepResult:
    try:
        return e.env.step(text, calls)
    except Exception as err:  # noqa: BLE001 - named with its record, then the rollout stops
        raise GlassrlError(f"{e.record.source}: environment {type(e.env).__name__}.step raised {err!r}") from err


def agent_prompt_ids(
    call_format: CallFormat, make_environment: Callable[[], Environment], records: Sequence[PromptRecord]
) -> list[list[int]]:
    """Token ids of each record's prompt with the tools of its environment (fresh, reset with the
    record) rendered in by ``call_format``: what :meth:`AgentRolloutEngine.format_prompts` returns,
    for callers that format prompts without a sampler (the trainer's length rule)."""
    prompts = []
    for record in records:
        env = make_environment()
        try:
            env.reset(record)
            prompts.append(call_format.prompt_ids(record.prompt, env.tools))
        finally:
            close(env)
    return prompts


def close(env: Environment) -> None:
    """Let an environment go (one in a worker process gives its worker back); nothing for one without ``close``."""
    closer = getattr(env, "close", None)
    if callable(closer):
        closer()


def reward_parts(turns: Sequence[Turn]) -> dict[str, float]:
    """The episode's reward parts: each name summed over its turns."""
    total: dict[str, float] = {}
    for turn in turns:
        for name, value in turn.reward_parts.items():
            total[name] = total.get(name, 0.0) + float(value)
    return total
