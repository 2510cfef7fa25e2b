"""The audit of an environment, call format and chat template: the invariants of a multi-turn batch,
checked per episode, with the first offending token shown in its context (``glassrl audit``).

    recorder = Recorder(make_environment)                  # keeps each episode's tool results
    engine = AgentRolloutEngine(sampler, tokenizer, recorder, max_turns=4)
    batch = engine.generate(prompts, n=1, params=params, generator=g, records=records)
    audits = audit_batch(batch, records, recorder, engine.format, tokenizer, max_turns=4, budget=64)

Checks (:data:`CHECKS`), each per episode:

- ``render``: re-rendering the conversation from its messages reproduces the context ids exactly,
  the sampled and the observation ones. hermes: the chat template renders [prompt, assistant turn,
  tool results, …] (the turn texts as sampled, the results as the tools returned them); tagged: the
  context's text is encoded again, each run of text between two special tokens as plain text (the
  rule of every tool output and data text: special-token text in it is text, glassrl.data.formatting.plain_ids),
  each special token as itself. A template that renders a message differently inside the
  conversation than alone, or a tool's text that merges with the next turn's tokens when encoded
  together, makes the trained context one that the model never meets again (the field's
  "re-tokenised context ≠ sampled tokens").
- ``mask``: ``response_mask`` is True exactly on the generated tokens, False on observations and padding.
- ``gradient``: the policy loss (PPO's clipped surrogate, token-mean, the same registry the trainer
  uses) sends zero gradient to every observation token's log-prob, and some to each generated one.
- ``kl``: the KL penalty placed in the reward is 0 on observation tokens.
- ``length``: the overlong penalty's length counts generated tokens only (observations not counted).
- ``carry``: GAE on the row equals GAE on its generated tokens alone (observations dropped):
  V and A carry across observations unchanged (DESIGN §1).
- ``stop``: a response that ended at its stop token trains on it (mask True).
- ``limits``: the response's finish reason is its last turn's; no more turns than ``max_turns``;
  a response that used every turn and still called a tool says ``turn_limit``; no more tokens
  than the budget, and a response at the budget says ``length``.
- ``calls``: every call the format parsed from a turn, written back as its model family's template
  writes it (``call_format.write``, glassrl.agents.tool_formats) and parsed again, is the same call
  (name and arguments): the format reads what it writes, for the calls the episode made.

In the context a failure shows, a special token is marked ``⟪<|im_end|>⟫``; the same characters
unmarked are text (a tool's output or the data that wrote them, escaped into ordinary tokens), so
the two cannot be mistaken for each other (issue 37).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from glassrl.agents.environment import Environment, StepResult
from glassrl.agents.formats import CallFormat, HermesFormat
from glassrl.agents.loop import SampledTurn
from glassrl.agents.tool_formats import same_calls
from glassrl.agents.tools import ToolCall, schema
from glassrl.algos.advantages.gae import gae
from glassrl.algos.aggregation import aggregate
from glassrl.algos.kl import kl_penalty
from glassrl.algos.losses import POLICY_LOSSES, PolicyLossParams
from glassrl.algos.token_rewards import assemble_token_rewards
from glassrl.data.formatting import chat_ids, plain_ids
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.rollout.base import RolloutBatch

CHECKS = {
    "render": "re-rendering the context reproduces the sampled and observation ids",
    "mask": "mask True on generated tokens only",
    "gradient": "observation tokens get zero gradient",
    "kl": "no KL on observation tokens",
    "length": "overlong penalty counts generated tokens only",
    "carry": "V and A carry across observations",
    "stop": "the stop token trains",
    "limits": "turn limit and truncation recorded",
    "calls": "each call written back by the format parses the same",
}
CONTEXT_TOKENS = 8  # tokens shown each side of an offending one


class Recorder:
    """A ``make_environment`` that keeps every environment it makes, in order (the agent loop makes one
    per episode, in episode order), each recording the (text, observations) of its steps."""

    def __init__(self, make_environment: Callable[[], Environment]) -> None:
        self.make_environment = make_environment
        self.made: list[_Recording] = []

    def __call__(self) -> Environment:
        env = _Recording(self.make_environment())
        self.made.append(env)
        return env


class _Recording:
    def __init__(self, env: Environment) -> None:
        self.env, self.steps = env, []

    @property
    def tools(self):  # as of the last reset (an environment in a worker has none before)
        return self.env.tools

    def reset(self, record: PromptRecord) -> None:
        self.env.reset(record)

    def close(self) -> None:
        closer = getattr(self.env, "close", None)
        if callable(closer):
            closer()

    def step(self, text: str, calls: Sequence[ToolCall]) -> StepResult:
        result = self.env.step(text, calls)
        self.steps.append((text, tuple(result.observations)))
        return result


class ScriptedTurns:
    """A TurnSampler that writes the same turns in every episode: its k-th turn is ``texts[k]``
    (encoded, then the stop token unless the text ends at one of the call format's stop strings; cut
    at the turn's budget). The scripted policy of ``glassrl audit --script``: the invariants do not
    depend on what the model would write, and a script reaches the tool calls a small model never makes."""

    device = torch.device("cpu")
    path = "a script"

    def __init__(self, tokenizer, texts: Sequence[str]) -> None:
        self.tokenizer, self.texts = tokenizer, list(texts)
        self.seen: list[tuple[list[int], int]] = []  # (context, turns written before it)

    def sample(self, contexts, max_new_tokens, params, generator, stop_strings, with_logprobs):
        turns = []
        for context, budget in zip(contexts, max_new_tokens):
            k = max(
                (n + 1 for seen, n in self.seen if context[: len(seen)] == seen and len(seen) < len(context)), default=0
            )
            self.seen.append((list(context), k))
            text = self.texts[min(k, len(self.texts) - 1)]
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            ends_at_string = any(text.endswith(s) for s in stop_strings)
            if not ends_at_string:
                ids.append(self.tokenizer.eos_token_id)
            ended = "length" if len(ids) > budget else ("stop" if ends_at_string else "eos")
            turns.append(SampledTurn(ids[:budget], ended, [0.0] * min(len(ids), budget) if with_logprobs else None))
        return turns


@dataclass(frozen=True)
class CheckResult:
    """One check of one episode: passed, or the first offending token in context (``detail``)."""

    check: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class EpisodeAudit:
    """Every check of one episode (its index in the batch), with its finish reason and number of turns."""

    episode: int
    finish_reason: str
    turns: int
    results: tuple[CheckResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)


def audit_batch(
    batch: RolloutBatch,
    records: Sequence[PromptRecord],
    recorder: Recorder,
    call_format: CallFormat,
    tokenizer,
    *,
    max_turns: int,
    budget: int,
) -> list[EpisodeAudit]:
    """Every check of :data:`CHECKS` on every episode of ``batch`` (B responses: ``records[b // n]``'s,
    ``recorder.made[B0 + b]`` its environment, B0 the environments made before the batch)."""
    B = batch.response_ids.shape[0]
    n = B // len(records)
    environments = recorder.made[-B:]
    mask, context = batch.response_mask.cpu(), batch.response_context_mask.cpu()
    spans = torch.zeros_like(mask)  # (B, T) True on the turns' generated tokens: what the mask should be
    for b, turns in enumerate(batch.turns):
        for t in turns:
            spans[b, t.start : t.end] = True
    gradient_ok, kl_ok, carry_ok = _math_checks(mask, context & ~spans)
    audits = []
    for b in range(B):
        prompt = batch.prompt_ids[b][batch.prompt_mask[b].bool()].tolist()
        length = int(context[b].sum())
        ids = batch.response_ids[b, :length].tolist()
        turns = batch.turns[b]
        show = _Shower(tokenizer, prompt + ids, len(prompt))
        generated = spans[b]
        at = (mask[b] != generated).nonzero()
        mask_detail = None if not len(at) else f"mask {bool(mask[b, at[0]])} on {_role(generated, int(at[0]))}"
        results = (
            _render(records[b // n], environments[b], turns, call_format, tokenizer, prompt + ids, show),
            _first_bad("mask", mask[b] == generated, show, mask_detail or ""),
            _first_bad("gradient", gradient_ok[b], show, "gradient reaches observation token"),
            _first_bad("kl", kl_ok[b], show, "KL penalty on observation token"),
            _length(batch, b),
            _first_bad("carry", carry_ok[b], show, "advantage differs from GAE over the generated tokens alone at"),
            _stop(batch, b, turns, show),
            _limits(batch.finish_reasons[b], turns, max_turns, budget, length),
            _calls(turns, call_format),
        )
        audits.append(EpisodeAudit(b, batch.finish_reasons[b], len(turns), results))
    return audits


def summary(audits: Sequence[EpisodeAudit]) -> tuple[list[tuple[str, int, int, str]], list[str]]:
    """(per check: name, episodes passed, episodes run, what it checks), then each failure as a line:
    the episode, its turns and finish reason, the check and its first offending token in context."""
    checks = [
        (name, sum(r.ok for a in audits for r in a.results if r.check == name), len(audits), description)
        for name, description in CHECKS.items()
    ]
    failures = [
        f"episode {a.episode} ({a.turns} turns, {a.finish_reason}) {r.check}: {r.detail}"
        for a in audits
        for r in a.results
        if not r.ok
    ]
    return checks, failures


def table(audits: Sequence[EpisodeAudit]) -> list[str]:
    """The pass/fail table: one line per check (episodes passed / run), then the failures (:func:`summary`)."""
    checks, failures = summary(audits)
    lines = [f"{'check':<10} {'passed':>8}  what"]
    for name, passed, total, description in checks:
        verdict = "ok" if passed == total else "FAIL"
        lines.append(f"{name:<10} {passed:>4}/{total:<3} {verdict:<4} {description}")
    return lines + failures


class _Shower:
    """A context position as text: ``position 41 ('等于') in '…<call>c 4+5</call>⟦等于⟧9…'`` (response
    positions, as the ledger numbers them), or ``prompt position 7 (…) in …`` in the prompt."""

    def __init__(self, tokenizer, ids: list[int], prompt_length: int) -> None:
        self.tokenizer, self.ids, self.prompt_length = tokenizer, ids, prompt_length

    def __call__(self, k: int) -> str:
        """``k``: index into prompt + response ids."""

        def piece(ids: list[int]) -> str:
            return shown(self.tokenizer, ids)

        before = piece(self.ids[max(0, k - CONTEXT_TOKENS) : k])
        after = piece(self.ids[k + 1 : k + 1 + CONTEXT_TOKENS])
        token = piece(self.ids[k : k + 1]) if k < len(self.ids) else "(end)"
        where = f"prompt position {k}" if k < self.prompt_length else f"position {k - self.prompt_length}"
        return f"{where} ({token!r}) in {before + '⟦' + token + '⟧' + after!r}"


def special_ids(tokenizer) -> set[int]:
    """Ids of the tokenizer's special tokens (EOS, <|im_start|>, …; added tokens marked special)."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return set(tokenizer.all_special_ids) | {i for i, t in added.items() if t.special}


def _runs(tokenizer, ids: Sequence[int]) -> list[tuple[bool, list[int]]]:
    """``ids`` cut at the special tokens: (is a special token, ids) in order, each special token alone."""
    specials, runs = special_ids(tokenizer), []
    for i in ids:
        if i in specials or not runs or runs[-1][0]:
            runs.append((i in specials, [i]))
        else:
            runs[-1][1].append(i)
    return runs


def reencoded(tokenizer, ids: Sequence[int]) -> list[int]:
    """The tagged format's re-rendering of a context (module docstring): each run of text between special
    tokens encoded again as plain text, each special token kept (encoding the whole decoded text made a
    tool's escaped ``<|eos|>`` the special token, and the check fail on a context that was right)."""
    out: list[int] = []
    for special, run in _runs(tokenizer, ids):
        out += run if special else plain_ids(tokenizer, tokenizer.decode(run))
    return out


def shown(tokenizer, ids: Sequence[int]) -> str:
    """``ids`` as text for a reader, each special token marked ``⟪<|eos|>⟫``: unmarked, the same characters
    are text (a tool's output or data escaped into ordinary tokens)."""
    pieces = [(special, tokenizer.decode(run)) for special, run in _runs(tokenizer, ids)]
    return "".join(f"⟪{text}⟫" if special else text for special, text in pieces)


def _role(generated: torch.Tensor, i: int) -> str:
    return "a generated token" if bool(generated[i]) else "an observation token"


def _first_bad(check: str, ok: torch.Tensor, show: _Shower, what: str) -> CheckResult:
    """The check passed where ``ok`` (T,) is all True; else ``what`` at its first False position."""
    bad = (~ok).nonzero()
    if not len(bad):
        return CheckResult(check, True)
    return CheckResult(check, False, f"{what}: {show(show.prompt_length + int(bad[0]))}")


def _render(
    record: PromptRecord,
    env: _Recording,
    turns: Sequence[Any],
    call_format: CallFormat,
    tokenizer,
    context: list[int],
    show: _Shower,
) -> CheckResult:
    if isinstance(call_format, HermesFormat):
        rendered = _render_messages(record, env, turns, tokenizer)
    else:
        rendered = reencoded(tokenizer, context)
    k = next((i for i, (x, y) in enumerate(zip(context, rendered)) if x != y), None)
    if k is None and len(rendered) < len(context):
        k = len(rendered)
    if k is None:
        return CheckResult("render", True)
    again = shown(tokenizer, rendered[k : k + 1]) if k < len(rendered) else "(end)"
    why = _why_rendered_differently(k, context, rendered, turns, call_format, tokenizer, show.prompt_length)
    return CheckResult("render", False, f"re-rendered as {again!r}, context has {show(k)}: {why}")


def _why_rendered_differently(
    k: int, context: list[int], rendered: list[int], turns: Sequence[Any], call_format, tokenizer, prompt_length: int
) -> str:
    """Why the context's token ``k`` (its first that differs from ``rendered``) was rendered otherwise,
    from the context's pieces (the prompt, each turn's generated tokens, each observation): a piece that
    is not its own text's encoding (a model that samples splits the tokenizer never makes), or two
    pieces, each its text's encoding, whose texts merge when encoded together (the format's, the chat
    template's or the data's boundary)."""
    if k < prompt_length:
        return "inside the prompt: its ids are not what the rendering makes of its text (chat template, BOS)"
    pieces = []  # (name, start, end) in context positions
    for i, t in enumerate(turns):
        pieces.append((f"turn {i} (generated)", prompt_length + t.start, prompt_length + t.end))
        if t.observation_end > t.end:
            pieces.append((f"turn {i}'s observation", prompt_length + t.end, prompt_length + t.observation_end))
    at = next(((name, a, b) for name, a, b in pieces if a <= k < b), None)
    if at is None:
        return "after the last turn"
    name, a, b = at
    ids = context[a:b]
    if name.endswith("(generated)") and list(tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False)) != ids:
        return (
            f"{name} is not the tokenizer's encoding of its own text: the model sampled a split of it that "
            "the tokenizer never makes (an untrained or barely trained model does; the format is not at "
            "fault: audit with --script, or a trained model, to check the format)"
        )
    index = pieces.index(at)
    token, again = tokenizer.decode(context[k : k + 1]), tokenizer.decode(rendered[k : k + 1])
    if len(again) > len(token):  # the re-rendered token reaches past this one: the join after it
        first, second = name, (pieces[index + 1][0] if index + 1 < len(pieces) else "what follows")
    elif k == a:  # split otherwise from its piece's start: the join before it
        first, second = (pieces[index - 1][0] if index else "the prompt"), name
    elif isinstance(call_format, HermesFormat):
        return f"the chat template renders {name} otherwise inside the conversation than the rollout laid it out"
    else:
        return f"{name} encodes otherwise inside the context than alone"
    return f"the texts of {first} and {second} merge where they meet when encoded in one piece"


def _render_messages(record: PromptRecord, env: _Recording, turns: Sequence[Any], tokenizer) -> list[int]:
    """The chat template's ids of the whole conversation: the prompt, each turn's text as the assistant's
    message, each observation's results as tool messages."""
    prompt = record.prompt
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    steps = iter(env.steps)
    for turn in turns:
        messages.append({"role": "assistant", "content": turn.text})
        if turn.observation_end > turn.end:
            observations = next(obs for text, obs in steps if text == turn.text)
            messages += [{"role": "tool", "content": r} for r in observations]
    tools = [schema(t) for t in env.tools] or None
    return chat_ids(tokenizer, messages, add_generation_prompt=False, tools=tools, source=record.source)


def _math_checks(mask: torch.Tensor, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T) bool each: True where the position passes gradient, kl, carry; ``observation`` (B, T) marks
    the observation tokens by the turns. The trainer's functions run on ``mask`` with random numbers
    (seeded) in place of the model's: the checks are on what the mask lets through, not on the values."""
    g = torch.Generator().manual_seed(0)
    B, T = mask.shape
    logprobs = (-torch.rand(B, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    old = logprobs.detach() - 0.01
    advantages = torch.randn(B, T, generator=g, dtype=torch.float64)
    loss = POLICY_LOSSES["ppo_clip"].fn(logprobs, old, advantages, mask, PolicyLossParams()).loss
    aggregate(loss, mask, "token-mean").backward()
    grad = logprobs.grad
    gradient_ok = torch.where(observation, grad == 0, torch.where(mask, grad != 0, True))

    ref = old - 0.3 * torch.rand(B, T, generator=g, dtype=torch.float64)
    rewards = assemble_token_rewards(torch.zeros(B, T, dtype=torch.float64), kl_penalty(old, ref, "k1"), 0.1, mask)
    kl_ok = torch.where(observation, rewards == 0, True)

    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    scores = torch.randn(B, T, generator=g, dtype=torch.float64)
    scores = torch.where(mask, scores, 0)
    advantages, _ = gae(scores, values, mask, 0.9, 0.8)
    carry_ok = torch.ones(B, T, dtype=torch.bool)
    for b in range(B):  # the same estimator on the generated tokens alone, packed to the left
        keep = mask[b].nonzero().squeeze(-1)
        packed, _ = gae(
            scores[b, keep][None], values[b, keep][None], torch.ones(1, len(keep), dtype=torch.bool), 0.9, 0.8
        )
        carry_ok[b, keep] = torch.isclose(advantages[b, keep], packed[0], rtol=1e-9, atol=1e-12)
    return gradient_ok, kl_ok, carry_ok


def _length(batch: RolloutBatch, b: int) -> CheckResult:
    counted, generated = int(batch.lengths[b]), sum(t.end - t.start for t in batch.turns[b])
    if counted == generated:
        return CheckResult("length", True)
    return CheckResult("length", False, f"length counted {counted} tokens, the turns generated {generated}")


def _stop(batch: RolloutBatch, b: int, turns: Sequence[Any], show: _Shower) -> CheckResult:
    last = turns[-1]
    if last.finish_reason != "stop" or last.end == last.start:
        return CheckResult("stop", True)
    i = last.end - 1
    if bool(batch.response_mask[b, i]):
        return CheckResult("stop", True)
    return CheckResult("stop", False, f"the final turn's last token has mask False: {show(show.prompt_length + i)}")


def _calls(turns: Sequence[Any], call_format: CallFormat) -> CheckResult:
    for k, turn in enumerate(turns):
        for call in (c for c in call_format.parse(turn.text) if c.error is None):
            try:
                written = call_format.write([call])
            except GlassrlError as err:
                return CheckResult("calls", False, f"turn {k}: {call.raw!r} cannot be written back: {err}")
            again = call_format.parse(written)
            if not same_calls([call], again):
                parsed = [(c.name, c.arguments, c.error) for c in again]
                return CheckResult(
                    "calls", False, f"turn {k}: {call.raw!r} written back as {written!r} parses as {parsed}"
                )
    return CheckResult("calls", True)


def _limits(finish: str, turns: Sequence[Any], max_turns: int, budget: int, length: int) -> CheckResult:
    last = turns[-1].finish_reason
    problems = []
    if finish != last:
        problems.append(f"finish reason {finish!r} but the last turn's is {last!r}")
    if len(turns) > max_turns:
        problems.append(f"{len(turns)} turns, max_turns is {max_turns}")
    if len(turns) == max_turns and last in ("tool_call", "continue"):
        problems.append(f"every turn used and the last ended {last!r}: expected 'turn_limit'")
    if length > budget:
        problems.append(f"{length} tokens, over the budget of {budget}")
    if length == budget and finish not in ("length", "stop"):
        problems.append(f"at the budget of {budget} tokens, finish reason {finish!r}")
    return CheckResult("limits", not problems, "; ".join(problems))
