"""Whether a tokenizer's chat template renders text prompts: the one rule of ``glassrl train``
(``data.chat_template``) and ``glassrl sft`` (``chat_template``), so that an SFT → RL pipeline
trains on the prompts it later samples from.

Under ``auto``, text prompts become chat messages (glassrl.data.formatting.as_chat) when the
tokenizer has a chat template — except the default model's tokenizer, whose template exists for
chat messages while the model learnt to answer plain-text prompts
(glassrl.models.default_tokenizer). Under ``none`` they stay plain text.
"""

from __future__ import annotations

from glassrl.models.default_tokenizer import CHAT_TEMPLATE


def applies_template(tokenizer, mode: str) -> bool:
    """Whether text prompts go through the chat template (the module docstring's rule)."""
    template = getattr(tokenizer, "chat_template", None)
    return mode == "auto" and bool(template) and template != CHAT_TEMPLATE


def rendering(tokenizer, mode: str, key: str = "data.chat_template") -> str:
    """How text prompts reach the model, and why (for the start line and errors); ``key``: the config key."""
    if mode == "none":
        return f"plain text ({key} = none)"
    if not getattr(tokenizer, "chat_template", None):
        return "plain text (the tokenizer has no chat template)"
    if tokenizer.chat_template == CHAT_TEMPLATE:
        return "plain text (the default model answers plain-text prompts)"
    return f"the tokenizer's chat template ({key} = auto)"
