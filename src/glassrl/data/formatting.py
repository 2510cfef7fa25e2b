"""Prompts as the model sees them: token ids before the response, and the same as text.

One rule for every tokenizer:

- plain text: the tokenizer's own encoding with its special tokens (for the default model and
  Llama-style tokenizers: BOS + text), no chat template; the response follows directly;
- chat messages: the tokenizer's chat template with the generation prompt appended (default
  model: ``<|bos|><|user|>…<|assistant|>``); a tokenizer without one is an error. The default
  model is trained on plain-text prompts only: it has the template, but has not learnt to
  answer in it.

The response is then its text's tokens and EOS (:func:`glassrl.data.collate.encode_responses`).

A dataset's plain-text prompts can be turned into chat messages first (:func:`as_chat`, with
an optional system message): ``data.chat_template`` decides, glassrl.rl.prompts applies
it. A prompt longer than the limit can be cut from the left (:func:`truncate_left`).
"""

from __future__ import annotations

from collections.abc import Sequence

from glassrl.data.records import Messages
from glassrl.errors import GlassrlError

Prompt = str | Messages | Sequence[dict]


def format_prompt(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids the model sees before its response (the rule in the module docstring)."""
    return format_prompts(tokenizer, [prompt])[0]


def format_prompts(tokenizer, prompts: Sequence[Prompt]) -> list[list[int]]:
    """:func:`format_prompt` of each prompt; plain-text prompts are encoded in one batched call."""
    texts = [i for i, p in enumerate(prompts) if isinstance(p, str)]
    out: list[list[int]] = [[] for _ in prompts]
    if texts:
        # verbose=False: no "longer than model_max_length" warning; the trainer's length rule decides
        encoded = tokenizer([prompts[i] for i in texts], add_special_tokens=True, verbose=False)["input_ids"]
        for i, ids in zip(texts, encoded):
            out[i] = list(ids)
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            continue
        if not getattr(tokenizer, "chat_template", None):
            raise GlassrlError("prompt: chat messages given, but the tokenizer has no chat template")
        out[i] = list(
            tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True, return_dict=False)
        )
    return out


def as_chat(prompt: str | Messages, system_prompt: str | None = None) -> Messages:
    """``prompt`` as chat messages: text becomes one user message; ``system_prompt``, when
    given, is put first unless the messages already open with a system message."""
    messages: Messages = ({"role": "user", "content": prompt},) if isinstance(prompt, str) else tuple(prompt)
    if system_prompt is not None and messages[0]["role"] != "system":
        messages = ({"role": "system", "content": system_prompt}, *messages)
    return messages


def render_text_prompts(
    prompts: Sequence[Prompt],
    sources: Sequence[str],
    *,
    chat: bool,
    system_prompt: str | None,
    how: str,
    key: str,
    system_key: str,
) -> list[Prompt]:
    """Text prompts as chat messages when ``chat`` (glassrl.models.chat_rendering decides);
    ``system_prompt`` first in every prompt the template renders: an error naming the first
    text prompt (``sources``) that stays plain (``how``: why) and could not carry it (``key``: the
    prompts' config key, ``system_key``: system_prompt's)."""
    if chat:
        return [as_chat(p, system_prompt) for p in prompts]
    if system_prompt is None:
        return list(prompts)
    plain = next((source for p, source in zip(prompts, sources) if isinstance(p, str)), None)
    if plain is not None:
        raise GlassrlError(
            f"{system_key}: the text prompts of {key} stay "
            f"{how}, so a system message has nowhere to go (first: {plain}); give chat messages, or unset it"
        )
    return [as_chat(p, system_prompt) for p in prompts]


def truncate_left(ids: list[int], limit: int) -> list[int]:
    """The last ``limit`` token ids: what stays of an over-long prompt when its start is cut
    (BOS and the chat template's opening included), as TRL's ``max_prompt_length`` and verl's
    ``truncation: left`` cut it; the end, where the question and the generation prompt sit, stays."""
    return ids[-limit:] if len(ids) > limit else ids


def prompt_text(tokenizer, prompt: Prompt) -> str:
    """The prompt as the policy saw it: plain text as is, chat messages rendered by the template."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
