"""The legend: a token of a ledger, and each response's baseline, in words with the numbers of its row.

The one source of the legend. The terminal (``glassrl explain``, through
:func:`glassrl.ledger.render.legend_text`) and the report's token view
(:func:`glassrl.report.html.token_payload` embeds the lines; ``token_view.js`` only shows
them) both print what :func:`token_legend` and :func:`baseline_legend` return.

Each advantage estimator has its account here (:data:`ACCOUNTS`): the lines that tell a
token's credit, and the baseline of each response. Its entry in the registry
(glassrl.algos.advantages) holds a torch function; the report shows a ledger where torch
cannot be imported (DESIGN §2), so the accounts are keyed by the estimator's name and a
test checks that every registered estimator has one.

Languages are data (glassrl.ledger.phrases: every sentence with named slots, ``{i}``,
``{adv}``, …, per language); the functions below decide once, for every language, which
sentences apply to a token and fill the slots with the numbers of its row.

The numbers are only displayed from the ledger, except the group statistics of the
baselines, which are recomputed with :mod:`statistics` so that a reader can see the
baseline (tests check that the two agree).
"""

from __future__ import annotations

import bisect
import math
import statistics
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from glassrl.ledger.model import Ledger, ResponseLedger, TokenRow
from glassrl.ledger.phrases import label, phrase

DASH = "—"
LABEL_WIDTH = 8  # terminal columns of a line's label ("state   ", "状态    ")


@dataclass(frozen=True)
class LegendLine:
    """One line of a token's legend: ``key`` names what it explains (state, reward, TD, adv, …)."""

    key: str
    text: str


def fmt(x: float | None) -> str:
    """A number to 4 decimals ("—" for None); −0.0000 prints as 0.0000."""
    if x is None:
        return DASH
    text = f"{x:.4f}"
    return "0.0000" if text == "-0.0000" else text


def factor(x: float | None) -> str:
    """A number after "·" in a formula: negatives in parentheses, so "0.1·(−0.05)" reads right."""
    text = fmt(x)
    return f"({text})" if text.startswith("-") else text


def num(x: float | None) -> str:
    """A parameter or input in the legend: short form (0.95, 1, 1e-06); "—" for None."""
    return DASH if x is None else f"{x:g}"


def terminal_line(line: LegendLine, lang: str = "en") -> str:
    """A legend line as the terminal prints it: the head line flush, the others indented under a label column."""
    if line.key == "token":
        return line.text
    if line.key == "obs":
        return "  " + line.text
    name = label(line.key, lang)
    return "  " + name + " " * max(LABEL_WIDTH - _width(name), 1) + line.text


def _width(text: str) -> int:
    """Terminal columns: CJK characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


# ---------------------------------------------------------------- one token


def token_legend(ledger: Ledger, b: int, i: int, lang: str = "en") -> list[LegendLine]:
    """Token i of response b in words, with the numbers of its row (DESIGN §1)."""
    resp = ledger.responses[b]
    row = resp.tokens[i]
    say = _Say(lang, i=i, b=b, token=repr(row.token))
    prefix = _tail(resp, i)
    lines = [
        say("token", "token"),
        say("state", "state.prompt", prompt=repr(_clip(resp.prompt)))
        if i == 0
        else say("state", "state", prompt=repr(_clip(resp.prompt)), prefix=repr(_clip(prefix))),
    ]
    if not row.response_mask:
        return [*lines, say("obs", "obs")]
    action = say.text("action")
    if row.logprobs is not None:
        action += say.text("action.logprob", logprob=fmt(row.logprobs))
    if row.ref_logprobs is not None:
        action += say.text("action.ref_logprob", ref_logprob=fmt(row.ref_logprobs))
    lines.append(LegendLine("action", action))
    sampled = _sampled(row, say)
    if sampled:
        lines.append(LegendLine("sampled", sampled))
    if row.kl is None:
        lines.append(say("reward", "reward", r=fmt(row.token_rewards)))
    else:
        lines.append(
            say(
                "reward",
                "reward.kl",
                score=fmt(row.token_scores),
                beta=num(ledger.beta),
                kl=factor(row.kl),
                r=fmt(row.token_rewards),
            )
        )
    lines += ACCOUNTS.get(ledger.estimator, GENERIC).credit(ledger, resp, i, say)
    return lines


def _sampled(row: TokenRow, say: _Say) -> str:
    """What sampled the token when it was not π_old (glassrl.algos.off_policy): its version and
    staleness, log μ and ρ_i, and algo.off_policy's decision; "" for a token sampled on-policy."""
    parts = []
    if row.policy_version is not None:
        parts.append(say.text("sampled.version", v=row.policy_version, lag=num(row.staleness)))
    if row.rollout_logprobs is not None and row.logprobs is not None:
        log_rho = row.logprobs - row.rollout_logprobs
        rho = math.exp(log_rho) if log_rho < 709 else math.inf  # beyond float64: inf, as torch.exp gives
        parts.append(say.text("sampled.logprob", mu=fmt(row.rollout_logprobs), old=fmt(row.logprobs), rho=fmt(rho)))
    if row.is_keep is not None:
        parts.append(say.text("sampled.weight", w=fmt(row.is_weights)) if row.is_keep else say.text("sampled.dropped"))
    return say.text("sampled.sep").join(parts)


class _Say:
    """Sentences of one token in one language; the token's slots (i, b, token) are filled for every phrase."""

    def __init__(self, lang: str, **slots: object) -> None:
        self.lang, self.slots = lang, slots

    def text(self, key: str, **slots: object) -> str:
        return phrase(key, self.lang, **self.slots, **slots)

    def __call__(self, line: str, key: str, **slots: object) -> LegendLine:
        return LegendLine(line, self.text(key, **slots))


def _tail(resp: ResponseLedger, i: int, n: int = 40) -> str:
    """The text of tokens 0…i−1 as :func:`_clip` shows it (its last ``n`` − 1 characters): only the
    tokens it needs are read, so that the legends of a whole response cost time linear in its length."""
    parts, size, j = [], 0, i
    while j > 0 and size <= n:
        j -= 1
        parts.append(resp.tokens[j].token)
        size += len(parts[-1])
    return "".join(reversed(parts))


def _once(key: object, compute):
    """``compute()`` for ``key`` (a ledger or a response), remembered for the last key asked: the
    legends of a response's tokens are written one after the other, each needing the same value."""
    if _LAST[0] is not key:
        _LAST[:] = [key, compute()]
    return _LAST[1]


_LAST: list = [None, None]


def _next_valid(resp: ResponseLedger, i: int) -> int | None:
    return next((j for j in range(i + 1, resp.length) if resp.tokens[j].response_mask), None)


def _credit_gae(ledger: Ledger, resp: ResponseLedger, i: int, say: _Say) -> list[LegendLine]:
    row, j = resp.tokens[i], _next_valid(resp, i)
    T, gamma = resp.length, num(ledger.gamma)
    future = f"r_{i}" if i == T - 1 else f"r_{i} + γ·r_{i + 1} + …"
    lines = [say("value", "value", v=fmt(row.values), future=future)]
    if j is None:
        lines += [
            say("TD", "TD.end", T=T, r=fmt(row.token_rewards), gamma=gamma, v=fmt(row.values), delta=fmt(row.deltas)),
            say("adv", "adv.end", adv=fmt(row.advantages)),
        ]
    else:
        nxt = resp.tokens[j]
        td = say.text(
            "TD",
            j=j,
            r=fmt(row.token_rewards),
            gamma=gamma,
            v_next=factor(nxt.values),
            v=fmt(row.values),
            delta=fmt(row.deltas),
        )
        if j > i + 1:
            td += say.text("TD.carried", j=j, first=i + 1, last=j - 1)
        lines += [
            LegendLine("TD", td),
            say(
                "adv",
                "adv.gae",
                j=j,
                delta=fmt(row.deltas),
                gamma_lam=num(ledger.gamma * (ledger.lam or 0.0)),
                adv_next=factor(nxt.advantages),
                adv=fmt(row.advantages),
            ),
        ]
    lines.append(say("return", "return.gae", adv=fmt(row.advantages), v=fmt(row.values), ret=fmt(row.returns)))
    return lines + _whitened(row, say)


def _whitened(row: TokenRow, say: _Say) -> list[LegendLine]:
    if row.whitened_advantages is None:
        return []
    return [say("whiten", "whiten", white=fmt(row.whitened_advantages))]


def _credit_broadcast(ledger: Ledger, resp: ResponseLedger, i: int, say: _Say) -> list[LegendLine]:
    row = resp.tokens[i]
    return [
        say("adv", "adv.broadcast", adv=fmt(row.advantages)),
        say("return", "return.no_critic", ret=fmt(row.returns)),
        *_whitened(row, say),
    ]


def _credit_reinforce_pp(ledger: Ledger, resp: ResponseLedger, i: int, say: _Say) -> list[LegendLine]:
    row = resp.tokens[i]
    mean, std = _once(
        ledger, lambda: _stats([t.returns for r in ledger.responses for t in r.tokens if t.response_mask])
    )
    return [
        say("return", "return.reinforce_pp", ret=fmt(row.returns), gamma=num(ledger.gamma)),
        say("adv", "adv.reinforce_pp", ret=fmt(row.returns), mean=fmt(mean), std=fmt(std), adv=fmt(row.advantages)),
        *_whitened(row, say),
    ]


def _credit_process(ledger: Ledger, resp: ResponseLedger, i: int, say: _Say) -> list[LegendLine]:
    row = resp.tokens[i]
    all_ends = _once(resp, lambda: [t.index for t in resp.tokens if t.step_end])
    ends = all_ends[bisect.bisect_left(all_ends, i) :]
    return [
        say("adv", "adv.process", ends=ends, adv=fmt(row.advantages)),
        say("return", "return.no_critic", ret=fmt(row.returns)),
        *_whitened(row, say),
    ]


def _credit_generic(ledger: Ledger, resp: ResponseLedger, i: int, say: _Say) -> list[LegendLine]:
    row = resp.tokens[i]
    return [
        say("adv", "adv.generic", adv=fmt(row.advantages), ret=fmt(row.returns), estimator=ledger.estimator),
        *_whitened(row, say),
    ]


# ---------------------------------------------------------------- turns


def turn_legend(ledger: Ledger, b: int, lang: str = "en") -> list[str]:
    """Response b's turns, two lines each: where the turn's generated and observation tokens lie,
    how it ended, its tool calls (name: status) and the environment's reward parts; then the
    task-level view of its credit, the same numbers as the token rows: Σ r_i, Σ A_i and the mean
    A_i over its generated tokens (an observation token has neither). [] for a single-turn response."""
    resp = ledger.responses[b]
    if not resp.turns:
        return []
    lines = [phrase("heading.turns", lang, b=b)]
    for k, turn in enumerate(resp.turns):
        obs = ""
        if turn.observation_end > turn.end:
            obs = phrase("turn.obs", lang, first=turn.end, last=turn.observation_end - 1)
        failed = [turn.error] if turn.error else []  # finish reason env_error: what became of the environment
        calls = ", ".join([f"{c.get('name')}: {c.get('status')}" for c in turn.tool_calls] + failed)
        parts = ", ".join(f"{name} {num(value)}" for name, value in turn.reward_parts.items())
        lines.append(
            phrase(
                "turn",
                lang,
                k=k,
                start=turn.start,
                last=turn.end - 1,
                n=turn.end - turn.start,
                obs=obs,
                finish=turn.finish_reason,
                calls=phrase("turn.calls", lang, calls=calls) if calls else "",
                parts=phrase("turn.parts", lang, parts=parts) if parts else "",
            )
        )
        rows = [t for t in resp.tokens[turn.start : turn.end] if t.response_mask]
        rewards = [t.token_rewards for t in rows if t.token_rewards is not None]
        advantages = [t.advantages for t in rows if t.advantages is not None]
        lines.append(
            phrase(
                "turn.credit",
                lang,
                rewards=fmt(sum(rewards) if rewards else None),
                advantages=fmt(sum(advantages) if advantages else None),
                mean=fmt(statistics.fmean(advantages) if advantages else None),
            )
        )
    return lines


# ---------------------------------------------------------------- group baselines


def sequence_score(resp: ResponseLedger) -> float:
    """S = Σ r_i over generated tokens: the score critic-free estimators compare (as verl)."""
    return sum(t.token_rewards for t in resp.tokens if t.response_mask and t.token_rewards is not None)


def baseline_legend(ledger: Ledger, lang: str = "en") -> list[str]:
    """How each response's advantage follows from its group: a line per group, then per response (indented)."""
    account = ACCOUNTS.get(ledger.estimator, GENERIC)
    group_line, response_line = account.group, account.response
    if response_line is None:
        return []
    lines = []
    for gid in dict.fromkeys(r.group_id for r in ledger.responses):
        if group_line is not None:
            lines.append(group_line(ledger, gid, lang))
        indent = "" if group_line is None else "  "
        for b, resp in enumerate(ledger.responses):
            if resp.group_id == gid:
                lines.append(indent + response_line(ledger, b, lang))
    return lines


def _first_advantage(resp: ResponseLedger) -> str:
    return fmt(next((t.advantages for t in resp.tokens if t.response_mask), None))


def _group_scores(ledger: Ledger, gid: int | None) -> list[float]:
    return [sequence_score(r) for r in ledger.responses if r.group_id == gid]


def _group_scores_line(ledger: Ledger, gid: int | None, lang: str) -> str:
    scores = _group_scores(ledger, gid)
    mean, std = _stats(scores)
    return phrase("group.scores", lang, gid=gid, scores=", ".join(fmt(x) for x in scores), mean=fmt(mean), std=fmt(std))


def _response_grpo(ledger: Ledger, b: int, lang: str) -> str:
    resp = ledger.responses[b]
    mean, std = _stats(_group_scores(ledger, resp.group_id))
    return phrase(
        "baseline.grpo",
        lang,
        b=b,
        S=fmt(sequence_score(resp)),
        mean=fmt(mean),
        std=fmt(std),
        adv=_first_advantage(resp),
    )


def _response_dr_grpo(ledger: Ledger, b: int, lang: str) -> str:
    resp = ledger.responses[b]
    mean, _ = _stats(_group_scores(ledger, resp.group_id))
    return phrase(
        "baseline.dr_grpo", lang, b=b, S=fmt(sequence_score(resp)), mean=factor(mean), adv=_first_advantage(resp)
    )


def _response_rloo(ledger: Ledger, b: int, lang: str) -> str:
    resp = ledger.responses[b]
    scores, S = _group_scores(ledger, resp.group_id), sequence_score(resp)
    others = (sum(scores) - S) / (len(scores) - 1)
    return phrase(
        "baseline.rloo",
        lang,
        b=b,
        n=len(scores) - 1,
        others=fmt(others),
        S=fmt(S),
        baseline=factor(others),
        adv=_first_advantage(resp),
    )


def _response_remax(ledger: Ledger, b: int, lang: str) -> str:
    resp = ledger.responses[b]
    return phrase(
        "baseline.remax",
        lang,
        b=b,
        S=fmt(sequence_score(resp)),
        baseline=factor(resp.baseline_reward),
        adv=_first_advantage(resp),
    )


def _response_reinforce_pp_baseline(ledger: Ledger, b: int, lang: str) -> str:
    resp = ledger.responses[b]
    raw = next((t.returns for t in resp.tokens if t.response_mask), None)
    return phrase("baseline.reinforce_pp_baseline", lang, b=b, ret=fmt(raw), adv=_first_advantage(resp))


def _group_steps_line(ledger: Ledger, gid: int | None, lang: str) -> str:
    steps = [t.token_rewards for r in ledger.responses if r.group_id == gid for t in r.tokens if t.step_end]
    mean, std = _stats(steps)
    return phrase("group.steps", lang, gid=gid, n=len(steps), mean=fmt(mean), std=fmt(std))


def _response_process(ledger: Ledger, b: int, lang: str) -> str:
    mine = [t for t in ledger.responses[b].tokens if t.step_end]
    return phrase(
        "baseline.process",
        lang,
        b=b,
        ends=[t.index for t in mine],
        rewards=", ".join(fmt(t.token_rewards) for t in mine),
    )


# ---------------------------------------------------------------- accounts


@dataclass(frozen=True)
class Account:
    """How the legend tells an estimator's credit. ``credit``: a token's lines after its reward
    (value, TD, advantage, return, whitened). ``response``: the line per response under
    "Baselines", how its advantage follows from its baseline (None: no such section), each
    group's responses after ``group``'s line for the group (None: the responses alone)."""

    credit: Callable[[Ledger, ResponseLedger, int, _Say], list[LegendLine]]
    response: Callable[[Ledger, int, str], str] | None = None
    group: Callable[[Ledger, int | None, str], str] | None = None


# Estimator (a name in glassrl.algos.advantages.ADVANTAGE_ESTIMATORS) -> its account.
ACCOUNTS: dict[str, Account] = {
    "gae": Account(_credit_gae),
    "grpo": Account(_credit_broadcast, _response_grpo, _group_scores_line),
    "dr_grpo": Account(_credit_broadcast, _response_dr_grpo, _group_scores_line),
    "grpo_process": Account(_credit_process, _response_process, _group_steps_line),
    "rloo": Account(_credit_broadcast, _response_rloo, _group_scores_line),
    "remax": Account(_credit_broadcast, _response_remax),
    "reinforce_pp": Account(_credit_reinforce_pp),
    "reinforce_pp_baseline": Account(_credit_broadcast, _response_reinforce_pp_baseline, _group_scores_line),
}
GENERIC = Account(_credit_generic)  # an estimator not in ACCOUNTS (a ledger of another version): the numbers


def _stats(xs: list[float]) -> tuple[float, float]:
    """(mean, unbiased std), as the estimators use (torch.std; Bessel's correction)."""
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else float("nan")


def _clip(text: str, n: int = 40) -> str:
    return text if len(text) <= n else "…" + text[-(n - 1) :]
