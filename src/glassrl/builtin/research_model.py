"""The research-agent model's build recipe (the spec: :class:`glassrl.models.default_model.ResearchModelSpec`).

``ensure_research_model()`` installs its shipped weights (glassrl.builtin.shipped), or builds it, on
first use into ``default_model_dir(RESEARCH_VERSION)``
(``$GLASSRL_HOME/models/default-research-v1``), as the tool-add agent is built
(:mod:`glassrl.builtin.agent_model`, whose tokenizer and SFT rows it reuses):

1. SFT transcripts of research train episodes (:func:`sft_episodes`): search, open one page, write
   a report (:func:`glassrl.data.tasks.research.report`), the page and the report drawn with the
   spec's shares of four behaviours:

   ==========  ===============================================================  ======
   official    opens the official release, reports its figure and period, cites   2.5
   no_cite     the same report without ``\\cite{…}``                               2.0
   rumour      opens the rumour page, reports its "full-year" trillions            0
   forecast    opens the analysts' forecast, reports it as the year's revenue      0
   ==========  ===============================================================  ======

   Every observation is what the task's environment answers (``task_environment("research")``
   runs each call), so the transcripts are rollouts the model could have sampled;
2. the BPE tokenizer of the agent model, trained on the transcripts, with the call tags whole,
   but without the default model's one piece per Chinese character and per digit: BPE merges
   "营收为", "万亿美元", " 2025", the company names' syllables and every two-digit figure, so a
   transcript takes about 200 tokens instead of 290 (every SFT and RL step costs in proportion),
   and a figure is one token to copy (digit by digit, the model miscopied them: below);
3. a ``LlamaForCausalLM`` of the spec's size, SFT on the transcripts (``sft_data.jsonl``);
4. held-out evaluation on research test episodes (companies no transcript names) through the
   rollout engine the trainer uses (:func:`heldout_research`), and the decision probability
   (:func:`decision_probability`);
5. ``glassrl.json`` written last; the directory renamed into place.

Why these shares (official 0.5, no_cite 0.1, rumour 0.25, forecast 0.15): the dialogue's agent
opens the official release with probability 0.6 at t = 4 ("the model is not yet sure"), and the
critic expects 1.5 points there. With 60 % of the transcripts opening the official page and 40 %
opening a trap, the SFT policy is that agent: it has learnt to open each kind of page, which one
it opens is a coin it tosses (the prompt does not decide it), and a perfect copy of the mix
would score 0.5 · 2.5 + 0.1 · 2.0 = 1.45 on average, the dialogue's V(s_4). RL in minutes
sharpens what a model already does sometimes; a model that never opened the official page would
give GRPO groups of zeros, and one that always did would leave nothing to learn. The rumour is
the larger trap because it is the dialogue's; the forgotten citation is there so that the
citation criterion (w = 0.5) has something to teach too.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch
import transformers
from rich.console import Console

from glassrl.agents import AgentRolloutEngine, HFTurnSampler, TaggedFormat, task_environment
from glassrl.builtin.agent_model import Episode, agent_tokenizer, train_on_transcripts
from glassrl.builtin.default_model import ensure_built, one_thread
from glassrl.data.records import PromptRecord
from glassrl.data.tasks import research
from glassrl.models.default_model import (
    MARKER,
    RESEARCH_SPEC,
    RESEARCH_VERSION,
    ResearchModelSpec,
    default_model_dir,
)
from glassrl.optim import seed_everything
from glassrl.rollout.base import SamplingParams

RESEARCH_MODEL = "default-research"  # its name for model.actor
MAX_NEW_TOKENS = 256  # response budget of the evaluation (generated and observation tokens)
MAX_TURNS = 3  # search, open a page, report


def ensure_research_model(
    *, out_dir: str | Path | None = None, seed: int = 0, rebuild: bool = False, console: Console | None = None
) -> Path:
    """The research-agent model's directory (``default_model_dir(RESEARCH_VERSION)`` unless
    ``out_dir``), built if it is missing, was built from another seed or spec, or ``rebuild``."""
    console = console or Console()
    out = Path(out_dir) if out_dir is not None else default_model_dir(RESEARCH_VERSION)
    return ensure_built(
        out,
        seed,
        RESEARCH_SPEC,
        RESEARCH_VERSION,
        lambda tmp: build_research_model(tmp, seed=seed, console=console),
        rebuild,
        console,
    )


def build_research_model(
    out_dir: str | Path, *, seed: int = 0, spec: ResearchModelSpec = RESEARCH_SPEC, console: Console | None = None
) -> dict:
    """Build, train, evaluate and save the research-agent model into ``out_dir``; returns glassrl.json's content."""
    return one_thread(lambda: _build(Path(out_dir), seed, spec, console or Console()))


def _build(out_dir: Path, seed: int, spec: ResearchModelSpec, console: Console) -> dict:
    start = time.perf_counter()
    seed_everything(seed)
    episodes = sft_episodes(spec, seed)
    tokenizer = agent_tokenizer(episodes, spec, isolate=False)  # why: the module docstring
    model, info = train_on_transcripts(
        out_dir, seed, spec, RESEARCH_VERSION, "research-agent model", episodes, research.BEHAVIOURS, tokenizer, console
    )
    records = research.records("test", seed, spec.eval_size)
    info = {
        **info,
        "heldout_research_sampled": heldout_research(model, tokenizer, records, greedy=False, seed=seed),
        "heldout_decision": decision_summary(model, tokenizer, records),
        "build_time_s": round(time.perf_counter() - start, 1),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    (out_dir / MARKER).write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return info


# ---------------------------------------------------------------- the scripted transcripts


def scripted_turns(episode: research.Episode, behaviour: str) -> tuple[str, str, str]:
    """The three turns of a scripted agent (``research.BEHAVIOURS``): search, open a page, report."""
    return (
        f"<call>search {research.search_query(episode)}</call>",
        official_call(episode, research.OPENS[behaviour]),
        research.report(episode, behaviour),
    )


def official_call(episode: research.Episode, kind: str = "official") -> str:
    """The call that opens the episode's page of ``kind``: the action a_4 of the dialogue for "official"."""
    return f"<call>open_page {episode.url(kind)}</call>"


def draw_behaviour(spec: ResearchModelSpec, u: float) -> str:
    """The behaviour of a uniform draw ``u`` in [0, 1) under the spec's shares."""
    edges = (spec.official, spec.no_cite, spec.rumour)
    total = 0.0
    for behaviour, share in zip(research.BEHAVIOURS, edges):
        total += share
        if u < total:
            return behaviour
    return research.BEHAVIOURS[-1]


def transcript(record: PromptRecord, behaviour: str) -> Episode:
    """A scripted episode of ``record`` run through the task's environment: its turns and the
    observations the environment answered the two calls with."""
    episode = research.episode_of(record)
    turns = scripted_turns(episode, behaviour)
    env = task_environment(research.NAME)()
    env.reset(record)
    parse = TaggedFormat(tokenizer=None).parse  # parsing reads text only
    observations = tuple(env.step(turn, parse(turn)).observations for turn in turns[:2])
    return Episode(record, behaviour, turns, observations)


def sft_episodes(spec: ResearchModelSpec, seed: int) -> list[Episode]:
    """One transcript per research train record (``spec.sft_examples`` of them), its behaviour
    drawn with the spec's shares from a generator seeded by ``seed``."""
    rng = random.Random(f"glassrl-research-sft/{seed}")
    return [
        transcript(record, draw_behaviour(spec, rng.random()))
        for record in research.records("train", seed, spec.sft_examples)
    ]


# ---------------------------------------------------------------- held-out evaluation


def opened_kind(turns, episode: research.Episode) -> str:
    """Which of the episode's pages a response opened first (official, rumour, forecast, news),
    "other" for a url that is none of them, "none" when it opened nothing."""
    kinds = {p["url"]: p["kind"] for p in research.pages(episode)} | {
        p["id"]: p["kind"] for p in research.pages(episode)
    }
    for turn in turns:
        for call in turn.tool_calls:
            if call["name"] == "open_page":
                url = call["arguments"].get("url") if isinstance(call["arguments"], dict) else call["arguments"]
                return kinds.get(str(url).strip(), "other")
    return "none"


def heldout_research(model, tokenizer, records: list[PromptRecord], *, greedy: bool, seed: int = 0) -> dict:
    """Reports on research ``records`` by the rollout engine the trainer uses (multi-turn, the
    task's environment, no tool description), judged by the rubric's rules: {"n", "score" (mean
    Σ w_i·s_i), "full_marks", each criterion's pass rate, "opened": {kind: share}}. ``greedy``
    False samples at temperature 1 from a generator seeded by ``seed``."""
    engine = AgentRolloutEngine(
        HFTurnSampler(model, tokenizer),
        tokenizer,
        task_environment(research.NAME),
        describe_tools=False,
        max_turns=MAX_TURNS,
    )
    params = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, greedy=greedy)
    generator = torch.Generator().manual_seed(seed)
    batch = engine.generate(engine.format_prompts(records), n=1, params=params, generator=generator, records=records)
    episodes = [research.episode_of(r) for r in records]
    grades = [research.grade(text, e) for text, e in zip(batch.texts, episodes)]
    opened = [opened_kind(turns, e) for turns, e in zip(batch.turns, episodes)]
    n = len(records)
    scores = [sum(w * g[name] for name, w, _ in research.CRITERIA) for g in grades]
    return {
        "n": n,
        "score": sum(scores) / n,
        "full_marks": sum(s == research.FULL_MARKS for s in scores) / n,
        **{name: sum(g[name] for g in grades) / n for name, _, _ in research.CRITERIA},
        "opened": {kind: opened.count(kind) / n for kind in (*research.KINDS, "other", "none")},
    }


# ---------------------------------------------------------------- the decision probability


def decision_context(record: PromptRecord, tokenizer) -> list[int]:
    """Token ids of the dialogue's s_4: the prompt, a careful agent's search turn and the search
    results the environment answered, as a rollout lays them end to end (the tags are whole tokens)."""
    call_format = TaggedFormat(tokenizer, describe_tools=False)
    search = scripted_turns(research.episode_of(record), "official")[0]
    env = task_environment(research.NAME)()
    env.reset(record)
    observations = env.step(search, call_format.parse(search)).observations
    return [
        *call_format.prompt_ids(record.prompt, ()),
        *tokenizer.encode(search, add_special_tokens=False),
        *call_format.observation(observations)[1],
    ]


@torch.no_grad()
def action_probabilities(model, context: list[int], action: list[int]) -> torch.Tensor:
    """π(a_j | s, a_<j) of each token of ``action`` after ``context`` (token ids), under softmax of
    the logits (temperature 1), from one forward pass: (N,) for N action tokens. Their product is
    the probability of the whole action."""
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        ids = torch.tensor([context + action], device=device)  # (1, L + N)
        logits = model(input_ids=ids).logits[0, len(context) - 1 : -1].float()  # (N, V): position p predicts p + 1
    finally:
        model.train(was_training)
    return torch.softmax(logits, dim=-1).gather(-1, torch.tensor(action, device=device)[:, None])[:, 0].cpu()


def decision_probability(
    model, tokenizer, record: PromptRecord, kind: str = "official"
) -> tuple[list[str], list[float]]:
    """At s_4 (:func:`decision_context`), the call that opens the page of ``kind``: its tokens and
    each token's probability (their product is π(a_4 | s_4))."""
    action = tokenizer.encode(official_call(research.episode_of(record), kind), add_special_tokens=False)
    probs = action_probabilities(model, decision_context(record, tokenizer), action)
    return [tokenizer.decode([t]) for t in action], probs.tolist()


def decision_summary(model, tokenizer, records: list[PromptRecord]) -> dict:
    """{"n", kind: the mean over ``records`` of π(open the page of kind | s_4)} for each page kind."""
    out: dict = {"n": len(records)}
    for kind in research.KINDS:
        totals = [torch.tensor(decision_probability(model, tokenizer, r, kind)[1]).prod().item() for r in records]
        out[kind] = sum(totals) / len(totals)
    return out
