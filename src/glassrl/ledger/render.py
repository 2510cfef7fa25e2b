"""Human views of a :class:`~glassrl.ledger.Ledger`: rich tables, Markdown, and the legend.

Numbers are shown to 4 decimals; a quantity that was not computed shows as
"—". The optional columns (token id, log-probs, step ends) are left out when no row
has them; the convention's columns (kl_i … Â_i) are always shown, so that a
missing critic reads as "—" rather than disappearing. Observation tokens
(mask False) are dim in the rich table.

The legend (:func:`legend_lines`) explains one token row in words with the
numbers of that row, and, for group estimators, the baseline of each response
(:func:`baseline_lines`). It only displays what the ledger holds, except the
group statistics, which it recomputes with :mod:`statistics` so that a reader
can see the baseline (tests check that the two agree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from glassrl.ledger.model import SYMBOLS, Ledger, ResponseLedger, TokenRow

if TYPE_CHECKING:
    from rich.console import Group

# Left out of the views when no row of the ledger has them.
OPTIONAL_COLUMNS = ("token_id", "logprobs", "ref_logprobs", "step_end")
COLUMNS = (
    "index",
    "token_id",
    "token",
    "logprobs",
    "ref_logprobs",
    "kl",
    "token_scores",
    "token_rewards",
    "values",
    "deltas",
    "advantages",
    "returns",
    "whitened_advantages",
    "response_mask",
    "step_end",
)
DASH = "—"


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


def show_token(text: str) -> str:
    """Token text with whitespace made visible, so a table cell cannot break or look empty."""
    return text.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "␣")


def columns(ledger: Ledger) -> list[str]:
    """The token fields the views show for this ledger."""
    present = {
        name
        for name in OPTIONAL_COLUMNS
        if any(getattr(row, name) is not None for resp in ledger.responses for row in resp.tokens)
    }
    return [name for name in COLUMNS if name not in OPTIONAL_COLUMNS or name in present]


def cell(row: TokenRow, name: str) -> str:
    value = getattr(row, name)
    if name in ("response_mask", "step_end"):
        return DASH if value is None else "1" if value else "0"
    if name == "token":
        return show_token(value)
    if name in ("index", "token_id"):
        return DASH if value is None else str(value)
    return fmt(value)


def run_line(ledger: Ledger) -> str:
    """The run parameters in one line."""
    has_kl = any(row.kl is not None for resp in ledger.responses for row in resp.tokens)
    kl = f"KL {ledger.kl_kind} from log-probs" if ledger.kl_kind else "KL given per token" if has_kl else "no KL"
    parts = [
        f"estimator {ledger.estimator}",
        f"γ = {num(ledger.gamma)}",
        f"λ = {num(ledger.lam)}",
        f"β = {num(ledger.beta)}",
        kl,
    ]
    if ledger.step is not None:
        parts.insert(0, f"step {ledger.step}")
    return " · ".join(parts)


def response_line(b: int, resp: ResponseLedger) -> str:
    """The per-response fields in one line."""
    parts = [
        f"response {b}",
        f"prompt {resp.prompt!r}",
        f"score {fmt(resp.score)}",
        f"group {DASH if resp.group_id is None else resp.group_id}",
        f"{resp.length} tokens",
        f"finish {resp.finish_reason or DASH}",
    ]
    if resp.baseline_reward is not None:
        parts.insert(3, f"baseline reward {fmt(resp.baseline_reward)}")
    return " · ".join(parts)


def to_rich(ledger: Ledger) -> Group:
    """One rich Table per response under the run line; observation tokens dim."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    shown = columns(ledger)
    parts: list = [Text(run_line(ledger), style="bold")]
    for b, resp in enumerate(ledger.responses):
        table = Table(
            title=Text(response_line(b, resp)),
            title_justify="left",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
            pad_edge=False,
        )
        for name in shown:
            table.add_column(SYMBOLS[name], justify="left" if name == "token" else "right", no_wrap=True)
        for row in resp.tokens:
            table.add_row(*(Text(cell(row, name)) for name in shown), style=None if row.response_mask else "dim")
        parts.append(table)
    return Group(*parts)


def to_markdown(ledger: Ledger) -> str:
    """The run line, then per response its line and a pipe table (4 decimals)."""
    shown = columns(ledger)
    lines = [run_line(ledger), ""]
    for b, resp in enumerate(ledger.responses):
        lines += [f"**{_md(response_line(b, resp))}**", ""]
        lines.append("| " + " | ".join(_md(SYMBOLS[name]) for name in shown) + " |")
        lines.append("|" + "|".join(":--" if name == "token" else "--:" for name in shown) + "|")
        for row in resp.tokens:
            lines.append("| " + " | ".join(_md(cell(row, name)) for name in shown) + " |")
        lines.append("")
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|")


# ---------------------------------------------------------------- legend


def legend_lines(ledger: Ledger, b: int, i: int) -> list[str]:
    """Token i of response b in words, with the numbers of its row (DESIGN §1)."""
    resp = ledger.responses[b]
    row = resp.tokens[i]
    prefix = "".join(t.token for t in resp.tokens[:i])
    state = "the prompt" if i == 0 else f"prompt ⊕ y_<{i} = {_clip(resp.prompt)!r} ⊕ {_clip(prefix)!r}"
    lines = [
        f"response {b}, token {i}: a_{i} = {row.token!r}",
        f"  state   s_{i} = {state}" + (f" = {_clip(resp.prompt)!r}" if i == 0 else ""),
    ]
    if not row.response_mask:
        lines.append(
            f"  a_{i} is an observation token (mask 0): not an action of the policy, so it has no reward, "
            f"δ, A or R and does not train; GAE carries V and A across it."
        )
        return lines
    action = f"  action  a_{i} = {row.token!r}, the token itself"
    if row.logprobs is not None:
        action += f"; log π(a_{i}|s_{i}) = {fmt(row.logprobs)}"
    if row.ref_logprobs is not None:
        action += f", log π_ref(a_{i}|s_{i}) = {fmt(row.ref_logprobs)}"
    lines.append(action)
    if row.kl is None:
        lines.append(f"  reward  r_{i} = score_{i} = {fmt(row.token_rewards)} (no KL in the reward)")
    else:
        lines.append(
            f"  reward  r_{i} = score_{i} − β·kl_{i} = {fmt(row.token_scores)} − {num(ledger.beta)}·"
            f"{factor(row.kl)} = {fmt(row.token_rewards)}"
        )
    lines += TOKEN_CREDIT.get(ledger.estimator, _credit_generic)(ledger, resp, i)
    return lines


def _next_valid(resp: ResponseLedger, i: int) -> int | None:
    return next((j for j in range(i + 1, resp.length) if resp.tokens[j].response_mask), None)


def _credit_gae(ledger: Ledger, resp: ResponseLedger, i: int) -> list[str]:
    row, j = resp.tokens[i], _next_valid(resp, i)
    T, g, gl = resp.length, num(ledger.gamma), num(ledger.gamma * (ledger.lam or 0.0))
    future = f"r_{i}" if i == T - 1 else f"r_{i} + γ·r_{i + 1} + …"
    lines = [
        f"  value   V(s_{i}) = {fmt(row.values)}: the critic's estimate of {future}, read before a_{i}; "
        f"it includes r_{i}"
    ]
    if j is None:
        lines.append(
            f"  TD      δ_{i} = r_{i} + γ·V(s_{T}) − V(s_{i}) = {fmt(row.token_rewards)} + {g}·0 − "
            f"{fmt(row.values)} = {fmt(row.deltas)}   (V(s_{T}) = 0: the episode has ended)"
        )
        lines.append(f"  adv     A_{i} = δ_{i} = {fmt(row.advantages)}   (no token after it)")
    else:
        nxt = resp.tokens[j]
        carry = "" if j == i + 1 else f"   (s_{j}: next generated token; observation tokens {i + 1}…{j - 1} carried)"
        lines.append(
            f"  TD      δ_{i} = r_{i} + γ·V(s_{j}) − V(s_{i}) = {fmt(row.token_rewards)} + {g}·"
            f"{factor(nxt.values)} − {fmt(row.values)} = {fmt(row.deltas)}{carry}"
        )
        lines.append(
            f"  adv     A_{i} = δ_{i} + γλ·A_{j} = {fmt(row.deltas)} + {gl}·{factor(nxt.advantages)} = "
            f"{fmt(row.advantages)}"
        )
    lines.append(
        f"  return  R_{i} = A_{i} + V(s_{i}) = {fmt(row.advantages)} + {fmt(row.values)} = "
        f"{fmt(row.returns)}: target of V(s_{i}), includes r_{i}; raw A_{i}, not the whitened one"
    )
    lines += _whitened_line(row, i)
    return lines


def _whitened_line(row: TokenRow, i: int) -> list[str]:
    if row.whitened_advantages is None:
        return []
    return [
        f"  whiten  Â_{i} = {fmt(row.whitened_advantages)}: A_{i} whitened over all valid tokens; "
        f"only the policy loss sees it"
    ]


def _credit_broadcast(ledger: Ledger, resp: ResponseLedger, i: int) -> list[str]:
    row = resp.tokens[i]
    return [
        f"  adv     A_{i} = {fmt(row.advantages)}: the advantage of the whole response (baseline above), "
        f"the same on every generated token (task-level credit)",
        f"  return  R_{i} = {fmt(row.returns)} (no critic is fitted to it)",
    ] + _whitened_line(row, i)


def _credit_reinforce_pp(ledger: Ledger, resp: ResponseLedger, i: int) -> list[str]:
    row = resp.tokens[i]
    mean, std = _stats([t.returns for r in ledger.responses for t in r.tokens if t.response_mask])
    return [
        f"  return  R_{i} = G_{i} = r_{i} + γ·G_(next) = {fmt(row.returns)}: discounted sum of the rewards "
        f"from a_{i} on (γ = {num(ledger.gamma)}, no critic)",
        f"  adv     A_{i} = (G_{i} − mean G)/std G over all valid tokens = ({fmt(row.returns)} − {fmt(mean)})"
        f"/{fmt(std)} = {fmt(row.advantages)}",
    ] + _whitened_line(row, i)


def _credit_process(ledger: Ledger, resp: ResponseLedger, i: int) -> list[str]:
    row = resp.tokens[i]
    ends = [t.index for t in resp.tokens if t.step_end and t.index >= i]
    return [
        f"  adv     A_{i} = Σ of the normalised step rewards r̃ of the steps ending at or after token {i} "
        f"(tokens {ends}) = {fmt(row.advantages)}",
        f"  return  R_{i} = {fmt(row.returns)} (no critic is fitted to it)",
    ] + _whitened_line(row, i)


def _credit_generic(ledger: Ledger, resp: ResponseLedger, i: int) -> list[str]:
    row = resp.tokens[i]
    return [
        f"  adv     A_{i} = {fmt(row.advantages)}, R_{i} = {fmt(row.returns)} (estimator {ledger.estimator})"
    ] + _whitened_line(row, i)


TOKEN_CREDIT = {
    "gae": _credit_gae,
    "grpo": _credit_broadcast,
    "dr_grpo": _credit_broadcast,
    "rloo": _credit_broadcast,
    "remax": _credit_broadcast,
    "reinforce_pp_baseline": _credit_broadcast,
    "reinforce_pp": _credit_reinforce_pp,
    "grpo_process": _credit_process,
}


# ---------------------------------------------------------------- group baselines


def sequence_score(resp: ResponseLedger) -> float:
    """S = Σ r_i over generated tokens: the score critic-free estimators compare (as verl)."""
    return sum(t.token_rewards for t in resp.tokens if t.response_mask and t.token_rewards is not None)


def baseline_lines(ledger: Ledger) -> list[str]:
    """How each response's advantage follows from its group: a line per group, then per response."""
    describe = BASELINES.get(ledger.estimator)
    if describe is None:
        return []
    group_line, response_line_ = describe
    lines = []
    for gid in dict.fromkeys(r.group_id for r in ledger.responses):
        if group_line is not None:
            lines.append(group_line(ledger, gid))
        indent = "" if group_line is None else "  "
        for b, resp in enumerate(ledger.responses):
            if resp.group_id == gid:
                lines.append(indent + response_line_(ledger, b))
    return lines


def _first_advantage(resp: ResponseLedger) -> str:
    return fmt(next((t.advantages for t in resp.tokens if t.response_mask), None))


def _group_scores(ledger: Ledger, gid: int | None) -> list[float]:
    return [sequence_score(r) for r in ledger.responses if r.group_id == gid]


def _group_scores_line(ledger: Ledger, gid: int | None) -> str:
    scores = _group_scores(ledger, gid)
    mean, std = _stats(scores)
    return (
        f"group {gid}: S = Σ_i r_i per response = [{', '.join(fmt(x) for x in scores)}], "
        f"mean {fmt(mean)}, std {fmt(std)} (unbiased)"
    )


def _response_grpo(ledger: Ledger, b: int) -> str:
    resp = ledger.responses[b]
    mean, std = _stats(_group_scores(ledger, resp.group_id))
    return (
        f"response {b}: A = (S − mean)/(std + ε) = ({fmt(sequence_score(resp))} − {fmt(mean)})/({fmt(std)} + ε)"
        f" = {_first_advantage(resp)}"
    )


def _response_dr_grpo(ledger: Ledger, b: int) -> str:
    resp = ledger.responses[b]
    mean, _ = _stats(_group_scores(ledger, resp.group_id))
    return (
        f"response {b}: A = S − mean = {fmt(sequence_score(resp))} − {factor(mean)} = {_first_advantage(resp)}"
        f" (no division by std)"
    )


def _response_rloo(ledger: Ledger, b: int) -> str:
    resp = ledger.responses[b]
    scores, S = _group_scores(ledger, resp.group_id), sequence_score(resp)
    others = (sum(scores) - S) / (len(scores) - 1)
    return (
        f"response {b}: baseline = mean S of the other {len(scores) - 1} = {fmt(others)}; "
        f"A = {fmt(S)} − {factor(others)} = {_first_advantage(resp)}"
    )


def _response_remax(ledger: Ledger, b: int) -> str:
    resp = ledger.responses[b]
    return (
        f"response {b}: A = S − reward of the greedy response = {fmt(sequence_score(resp))} − "
        f"{factor(resp.baseline_reward)} = {_first_advantage(resp)}"
    )


def _response_reinforce_pp_baseline(ledger: Ledger, b: int) -> str:
    resp = ledger.responses[b]
    raw = next((t.returns for t in resp.tokens if t.response_mask), None)
    return (
        f"response {b}: S − mean = {fmt(raw)} (= R), then whitened over all valid tokens → A = {_first_advantage(resp)}"
    )


def _group_steps_line(ledger: Ledger, gid: int | None) -> str:
    steps = [t.token_rewards for r in ledger.responses if r.group_id == gid for t in r.tokens if t.step_end]
    mean, std = _stats(steps)
    return (
        f"group {gid}: {len(steps)} step rewards, mean {fmt(mean)}, std {fmt(std)} (unbiased); "
        f"each becomes r̃ = (r − mean)/(std + ε)"
    )


def _response_process(ledger: Ledger, b: int) -> str:
    mine = [t for t in ledger.responses[b].tokens if t.step_end]
    return (
        f"response {b}: step rewards at tokens {[t.index for t in mine]} = "
        f"[{', '.join(fmt(t.token_rewards) for t in mine)}]; A_i = Σ r̃ of the steps ending at or after i"
    )


# estimator -> (line per group or None, line per response)
BASELINES = {
    "grpo": (_group_scores_line, _response_grpo),
    "dr_grpo": (_group_scores_line, _response_dr_grpo),
    "rloo": (_group_scores_line, _response_rloo),
    "remax": (None, _response_remax),
    "reinforce_pp_baseline": (_group_scores_line, _response_reinforce_pp_baseline),
    "grpo_process": (_group_steps_line, _response_process),
}


def _stats(xs: list[float]) -> tuple[float, float]:
    """(mean, unbiased std), as the estimators use (torch.std; Bessel's correction)."""
    import statistics

    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else float("nan")


def _clip(text: str, n: int = 40) -> str:
    return text if len(text) <= n else "…" + text[-(n - 1) :]
