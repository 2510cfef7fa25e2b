"""Environments, a tool and a scripted turn sampler for the multi-turn trainer tests
(tests/rl/test_rl_agentic.py). Loaded by config specs (``rollout.agent.environment``,
``rollout.agent.tools``) as a user's file would be.

The tiny test model has 64 positions, so observations are short: ``Retry``'s observation is
``<result>0</result>`` (18 tokens), the ``c`` tool's call ``<call>c 482+97</call>``.

What a worker process loads to run ``Retry`` (rollout.agent.environment runs in workers) imports no torch:
``ScriptedSampler``, which the trainer uses, imports it when made. A user's environment module that
imports torch costs each worker ~3.5 s and ~250 MB here.
"""

from __future__ import annotations

import re

from glassrl.agents.calculator import Calculator
from glassrl.agents.environment import StepResult


class Retry:
    """A simulated user with no tools: answers the model's first turn with an observation (and a
    reward part "first" of 0.25, and a call record), ends the episode after the second."""

    tools = ()

    def reset(self, record) -> None:
        self.turns = 0

    def step(self, text, calls) -> StepResult:
        self.turns += 1
        if self.turns == 1:
            call = {"name": "user", "arguments": {}, "status": "ok", "seconds": 0.0}
            return StepResult(observations=("0",), reward_parts={"first": 0.25}, tool_calls=(call,))
        return StepResult(done=True)


def c(expression: str) -> str:
    """The calculator under a one-letter name (short calls for the tiny model's positions)."""
    return Calculator().call({"expression": expression})


class ScriptedSampler:
    """Stands in for the tiny model's sampling (the trainer recomputes every log-prob, value and
    reference log-prob with the real model): on a tool-add prompt "a+b=?" it calls ``c``, then
    answers with the number in the result, or one more; some answers come without a call. The
    choices draw from the trainer's generator, so a run is reproducible."""

    path = "a script"

    def __init__(self, model, tokenizer, stops) -> None:
        import torch

        self.device = torch.device("cpu")
        self.tokenizer, self.stops = tokenizer, stops  # the run's stop set, as HFTurnSampler gets it

    def sample(self, contexts, max_new_tokens, params, generator, stop_strings, with_logprobs):
        import torch

        from glassrl.agents.loop import SampledTurn, trim_turn

        turns = []
        for context, budget in zip(contexts, max_new_tokens):
            text = self.tokenizer.decode(context)
            draw = int(torch.randint(0, 4, (1,), generator=generator))
            if result := re.search(r"<result>(-?\d+)</result>", text):
                answer = int(result[1]) + (draw == 0)  # a quarter of the answers are wrong
                turn = f"{answer}"
            else:
                a, b = re.search(r"(\d+)\+(\d+)=\?", text).groups()
                turn = f"<call>c {a}+{b}</call>" if draw else f"{int(a) + int(b) + 1}"  # no call: wrong
            ids = self.tokenizer.encode(turn, add_special_tokens=False)
            if not turn.endswith("</call>"):
                ids.append(self.tokenizer.eos_token_id)
            tokens, ended = trim_turn(ids, budget, self.stops.with_strings(stop_strings), self.tokenizer.decode)
            turns.append(SampledTurn(tokens, ended, [0.0] * len(tokens) if with_logprobs else None))
        return turns
