"""``glassrl audit``: episodes of a run's environment, call format and chat template, sampled by the
model or a script, and checked (glassrl.diagnose.episode_audit holds the checks).

    audits = audit_run(cfg, episodes=4, script=["<call>calculator 1+2</call>", "3"])
    print("\\n".join(table(audits)))

``red_team_config`` is ``glassrl audit --reward``: the run's reward scored on mutations of real responses
(glassrl.diagnose.reward_redteam), the gold being reward.gold or, for a bundled task, its verifier.

The environment is the run's (rollout.agent.environment, rollout.agent.tools or data.train's agentic
task: glassrl.rl.build.environment_maker), the prompts the first ``episodes`` of data.train's first
source, the tokenizer model.actor's (its chat template replaced by ``chat_template`` when given),
the turn limit and token budget rollout.agent.max_turns and rollout.max_new_tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch

from glassrl.agents import AgentRolloutEngine, HFTurnSampler
from glassrl.data.chat_template import use_template
from glassrl.data.datasets import load_prompts
from glassrl.data.records import PromptRecord
from glassrl.data.sources import Source, parse_sources
from glassrl.data.tasks import load_task, parse_task, record_for_prompt
from glassrl.diagnose.episode_audit import EpisodeAudit, Recorder, ScriptedTurns, audit_batch
from glassrl.diagnose.reward_redteam import RedTeamReport, Sample, red_team
from glassrl.errors import GlassrlError
from glassrl.ledger.model import read_jsonl
from glassrl.models.loading import load_causal_lm, load_tokenizer
from glassrl.rewards.base import RewardRequest, RewardResult
from glassrl.rewards.tasks import TASK_VERIFIERS
from glassrl.rl.build import actor_path, build_gold, build_reward, endpoint_engine, environment_maker
from glassrl.rl.config import TrainConfig, agent_config
from glassrl.rollout.base import SamplingParams


def audit_run(
    cfg: TrainConfig,
    *,
    episodes: int,
    script: Sequence[str] | None = None,
    chat_template: str | None = None,
    template_source: str = "--chat-template",
    console=None,
) -> list[EpisodeAudit]:
    """Run ``episodes`` episodes (module docstring) and check each; the model samples unless ``script``
    gives the turns."""
    agent = agent_config(cfg)
    if agent is None:
        raise GlassrlError(
            "not a multi-turn run: set rollout.agent.environment or rollout.agent.tools, "
            "or data.train to an agentic task (task:tool-add, task:research)"
        )
    if episodes < 1:
        raise GlassrlError(f"--episodes: expected a number >= 1, got {episodes}")
    path = actor_path(cfg, console)
    tokenizer = load_tokenizer(path)
    if chat_template is not None:
        use_template(tokenizer, chat_template, template_source)
    if script is not None:
        sampler = ScriptedTurns(tokenizer, script)
    else:
        sampler = HFTurnSampler(load_causal_lm(path, device=cfg.model.device), tokenizer)
    if agent.endpoint is not None:
        return _audit_endpoint(cfg, agent, sampler, tokenizer, episodes)
    recorder = Recorder(environment_maker(cfg, agent))
    engine = AgentRolloutEngine(
        sampler,
        tokenizer,
        recorder,
        call_format=agent.call_format,
        describe_tools=agent.describe_tools,
        max_turns=agent.max_turns,
        tool_workers=agent.tool_workers,
    )
    records = _records(cfg, episodes)
    r = cfg.rollout
    params = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)
    batch = engine.generate(
        engine.format_prompts(records),
        n=1,
        params=params,
        generator=torch.Generator().manual_seed(cfg.seed),
        records=records,
    )
    return audit_batch(
        batch, records, recorder, engine.format, tokenizer, max_turns=agent.max_turns, budget=r.max_new_tokens
    )


def _audit_endpoint(cfg: TrainConfig, agent, sampler, tokenizer, episodes: int) -> list[EpisodeAudit]:
    """The user's agent over the endpoint (rollout.agent.endpoint), each captured sample checked as a native
    episode is: its masks, and the conversation the agent sent (its first call's messages, each turn as the
    assistant's message, the tool messages it sent after) re-rendered against the captured ids."""
    engine = endpoint_engine(cfg, agent, sampler, tokenizer, False)
    records = _records(cfg, episodes)
    r = cfg.rollout
    params = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)
    try:
        batch = engine.generate(
            [[]] * len(records), n=1, params=params, generator=torch.Generator().manual_seed(cfg.seed), records=records
        )
    finally:
        engine.close()
    rows = [
        replace(records[g], prompt=s.messages) for g, s in zip(batch.group_index.tolist(), engine.samples)
    ]  # each sample's own opening messages
    captured = SimpleNamespace(made=[SimpleNamespace(steps=s.steps, tools=s.tools) for s in engine.samples])
    return audit_batch(
        batch, rows, captured, engine.format, tokenizer, max_turns=agent.max_turns, budget=r.max_new_tokens
    )


def _records(cfg: TrainConfig, episodes: int | None) -> list[PromptRecord]:
    """The first ``episodes`` prompts of data.train's first source (all of them: None)."""
    d = cfg.data
    keys = None if d.metadata_keys is None else tuple(d.metadata_keys)
    defaults = Source("", prompt_key=d.prompt_key, answer_key=d.answer_key, metadata_keys=keys)
    source = parse_sources(d.train, "data.train", defaults)[0]
    if (ref := parse_task(source.path)) is not None:
        return load_task(ref.name, ref.split, size=episodes)  # None: the split's size, as the trainer reads it
    return load_prompts(
        source.path, prompt_key=source.prompt_key, answer_key=source.answer_key, metadata_keys=source.metadata_keys
    )[slice(episodes)]


class TaskGold:
    """The bundled tasks' verifiers as one source: each record judged by its task's (score 1.0 = correct)."""

    name = "task-verifier"

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        return [TASK_VERIFIERS[r.record.metadata["task"]].score([r])[0] for r in requests]


def red_team_config(
    cfg: TrainConfig, *, samples: int, console=None, run: Path | None = None, top: int = 32
) -> list[RedTeamReport]:
    """``glassrl audit --reward``: the first ``samples`` prompts of data.train with their reference answers
    as the real responses, mutated and scored by reward.sources; the gold is reward.gold, else the bundled
    task's verifier, else none (every mutation that should earn nothing is then taken as wrong). With
    ``run``, a second report: the ``top`` best-paid responses of that run's ledgers (:func:`policy_top_samples`),
    judged by the gold themselves and mutated likewise."""
    if samples < 1:
        raise GlassrlError(f"--samples: expected a number >= 1, got {samples}")
    records = [r for r in _records(cfg, samples) if r.answer]
    if not records:
        raise GlassrlError("data.train: no prompt has a reference answer to mutate (data.answer_key)")
    gold = build_gold(cfg)
    if gold is None and all(r.metadata.get("task") in TASK_VERIFIERS for r in records):
        gold = TaskGold()
    if console is not None:
        console.print(
            f"reward red-team: {len(records)} reference answers of data.train, reward.sources "
            f"({', '.join(s['name'] for s in cfg.reward.sources)}), gold: "
            + (getattr(gold, "name", "reward.gold") if gold is not None else "none (mutations taken as wrong)"),
            markup=False,
            soft_wrap=True,
        )
    pool = [Sample(_prompt_text(r), r.answer, r) for r in records]
    reward = build_reward(cfg)
    reports = [red_team(reward, gold, pool)]
    if run is not None:
        own, line = policy_top_samples(cfg, run, top)
        if console is not None:
            console.print(line, markup=False, soft_wrap=True)
        title = f"the policy's {len(own)} best-paid responses ({run}) and their mutations"
        level = reports[0].paid_right  # what a right reference answer is paid
        reports.append(red_team(reward, gold, own, judge_originals=True, title=title, right_level=level))
    return reports


def policy_top_samples(cfg: TrainConfig, run_dir: Path, top: int) -> tuple[list[Sample], str]:
    """The ``top`` best-paid distinct responses of a run's ledgers (``ledgers/step_*.jsonl``: the policy's
    own samples, as its reward scored them while training), each with its data.train record (matched by
    the prompt's text; a bundled task's typed prompt by its form) — and a line saying what was read."""
    if top < 1:
        raise GlassrlError(f"--top: expected a number >= 1, got {top}")
    files = sorted((run_dir / "ledgers").glob("step_*.jsonl"))
    if not files:
        raise GlassrlError(f"--run {run_dir}: no ledgers/step_*.jsonl (a run with logging.ledger_every > 0)")
    seen: dict[tuple[str, str], float] = {}
    for path in files:
        for response in read_jsonl(path).responses:
            if response.score is not None:
                key = (response.prompt, response.response)
                seen[key] = max(seen.get(key, -math.inf), response.score)
    by_prompt = {_prompt_text(r): r for r in _records(cfg, None)}
    best = sorted(seen.items(), key=lambda item: -item[1])
    samples, unmatched = [], 0
    for (prompt, response), _ in best:
        record = by_prompt.get(prompt) or record_for_prompt(prompt)
        if record is None:
            unmatched += 1
            continue
        samples.append(Sample(prompt, response, record))
        if len(samples) == top:
            break
    if not samples:
        raise GlassrlError(f"--run {run_dir}: no ledger response's prompt is a prompt of data.train ({unmatched} read)")
    line = (
        f"the policy's own: the {len(samples)} best-paid of {len(seen)} distinct responses in {len(files)} ledgers "
        f"of {run_dir}" + (f" ({unmatched} with a prompt not in data.train left out)" if unmatched else "")
    )
    return samples, line


def _prompt_text(record: PromptRecord) -> str:
    """A record's prompt as text: itself, or its chat messages' contents one per line."""
    if isinstance(record.prompt, str):
        return record.prompt
    return "\n".join(str(m.get("content", "")) for m in record.prompt)
