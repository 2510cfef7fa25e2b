"""Tokenizers for the agent tests, and a scripted turn sampler that stands in for a model.

``tokenizer``: the default model's kind (byte-level BPE, no tool-aware chat template), so the
tagged call format. ``qwen_tokenizer``: the same with Qwen2.5-Instruct's chat template (as
published in its tokenizer_config.json) and its <|im_start|>/<|im_end|> tokens, EOS = <|im_end|>:
the hermes format. Neither needs a download.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from glassrl.agents.loop import SampledTurn, trim_turn
from glassrl.rollout.stops import StopSet
from helpers import QWEN25_TEMPLATE

TEXTS = [
    "4821+975=? <call>calculator 4821+975</call><result>5796</result>5796",
    '<call>calculator {"expression": "123+456"}</call><tool_call>{"name": "search"}</tool_call>',
    "Google Cloud revenue was $11.5 billion in Q1 2025 \\cite{https://abc.xyz/investor/2025-q1.pdf}",
]


@pytest.fixture(scope="session")
def tokenizer():
    from glassrl.models.default_tokenizer import build_tokenizer

    return build_tokenizer(TEXTS * 5)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from glassrl.models.default_tokenizer import build_tokenizer

    tok = build_tokenizer(TEXTS * 5)
    tok.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = QWEN25_TEMPLATE
    return tok


class ScriptedSampler:
    """A TurnSampler whose turns come from ``script(context text) -> turn text``.

    The turn is encoded and cut like a model's (:func:`trim_turn`): EOS is appended unless the
    text ends with a stop string; the budget cuts it. ``contexts`` records what each call saw.
    """

    device = torch.device("cpu")
    path = "a script"

    def __init__(self, tokenizer, script: Callable[[str], str]) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.contexts: list[list[list[int]]] = []

    def sample(self, contexts, max_new_tokens, params, generator, stop_strings, with_logprobs):
        self.contexts.append([list(c) for c in contexts])
        turns = []
        for context, budget in zip(contexts, max_new_tokens):
            text = self.script(self.tokenizer.decode(context))
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if not any(text.endswith(s) for s in stop_strings):
                ids.append(self.tokenizer.eos_token_id)
            stops = StopSet((self.tokenizer.eos_token_id,), tuple(stop_strings))
            tokens, ended = trim_turn(ids, budget, stops, self.tokenizer.decode)
            turns.append(SampledTurn(tokens, ended, [-0.5] * len(tokens) if with_logprobs else None))
        return turns


@pytest.fixture
def scripted():
    return ScriptedSampler
