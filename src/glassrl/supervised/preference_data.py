"""The preference trainer's examples (``glassrl dpo``): pairs, and KTO's labelled responses with
their KL partners, tokenised as the policy sees them and cut to fit as TRL's DPOTrainer cuts them
(``max_prompt_length``, ``max_completion_length``, ``max_length``, ``truncation_mode``).

    pairs, n_cut = fit_pairs(tokenizer, load_preferences(path), Rule(max_length=512))
    prompt, responses, cut = truncate(prompt, [chosen, rejected], rule, where)

TRL (huggingface/trl v0.27.2, trl/trainer/dpo_trainer.py) cuts in two places, in this order:

1. ``DPOTrainer.tokenize_row``: the prompt keeps its last ``max_prompt_length`` tokens
   (``prompt_input_ids[-max_prompt_length:]``), each response (EOS appended) its first
   ``max_completion_length`` (``chosen_input_ids[:max_completion_length]``);
2. ``DPOTrainer.concatenated_forward``: prompt ⊕ response longer than ``max_length`` keeps its first
   ``max_length`` tokens (``keep_start``: the responses lose their ends) or its last (``keep_end``:
   the prompt loses its start).

One difference, on purpose: TRL cuts each of a pair's rows alone, so under ``keep_end`` the
shorter response keeps more of the prompt than the longer one and the two are scored under
different contexts; here the pair's prompt is cut once, by what its longer response needs, so both
responses are compared on one context (DPO's π(y_w|x) against π(y_l|x)). Under ``keep_end`` a
response that alone fills ``max_length`` keeps its last ``max_length − 1`` tokens after the prompt's
last token (TRL's row of response tokens only scores all but its first: the same tokens are
scored). Under ``keep_start`` a prompt that alone fills ``max_length`` leaves no response token to
score: an error naming the example, where TRL trains on two empty responses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

from glassrl.data.collate import encode_responses
from glassrl.data.formatting import format_prompt
from glassrl.data.records import PreferencePair
from glassrl.errors import GlassrlError


class Rule(NamedTuple):
    """The lengths (tokens) a preference example is cut to; None = not cut."""

    max_length: int
    max_prompt_length: int | None = None
    max_completion_length: int | None = None
    mode: Literal["keep_start", "keep_end"] = "keep_start"


def truncate(
    prompt: list[int], responses: list[list[int]], rule: Rule, where: str
) -> tuple[list[int], list[list[int]], bool]:
    """``prompt`` and its ``responses`` (a pair's chosen and rejected, or a KTO example's response
    and its KL partner) cut by ``rule``; whether anything was cut. ``where`` names the example in
    the error of a prompt that leaves no response token under keep_start."""
    cut_prompt, cut = prompt, responses
    if rule.max_prompt_length is not None:
        cut_prompt = cut_prompt[-rule.max_prompt_length :]
    if rule.max_completion_length is not None:
        cut = [r[: rule.max_completion_length] for r in cut]
    longest = len(cut_prompt) + max(len(r) for r in cut)
    if longest > rule.max_length:
        if rule.mode == "keep_start":
            room = rule.max_length - len(cut_prompt)
            if room < 1:
                raise GlassrlError(
                    f"{where}: the prompt alone is {len(cut_prompt)} tokens, max_length = {rule.max_length}: "
                    "with truncation_mode = keep_start no response token is left; set max_prompt_length "
                    "(its last tokens are kept), or truncation_mode = keep_end"
                )
            cut = [r[:room] for r in cut]
        else:  # keep_end: the prompt loses its start, by what the longer response needs
            room = rule.max_length - max(len(r) for r in cut)
            cut_prompt = cut_prompt[-max(room, 1) :]
            cut = [r[-(rule.max_length - len(cut_prompt)) :] for r in cut]
    changed = cut_prompt != prompt or cut != responses
    return cut_prompt, cut, changed


def fit_pairs(tokenizer, pairs: list[PreferencePair], rule: Rule) -> tuple[list[tuple], int]:
    """Each pair as (prompt_ids, chosen_ids, rejected_ids, margin), laid out as the policy sees it
    (glassrl.supervised.rm.encode_pairs's layout) and cut by ``rule``; and how many were cut."""
    examples, cut = [], 0
    for pair in pairs:
        chosen, rejected = encode_responses(tokenizer, [pair.chosen, pair.rejected])
        prompt, (chosen, rejected), changed = truncate(
            format_prompt(tokenizer, pair.prompt), [chosen, rejected], rule, pair.source
        )
        cut += changed
        examples.append((prompt, chosen, rejected, pair.margin))
    return examples, cut


@dataclass
class Labelled:
    """A KTO example: its prompt and response ids, its label, and the response its KL pair borrows."""

    prompt: list[int]
    response: list[int]
    desirable: bool
    partner: list[int]


def encode_labelled(tokenizer, examples, rule: Rule, seed: int, data: str) -> tuple[list[Labelled], int]:
    """KTO's examples (glassrl.data.preferences.load_labelled), each with the response of another as
    its KL pair's: a seeded derangement (a random cycle through the data), so that no example borrows
    its own response; cut to fit together with its KL pair's response; and how many were cut.
    ``data`` names the file in the error of fewer than 2 examples."""
    if len(examples) < 2:
        raise GlassrlError(f"data: {data} has {len(examples)} labelled response; KTO needs at least 2")
    prompts = [format_prompt(tokenizer, e.prompt) for e in examples]
    responses = encode_responses(tokenizer, [e.response for e in examples])
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed)).tolist()
    partner = {order[k]: order[(k + 1) % len(order)] for k in range(len(order))}
    encoded, cut = [], 0
    for i, example in enumerate(examples):
        prompt, (response, other), changed = truncate(
            prompts[i], [responses[i], responses[partner[i]]], rule, example.source
        )
        cut += changed
        encoded.append(Labelled(prompt, response, example.desirable, other))
    return encoded, cut


def check_rule(rule: Rule) -> None:
    """The lengths make sense together; GlassrlError naming the key."""
    for key in ("max_prompt_length", "max_completion_length"):
        value = getattr(rule, key)
        if value is not None and value < 1:
            raise GlassrlError(f"{key} = {value}: must be >= 1 (or null: not cut)")
    if rule.max_prompt_length is not None and rule.max_prompt_length >= rule.max_length:
        raise GlassrlError(
            f"max_prompt_length = {rule.max_prompt_length}: must be < max_length = {rule.max_length}, "
            "to leave room for the responses"
        )


def cut_line(name: str, counts: dict[str, tuple[int, int]], rule: Rule) -> str | None:
    """The line that says how many examples were cut ("dpo: 3 of 40 training pairs ... cut to fit
    ..."), None when none was."""
    parts = [f"{n} of {total} {what}" for what, (n, total) in counts.items() if n]
    if not parts:
        return None
    lengths = f"max_length = {rule.max_length}"
    for key in ("max_prompt_length", "max_completion_length"):
        if getattr(rule, key) is not None:
            lengths += f", {key} = {getattr(rule, key)}"
    return f"{name}: {' and '.join(parts)} cut to fit ({lengths}, truncation_mode = {rule.mode}; TRL's rule)"
