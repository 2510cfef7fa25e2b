"""Prompts as the model sees them: token ids before the response, and the same as text.

One rule for every tokenizer:

- plain text: the tokenizer's own encoding with its special tokens (for the default model and
  Llama-style tokenizers: BOS + text), no chat template; the response follows directly;
- chat messages: the tokenizer's chat template with the generation prompt appended (default
  model: ``<|bos|><|user|>…<|assistant|>``); a tokenizer without one is an error. The default
  model is trained on plain-text prompts only: it has the template, but has not learnt to
  answer in it.

The response is then its text's tokens and EOS (:func:`glassrl.trainer.common.encode_responses`).
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
        encoded = tokenizer([prompts[i] for i in texts], add_special_tokens=True)["input_ids"]
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


def prompt_text(tokenizer, prompt: Prompt) -> str:
    """The prompt as the policy saw it: plain text as is, chat messages rendered by the template."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
