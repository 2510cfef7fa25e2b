"""The tool-using agent model's build recipe (the spec: :class:`glassrl.models.default_model.AgentModelSpec`).

``ensure_agent_model()`` installs its shipped weights (glassrl.builtin.shipped), or builds it, on
first use into ``default_model_dir(AGENT_VERSION)`` (``$GLASSRL_HOME/models/default-agent-v1``),
as the default model is (:mod:`glassrl.builtin.default_model`, same cache rules):

1. SFT transcripts of the tool-add train split (:func:`sft_episodes`), each answered one of
   three ways, drawn with the spec's shares:

   ==========  ==========================================================================
   call        ``<call>calculator 4821+975</call>`` `` <result>5796</result>\\n`` ``5796``
   malformed   a call that fails (unknown tool, cut expression, bad JSON, no argument), its
               ``<result>error: …</result>``, then the sum worked out in its head
   head        the sum worked out in its head: ``5796``
   ==========  ==========================================================================

   Every observation is what the real environment answers (``task_environment("tool-add")``
   runs each call), so the transcripts are rollouts the model could have sampled;
2. a byte-level BPE tokenizer trained on the transcripts' text (:mod:`glassrl.models.default_tokenizer`),
   with the call format's tags (``TAGS``) added as whole tokens;
3. a ``LlamaForCausalLM`` of the spec's size, SFT on the transcripts (``sft_data.jsonl``);
4. held-out evaluation on the tool-add test split through the rollout engine the trainer uses
   (:func:`heldout_tool_use`): greedy, and sampled at temperature 1;
5. ``glassrl.json`` written last; the directory renamed into place.

Why these shares: RL in minutes sharpens what a model already does sometimes. The model
learns three behaviours; which one it picks is a coin it tosses, not something the prompt
decides, so GRPO's groups hold responses that call the tool and responses that do not, and
the reward (1 for the right sum, 0.1 for a call that ran) tells them apart. A 4-digit sum in
its head is almost always wrong for a model this small; a call is right when the model copies
the operands into it and the result out of it. Measured on the built model (seed 0, 200
test prompts, glassrl.json, the observation written `` <result>…</result>\\n`` since 2026-11-28):
sampled at temperature 1, 33.5 % valid calls and 15.5 % correct answers; greedy, 72.0 % and
41.5 % (the call is the single most likely first token; before the observation's space and
newline, 34.5 % and 17.5 % sampled, 78.5 % and 50.5 % greedy).

Why 2 layers and not the default model's 4: the answers are copies (operands into the call,
the result into the answer), and copying is what a small model learns slowest. Measured on the
same transcripts (the answer of 200 call transcripts, teacher-forced, wholly right): on one
schedule, 4 layers copied none after 200 SFT steps and 2 layers 56 %; a 4-layer model after 600
steps answered 0.5 % of the test prompts right; the model built here (2 layers, 8 heads) copies
75 % after its 800 steps, at half the 4-layer cost per step. What stays wrong is mostly a 3- or
5-digit number copied as if it had the usual 4 digits.

Why the tags are whole tokens: the rollout encodes each observation on its own
(:meth:`glassrl.agents.formats.TaggedFormat.observation`) and appends it to the sampled
tokens; SFT encodes the transcript in one piece. The observation's space and newline already keep
its text from merging with the turns around it (formats' docstring); as added tokens the tags also
split the text first, and are one token each to copy, so the transcript's tokens are exactly the
turns' and the observations' tokens laid end to end (tested).

The SFT loss covers the whole response, observation tokens included (:mod:`glassrl.supervised.sft`
has no mask for them): the model also learns to predict the calculator's answer after
``<result>``, which never matters at rollout, where the environment writes it.
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from rich.console import Console
from tokenizers import AddedToken
from transformers import LlamaForCausalLM

from glassrl.agents import AgentRolloutEngine, HFTurnSampler, TaggedFormat, task_environment
from glassrl.agents.metrics import tool_use
from glassrl.builtin.default_model import ensure_built, one_thread
from glassrl.data import tasks
from glassrl.data.records import PromptRecord
from glassrl.models.default_model import (
    AGENT_SPEC,
    AGENT_VERSION,
    MARKER,
    AgentModelSpec,
    default_model_dir,
    llama_config,
    spec_json,
)
from glassrl.models.default_tokenizer import build_tokenizer
from glassrl.optim import OptimConfig, seed_everything
from glassrl.rollout.base import SamplingParams
from glassrl.supervised.sft import SFTConfig, train_sft

AGENT_MODEL = "default-agent"  # its name for model.actor
TAGS = ("<call>", "</call>", "<result>", "</result>")  # the tagged call format's (glassrl.agents.formats)
BEHAVIOURS = ("call", "malformed", "head")
# A failed call as a small model writes one, for a+b: each is answered with an error by the environment.
MALFORMED = (
    "<call>calc {a}+{b}</call>",  # unknown tool
    "<call>calculator {a}+</call>",  # cut expression
    '<call>calculator {{"expression": {a}+{b}}}</call>',  # bad JSON: the expression is not a string
    "<call>calculator</call>",  # no argument
)
_TAG_SPLIT = re.compile("|".join(re.escape(t) for t in TAGS))
MAX_NEW_TOKENS = 64  # response budget of the evaluation (generated and observation tokens)


@dataclass(frozen=True)
class Episode:
    """One SFT transcript: the record, how it answers, its generated turns and the observations
    the environment answered the non-final turns with (one string per call, as the tool wrote it)."""

    record: PromptRecord
    behaviour: str
    turns: tuple[str, ...]
    observations: tuple[tuple[str, ...], ...]


def ensure_agent_model(
    *, out_dir: str | Path | None = None, seed: int = 0, rebuild: bool = False, console: Console | None = None
) -> Path:
    """The agent model's directory (``default_model_dir(AGENT_VERSION)`` unless ``out_dir``), built
    if it is missing, was built from another seed or spec, or ``rebuild``."""
    console = console or Console()
    out = Path(out_dir) if out_dir is not None else default_model_dir(AGENT_VERSION)
    return ensure_built(
        out,
        seed,
        AGENT_SPEC,
        AGENT_VERSION,
        lambda tmp: build_agent_model(tmp, seed=seed, console=console),
        rebuild,
        console,
    )


def build_agent_model(
    out_dir: str | Path, *, seed: int = 0, spec: AgentModelSpec = AGENT_SPEC, console: Console | None = None
) -> dict:
    """Build, train, evaluate and save the agent model into ``out_dir``; returns glassrl.json's content."""
    return one_thread(lambda: _build(Path(out_dir), seed, spec, console or Console()))


def _build(out_dir: Path, seed: int, spec: AgentModelSpec, console: Console) -> dict:
    start = time.perf_counter()
    seed_everything(seed)
    episodes = sft_episodes(spec, seed)
    tokenizer = agent_tokenizer(episodes, spec)
    # eval_data: a JSONL has no test split; held out are the tool-add test prompts, answered below
    model, info = train_on_transcripts(
        out_dir, seed, spec, AGENT_VERSION, "agent model", episodes, BEHAVIOURS, tokenizer, console
    )
    records = tasks.load_task(spec.task, "test", seed=seed, size=spec.eval_size)
    info = {
        **info,
        "heldout_tool_add_greedy": heldout_tool_use(model, tokenizer, records, greedy=True, seed=seed),
        "heldout_tool_add_sampled": heldout_tool_use(model, tokenizer, records, greedy=False, seed=seed),
        "build_time_s": round(time.perf_counter() - start, 1),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    (out_dir / MARKER).write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return info


def train_on_transcripts(
    out_dir: Path,
    seed: int,
    spec,
    version: str,
    label: str,
    episodes: list[Episode],
    behaviours: tuple[str, ...],
    tokenizer,
    console: Console,
) -> tuple[LlamaForCausalLM, dict]:
    """A fresh Llama of ``spec``'s size (weights seeded by ``seed``), SFT on the transcripts
    (written to ``out_dir/sft_data.jsonl``), on one CPU thread for bit-identical builds; returns it
    and glassrl.json's first fields (version, seed, spec, size, SFT steps, the share of each of
    ``behaviours``, loss)."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(spec, tokenizer))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    n_params = sum(p.numel() for p in model.parameters())
    console.print(f"{label}: {n_params:,} parameters, vocabulary {len(tokenizer)}")

    rows = sft_rows(episodes, tokenizer)
    share = {b: sum(e.behaviour == b for e in episodes) / len(episodes) for b in behaviours}
    data = out_dir / "sft_data.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    sft = SFTConfig(
        model=f"fresh LlamaForCausalLM ({version}, seed {seed})",
        data=str(data),
        eval_data=None,  # held out are the task's test prompts, answered by the caller
        seed=seed,
        steps=spec.sft_steps,
        batch_size=spec.batch_size,
        max_length=spec.max_position_embeddings,
        optim=OptimConfig(
            lr=spec.lr, warmup_steps=spec.warmup_steps, decay="cosine", weight_decay=spec.weight_decay, grad_clip=1.0
        ),
        output_dir=str(out_dir),
        log_every=50,
        device="cpu",  # bit-identical builds (glassrl.builtin.default_model)
        threads=1,  # the build's one thread (glassrl.builtin.default_model.one_thread), not the free cores
    )
    metrics = train_sft(sft, model=model, tokenizer=tokenizer, console=console)
    info = {
        "version": version,
        "seed": seed,
        "spec": spec_json(spec),
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        "sft_steps": spec.sft_steps,
        "sft_behaviours": share,
        "train_loss": metrics["train/loss"],
    }
    return model, info


def sft_episodes(spec: AgentModelSpec, seed: int) -> list[Episode]:
    """One transcript per tool-add train record (``spec.sft_examples`` of them), its behaviour
    drawn with the spec's shares from a generator seeded by ``seed``; every call is run by the
    task's environment."""
    rng = random.Random(f"glassrl-agent-sft/{seed}")
    make_env = task_environment(spec.task)
    parse = TaggedFormat(tokenizer=None).parse  # parsing reads text only
    episodes = []
    for record in tasks.load_task(spec.task, "train", seed=seed, size=spec.sft_examples):
        a, b, answer = record.metadata["a"], record.metadata["b"], str(record.metadata["sum"])
        u = rng.random()
        behaviour = (
            "call" if u < spec.valid_call else "malformed" if u < spec.valid_call + spec.malformed_call else "head"
        )
        if behaviour == "head":
            episodes.append(Episode(record, behaviour, (answer,), ()))
            continue
        call = f"<call>calculator {a}+{b}</call>" if behaviour == "call" else rng.choice(MALFORMED).format(a=a, b=b)
        env = make_env()
        env.reset(record)
        result = env.step(call, parse(call))
        episodes.append(Episode(record, behaviour, (call, answer), (result.observations,)))
    return episodes


def training_texts(episodes: list[Episode]) -> list[str]:
    """The transcripts' text without the tags (they are whole tokens: they need no merges)."""
    texts = []
    for e in episodes:
        pieces = [str(e.record.prompt), *e.turns, *(r for obs in e.observations for r in obs)]
        texts += [part for piece in pieces for part in _TAG_SPLIT.split(piece) if part]
    return texts


def agent_tokenizer(episodes: list[Episode], spec: AgentModelSpec, *, isolate: bool = True):
    """The BPE tokenizer of :mod:`glassrl.models.default_tokenizer` trained on the transcripts,
    with ``TAGS`` added as whole tokens (not special: decoding keeps them, as the call parser needs).
    ``isolate``: that tokenizer's one piece per Chinese character and per digit."""
    tokenizer = build_tokenizer(
        training_texts(episodes),
        vocab_size=spec.vocab_size,
        model_max_length=spec.max_position_embeddings,
        isolate=isolate,
    )
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in TAGS])
    return tokenizer


def response_text(episode: Episode, call_format: TaggedFormat) -> str:
    """The transcript after the prompt: each turn, then its observation as the format renders it."""
    parts = []
    for i, turn in enumerate(episode.turns):
        parts.append(turn)
        if i < len(episode.observations):
            parts.append(call_format.observation(episode.observations[i])[0])
    return "".join(parts)


def sft_rows(episodes: list[Episode], tokenizer) -> list[dict]:
    """{"prompt", "response", "behaviour"} per transcript: what ``glassrl sft`` reads (it ignores "behaviour")."""
    call_format = TaggedFormat(tokenizer, describe_tools=False)
    return [
        {"prompt": e.record.prompt, "response": response_text(e, call_format), "behaviour": e.behaviour}
        for e in episodes
    ]


def heldout_tool_use(model, tokenizer, records: list[PromptRecord], *, greedy: bool, seed: int = 0) -> dict:
    """Answers to tool-add ``records`` by the rollout engine the trainer uses (multi-turn, the
    task's environment, no tool description): {"n", "valid_call", "correct"}, fractions of the
    records. ``greedy`` False samples at temperature 1 from a generator seeded by ``seed``."""
    engine = AgentRolloutEngine(
        HFTurnSampler(model, tokenizer), tokenizer, task_environment(tasks.tool_add.NAME), describe_tools=False
    )
    params = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, greedy=greedy)
    generator = torch.Generator().manual_seed(seed)
    batch = engine.generate(engine.format_prompts(records), n=1, params=params, generator=generator, records=records)
    valid = [tool_use(turns)[1] for turns in batch.turns]
    correct = [tasks.tool_add.grade(text, r) for text, r in zip(batch.texts, records)]
    n = len(records)
    return {"n": n, "valid_call": sum(valid) / n, "correct": sum(correct) / n}
