"""The prompts of a run: the training stream, the test records, the chat template, the length limit.

    prompts = build_prompts(cfg, tokenizer, model_path)    # GlassrlError naming the key, file, row
    batch = prompts.train.take(8)                          # PromptStream, or MixtureStream
    ids = prompts.ids(batch)                               # what the policy sees, within the limit

Each source (``data.train``, each entry of a mixture, ``data.test``) goes through the same steps:

1. read: a bundled task (``task:NAME[/SPLIT]``) or a dataset file, with its reading keys
   (glassrl.data.datasets; dotted paths reach nested fields);
2. chat: under ``data.chat_template = auto``, text prompts become chat messages when the
   tokenizer has a chat template (:func:`applies_template`), with ``data.system_prompt`` as
   their first message; chat-message prompts always use the template;
3. length: each prompt is counted in tokens as the policy sees it, against the limit
   ``data.max_prompt_tokens`` (``auto`` = the model's positions − ``rollout.max_new_tokens``,
   the room a prompt has beside the longest response: :func:`prompt_limit`); longer ones
   are an error, dropped, or cut from the left (``data.overlong_prompts``), and counted.

The test set is first cut to its first ``data.eval_size`` prompts, so only evaluated prompts
are judged by the length rule. A mixture draws each prompt's source with probability
w_k / Σ w from a seeded generator; its state and every source's position are checkpointed
(:class:`MixtureStream`), so a resumed run draws what the uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from glassrl.data.datasets import load_prompts
from glassrl.data.formatting import format_prompts, render_text_prompts, truncate_left
from glassrl.data.records import PromptRecord
from glassrl.data.sources import Source, parse_sources, probabilities
from glassrl.data.stream import PromptStream
from glassrl.data.tasks import load_task, parse_task
from glassrl.errors import GlassrlError
from glassrl.models.chat_rendering import applies_template, rendering
from glassrl.rl.build import test_spec
from glassrl.rl.config import TrainConfig


@dataclass(frozen=True)
class Loaded:
    """One source after the length rule: its records and what the rule did to them.

    read: prompts read (after the eval_size cut, for the test set); dropped, truncated: how
    many the rule removed or cut; longest: tokens of the longest prompt as read.
    """

    key: str
    path: str
    records: list[PromptRecord]
    read: int
    dropped: int
    truncated: int
    longest: int

    @property
    def answered(self) -> int:
        return sum(r.answer is not None for r in self.records)


@dataclass
class RunPrompts:
    """What the trainer reads its prompts from (module docstring)."""

    train: PromptStream | MixtureStream
    test: list[PromptRecord]
    sources: list[Loaded]  # every training source, then the test set (when there is one)
    tokenizer: Any
    limit: int  # longest prompt in tokens
    limit_text: str  # how the limit was set
    template: str  # how text prompts are rendered: "chat template" or the reason they stay plain
    prompt_format: PromptFormat | None = None  # agentic runs: records -> ids with the tools rendered in

    def ids(self, records: Sequence[PromptRecord]) -> list[list[int]]:
        """Token ids of each record's prompt as the policy sees it, cut to the last ``limit``
        tokens (only prompts kept by data.overlong_prompts = truncate_left are longer)."""
        return [truncate_left(ids, self.limit) for ids in prompt_ids(self.tokenizer, records, self.prompt_format)]

    @property
    def longest(self) -> int:
        """Tokens of the longest prompt the run can give the policy: the longest read, at most ``limit``
        (what the memory estimate counts, glassrl.rl.memory: the limit itself is the model's positions −
        ``rollout.max_new_tokens`` under ``auto``, 32,640 for a Qwen2.5 model, which no prompt here reaches)."""
        return min(self.limit, max((s.longest for s in self.sources), default=0))

    def metrics(self) -> dict[str, float]:
        """data/…: prompts the length rule dropped and truncated, over every source (docs/metrics.md)."""
        return {
            "data/prompts_dropped": sum(s.dropped for s in self.sources),
            "data/prompts_truncated": sum(s.truncated for s in self.sources),
        }

    def summary(self) -> list[str]:
        """The start-up lines: each source's counts, the limit, how text prompts are rendered."""
        lines = []
        for s in self.sources:
            lines.append(
                f"{s.key}: {s.path}: {s.read} prompts read, longest {s.longest} tokens; {s.dropped} dropped, "
                f"{s.truncated} truncated; {len(s.records)} kept, {s.answered} with an answer"
            )
        if isinstance(self.train, MixtureStream):
            shares = ", ".join(f"{k} {p:.0%}" for k, p in zip(self.train.keys, self.train.probabilities))
            lines.append(f"data.train mixture: {shares} of the prompts drawn")
        lines.append(f"max prompt length: {self.limit} tokens ({self.limit_text}); text prompts: {self.template}")
        return lines


class MixtureStream:
    """Prompts from several sources: for each prompt, source k with probability w_k / Σ_j w_j
    (a seeded draw), then that source's next record in its own seeded order (a PromptStream).

    Checkpointed as part "data": the draw generator's state and each source's (epoch, index).
    """

    part_names = ("data",)

    def __init__(self, sources: Sequence[list[PromptRecord]], weights: Sequence[float], seed: int, keys: Sequence[str]):
        self.keys = list(keys)
        self.streams = [
            PromptStream(r, seed + k, part=f"data_{k}", key=key) for k, (r, key) in enumerate(zip(sources, keys))
        ]
        self.probabilities = probabilities([Source("", w) for w in weights])
        self._weights = torch.tensor(list(weights), dtype=torch.float64)
        self.generator = torch.Generator().manual_seed(seed)

    def take(self, k: int) -> list[PromptRecord]:
        """The next ``k`` records."""
        picks = torch.multinomial(self._weights, k, replacement=True, generator=self.generator).tolist()
        return [self.streams[i].take(1)[0] for i in picks]

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        streams = [s.state_dict()[s.part][1] for s in self.streams]
        return {"data": ("torch", {"draws": self.generator.get_state(), "streams": streams})}

    def check_state(self, parts: dict[str, Any]) -> None:
        """The checkpoint's mixture has as many sources as data.train now (before its shapes are checked:
        glassrl.run.state.check_restored)."""
        streams = parts["data"].get("streams") if isinstance(parts.get("data"), dict) else None
        if isinstance(streams, list) and len(streams) != len(self.streams):
            raise GlassrlError(
                f"checkpoint data is for a mixture of {len(streams)} sources, but data.train now has "
                f"{len(self.streams)}: resume with the same data"
            )

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        state = parts["data"]
        self.check_state(parts)
        for stream, position in zip(self.streams, state["streams"]):
            stream.load_state_dict({stream.part: position})
        self.generator.set_state(state["draws"])


def build_prompts(
    cfg: TrainConfig, tokenizer, model_path: Path, prompt_format: PromptFormat | None = None
) -> RunPrompts:
    """The run's prompts (module docstring); GlassrlError naming the key, file or row.
    ``prompt_format``: how an agentic run renders a record (its tools described; see
    glassrl.rl.build.prompt_format); the length rule counts what it renders."""
    d = cfg.data
    limit, limit_text = prompt_limit(cfg, model_positions(model_path), model_path)
    chat = applies_template(tokenizer, d.chat_template)
    defaults = Source("", prompt_key=d.prompt_key, answer_key=d.answer_key, metadata_keys=_keys(d.metadata_keys))
    sources = parse_sources(d.train, "data.train", defaults)
    load = partial(load_source, tokenizer=tokenizer, chat=chat, limit=limit, cfg=cfg, prompt_format=prompt_format)
    train = [load(source, "train") for source in sources]
    if isinstance(d.train, str):
        stream: PromptStream | MixtureStream = PromptStream(train[0].records, cfg.seed)
    else:
        stream = MixtureStream(
            [s.records for s in train], [s.weight for s in sources], cfg.seed, [s.key for s in train]
        )
    loaded = list(train)
    spec = test_spec(cfg)
    test: list[PromptRecord] = []
    if spec is not None and d.eval_size > 0:
        source = replace(defaults, path=spec, key="data.test")
        loaded.append(load(source, "test", size=d.eval_size))
        test = loaded[-1].records
    template = rendering(tokenizer, d.chat_template)
    return RunPrompts(stream, test, loaded, tokenizer, limit, limit_text, template, prompt_format)


def load_source(
    source: Source,
    split: str,
    tokenizer,
    *,
    chat: bool,
    limit: int,
    cfg: TrainConfig,
    size: int | None = None,
    prompt_format: PromptFormat | None = None,
) -> Loaded:
    """One source read (its first ``size`` prompts when given), rendered and held to ``limit``."""
    if (ref := parse_task(source.path, split=split)) is not None:
        records = load_task(ref.name, ref.split)
    else:
        records = load_prompts(
            source.path,
            prompt_key=source.prompt_key,
            answer_key=source.answer_key,
            metadata_keys=source.metadata_keys,
        )
    records = records[:size] if size is not None else records
    records = render(records, chat, cfg.data.system_prompt, tokenizer, cfg.data.chat_template, source.key)
    # Only the lengths are kept: the token ids of a million prompts would hold gigabytes at once.
    lengths = [
        len(ids)
        for start in range(0, len(records), LENGTH_CHUNK)
        for ids in prompt_ids(tokenizer, records[start : start + LENGTH_CHUNK], prompt_format)
    ]
    return apply_length_rule(source, records, lengths, limit, cfg)


LENGTH_CHUNK = 4096  # prompts tokenised at once to measure their lengths


# records -> their prompts' token ids as the policy sees them (an agentic run's: glassrl.rl.build.prompt_format)
PromptFormat = Callable[[Sequence[PromptRecord]], list[list[int]]]


def prompt_ids(tokenizer, records: Sequence[PromptRecord], prompt_format: PromptFormat | None) -> list[list[int]]:
    """Each record's prompt as token ids: ``prompt_format``'s rendering, else the prompt alone."""
    if prompt_format is not None:
        return prompt_format(records)
    return format_prompts(tokenizer, [r.prompt for r in records], [r.source for r in records])


def render(
    records: list[PromptRecord], chat: bool, system_prompt: str | None, tokenizer, mode: str, key: str
) -> list[PromptRecord]:
    """Text prompts as chat messages when ``chat``; ``system_prompt`` first in every prompt that the
    template renders (glassrl.data.formatting.render_text_prompts, as glassrl sft renders them)."""
    prompts = render_text_prompts(
        [r.prompt for r in records],
        [r.source for r in records],
        chat=chat,
        system_prompt=system_prompt,
        how=rendering(tokenizer, mode),
        key=key,
        system_key="data.system_prompt",
    )
    return [replace(r, prompt=p) for r, p in zip(records, prompts)]


def apply_length_rule(source: Source, records: list[PromptRecord], lengths: list[int], limit: int, cfg) -> Loaded:
    """data.overlong_prompts on prompts of ``lengths`` tokens: error, drop, or truncate_left (counted)."""
    over = [i for i, n in enumerate(lengths) if n > limit]
    policy = cfg.data.overlong_prompts
    longest = max(lengths, default=0)
    where = f"{source.key} = {source.path!r}"
    if over and policy == "error":
        first = over[0]
        new = cfg.rollout.max_new_tokens
        if cfg.data.max_prompt_tokens == "auto":
            how = f"auto: the model's {limit + new} positions − rollout.max_new_tokens = {new}"
            way_out = "lower rollout.max_new_tokens, use a model with more positions"
        else:
            how, way_out = "data.max_prompt_tokens", "raise data.max_prompt_tokens"
        raise GlassrlError(
            f"{where}: {len(over)} of {len(records)} prompts are longer than the prompt limit of {limit} tokens "
            f"({how}; first: {records[first].source}, {lengths[first]} tokens; longest {longest}); "
            f"{way_out}, or set data.overlong_prompts = drop | truncate_left"
        )
    kept = [r for i, r in enumerate(records) if policy != "drop" or lengths[i] <= limit]
    if not kept:
        raise GlassrlError(f"{where}: all {len(records)} prompts are longer than the prompt limit of {limit} tokens")
    dropped = len(over) if policy == "drop" else 0
    truncated = len(over) if policy == "truncate_left" else 0
    return Loaded(source.key, source.path, kept, len(records), dropped, truncated, longest)


def prompt_limit(cfg: TrainConfig, positions: int | None, path: Path) -> tuple[int, str]:
    """(the longest prompt in tokens, how it was set): ``data.max_prompt_tokens``, or for ``auto``
    the model's positions − ``rollout.max_new_tokens``; a prompt plus the longest response must fit
    the model's positions."""
    value, new = cfg.data.max_prompt_tokens, cfg.rollout.max_new_tokens
    if value == "auto":
        if positions is None:
            raise GlassrlError(
                f"data.max_prompt_tokens = auto: {path}/config.json gives no max_position_embeddings; set a number"
            )
        if positions - new < 1:
            raise GlassrlError(
                f"rollout.max_new_tokens = {new}: leaves no room for a prompt in the model's "
                f"{positions} positions ({path})"
            )
        return positions - new, f"auto: the model's {positions} positions − rollout.max_new_tokens = {new}"
    if positions is not None and value + new > positions:
        raise GlassrlError(
            f"data.max_prompt_tokens + rollout.max_new_tokens = {value} + {new} "
            f"is more than the model's {positions} positions ({path})"
        )
    return value, "data.max_prompt_tokens"


def model_positions(path: Path) -> int | None:
    """The model's ``max_position_embeddings`` (its config.json, read without loading weights)."""
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(str(path)), "max_position_embeddings", None)


def _keys(keys: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if keys is None else tuple(keys)
