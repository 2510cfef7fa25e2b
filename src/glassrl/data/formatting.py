"""Prompts as the model sees them: token ids before the response, and the same as text.

One rule for every tokenizer:

- plain text: the tokenizer's own encoding with its special tokens (for the default model and
  Llama-style tokenizers: BOS + text), no chat template; the response follows directly;
- chat messages: the tokenizer's chat template with the generation prompt appended (default
  model: ``<|bos|><|user|>…<|assistant|>``); a tokenizer without one is an error. The default
  model is trained on plain-text prompts only: it has the template, but has not learnt to
  answer in it.

The response is then its text's tokens and EOS (:func:`glassrl.data.collate.encode_responses`).

**Data text is tokenised as text** (one rule for every command: ``train`` and ``eval`` prompts,
``sft``, ``rm``, ``dpo``/KTO, tool output): the text of a special token in a prompt, a message or a
response (``<|eos|>``, ``<|im_end|>`` in scraped chat data) becomes the ordinary tokens of those
characters (``split_special_tokens``), never the special token, so no row can end a response or open
a turn in the middle of its text. The chat template's own special tokens stay special: a chat
prompt whose messages hold such text is rendered with a mark in place of each message's text, the
template's pieces encoded as they are and each message's text as text (:func:`chat_ids`). A
template that does not keep a message's text as written (one that trims or edits it) cannot be
told apart from its own tokens that way: such a row is refused, naming it.

A dataset's plain-text prompts can be turned into chat messages first (:func:`as_chat`, with
an optional system message): ``data.chat_template`` decides, glassrl.rl.prompts applies
it. A prompt longer than the limit can be cut from the left (:func:`truncate_left`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from glassrl.data.chat_template import render_chat
from glassrl.data.records import Messages
from glassrl.errors import GlassrlError

Prompt = str | Messages | Sequence[dict]


def format_prompt(tokenizer, prompt: Prompt, source: str = "prompt") -> list[int]:
    """Token ids the model sees before its response (the rule in the module docstring); ``source``
    names the row in an error."""
    return format_prompts(tokenizer, [prompt], [source])[0]


def format_prompts(tokenizer, prompts: Sequence[Prompt], sources: Sequence[str] | None = None) -> list[list[int]]:
    """:func:`format_prompt` of each prompt (``sources``: each one's row, for errors); plain-text
    prompts are encoded in one batched call."""
    texts = [i for i, p in enumerate(prompts) if isinstance(p, str)]
    out: list[list[int]] = [[] for _ in prompts]
    if texts:
        # verbose=False: no "longer than model_max_length" warning; the trainer's length rule decides
        encoded = tokenizer(
            [prompts[i] for i in texts], add_special_tokens=True, split_special_tokens=True, verbose=False
        )["input_ids"]
        for i, ids in zip(texts, encoded):
            out[i] = list(ids)
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            continue
        if not getattr(tokenizer, "chat_template", None):
            raise GlassrlError("prompt: chat messages given, but the tokenizer has no chat template")
        out[i] = chat_ids(tokenizer, prompt, source=sources[i] if sources is not None else "prompt")
    return out


def chat_ids(
    tokenizer, messages: Sequence[dict], *, add_generation_prompt: bool = True, tools=None, source: str = "prompt"
) -> list[int]:
    """Token ids of ``messages`` rendered by the chat template, each message's text tokenised as text
    (the module docstring): the template's special tokens stay special, a message's never become one."""
    text = render_chat(tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools)
    held = [
        k for k, m in enumerate(messages) if isinstance(m.get("content"), str) and special_text(tokenizer, m["content"])
    ]
    if not held:
        return list(tokenizer.encode(text, add_special_tokens=False))
    mark = {k: f"\ue000{k}\ue001" for k in held}  # private-use characters around the message's index
    marks = {mark[k]: messages[k]["content"] for k in held}  # mark -> the text it stands for
    chat = [dict(m, content=mark[k]) if k in mark else dict(m) for k, m in enumerate(messages)]
    pieces = re.split(
        "(" + "|".join(map(re.escape, marks)) + ")",
        render_chat(tokenizer, chat, add_generation_prompt=add_generation_prompt, tools=tools),
    )
    if "".join(marks.get(p, p) for p in pieces) != text:
        k = held[0]
        raise GlassrlError(
            f"{source}: message {k} ({messages[k].get('role')}) holds the text of a special token "
            f"({special_text(tokenizer, messages[k]['content'])!r}) and the chat template does not keep a "
            "message's text as written, so it cannot be read as text; remove it from the data"
        )
    ids: list[int] = []
    for piece in pieces:
        ids += (
            plain_ids(tokenizer, marks[piece]) if piece in marks else tokenizer.encode(piece, add_special_tokens=False)
        )
    return ids


def special_text(tokenizer, text: str) -> str | None:
    """The first special token of the tokenizer (EOS, <|im_start|>, …) whose text ``text`` holds, else None."""
    specials = {str(t) for t in tokenizer.all_special_tokens}
    specials |= {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special}
    return next((s for s in sorted(specials) if s and s in text), None)


def plain_ids(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` read as plain text: the text of a special token in it (a row or a tool's
    output that writes "<|im_end|>") becomes ordinary tokens, never the special token itself."""
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))


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
    return render_chat(tokenizer, list(prompt), add_generation_prompt=True)
