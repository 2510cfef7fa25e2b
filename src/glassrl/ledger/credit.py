"""Where the credit went in a multi-turn response: the ledger's numbers per turn, per action token,
and the critic's values across an observation.

The reference dialogue's second question (dialogue-agentic-rl-rubric-reward.md): its t = 4 is a
whole action (an ``open_page`` call of ~N tokens), PPO's t is a token. These functions read the
answer off a ledger (:class:`~glassrl.ledger.model.ResponseLedger`, computed by the trainer or by
``glassrl explain``), without recomputing anything:

- :func:`turn_credit`: per turn, its generated tokens' Σ A_i and mean A_i, and the token where
  |δ_i| is largest (under GAE the TD error is the critic's surprise: the token after which its
  expectation moved most; group estimators have no δ);
- :func:`action_rows`: the generated token rows of one turn (a_i, V(s_i), δ_i, A_i per token);
- :func:`observation_values`: V(s_i) on the observation tokens that answered a turn, and the value
  the turn's last generated token bootstraps from (DESIGN §1: GAE carries V and A across an
  observation, so the call's last token sees V(s_m) of the first generated token m after it).

Under GRPO every generated token of a response holds the same A_i (task-level credit), so a
turn's mean A_i is that number and ``peak`` is None; under PPO with GAE each token has its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from glassrl.ledger.model import ResponseLedger, TokenRow


@dataclass(frozen=True)
class TurnCredit:
    """One turn's share of the credit (module docstring); None where the ledger has no such number."""

    turn: int
    start: int  # first generated token
    end: int  # one past the last generated token
    observation_end: int  # one past the last observation token
    finish_reason: str
    calls: tuple[str, ...]  # the tool calls made, "name argument"
    sum_advantage: float | None  # Σ A_i over the turn's generated tokens
    mean_advantage: float | None
    peak: int | None  # index of the generated token with the largest |δ_i|; None without δ


def _call_text(call: dict) -> str:
    arguments = call.get("arguments")
    if isinstance(arguments, dict):
        arguments = " ".join(str(v) for v in arguments.values())
    return f"{call.get('name', '')} {arguments if arguments is not None else ''}".strip()


def action_rows(response: ResponseLedger, turn: int) -> list[TokenRow]:
    """The generated token rows of turn ``turn`` (its action tokens, in order)."""
    span = _turns(response)[turn]
    return [row for row in response.tokens[span.start : span.end] if row.response_mask]


def turn_credit(response: ResponseLedger) -> list[TurnCredit]:
    """Per turn of a multi-turn response (module docstring)."""
    out = []
    for k, span in enumerate(_turns(response)):
        rows = action_rows(response, k)
        advantages = [r.advantages for r in rows if r.advantages is not None]
        deltas = [(abs(r.deltas), r.index) for r in rows if r.deltas is not None]
        out.append(
            TurnCredit(
                turn=k,
                start=span.start,
                end=span.end,
                observation_end=span.observation_end,
                finish_reason=span.finish_reason,
                calls=tuple(_call_text(c) for c in span.tool_calls),
                sum_advantage=sum(advantages) if advantages else None,
                mean_advantage=sum(advantages) / len(advantages) if advantages else None,
                peak=max(deltas)[1] if deltas else None,
            )
        )
    return out


def observation_values(response: ResponseLedger, turn: int) -> tuple[list[float | None], float | None]:
    """(V(s_i) on each observation token that answered turn ``turn``, V(s_m) of the first generated
    token m after it: the value the turn's last generated token bootstraps from; None at the end)."""
    span = _turns(response)[turn]
    observed = [row.values for row in response.tokens[span.end : span.observation_end]]
    after = next((r for r in response.tokens[span.observation_end :] if r.response_mask), None)
    return observed, None if after is None else after.values


def _turns(response: ResponseLedger):
    if response.turns is None:
        raise ValueError("a single-turn response has no turns; credit per turn needs a multi-turn ledger")
    return response.turns
