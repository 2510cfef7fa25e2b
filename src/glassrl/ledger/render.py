"""Human views of a :class:`~glassrl.ledger.Ledger`: rich tables, Markdown, and the legend in the terminal.

Numbers are shown to 4 decimals; a quantity that was not computed shows as
"—". The optional columns (token id, log-probs, step ends) are left out when no row
has them; the convention's columns (kl_i … Â_i) are always shown, so that a
missing critic reads as "—" rather than disappearing. Observation tokens
(mask False) are dim in the rich table; a token another policy sampled adds its version, staleness,
log μ and the off-policy correction's weight and decision (v, lag, log μ, w_i, keep); a multi-turn
ledger adds the columns ``turn`` and ``role`` (gen / obs) and, under each response, its turns with their credit
(:func:`glassrl.ledger.legend.turn_legend`).

The legend's words and numbers come from :mod:`glassrl.ledger.legend` (the one
source, which the report shows too); :func:`legend_text` lays them out for the
terminal: the group baselines, then the chosen tokens, each line under its label.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from glassrl.ledger.legend import DASH, baseline_legend, fmt, num, terminal_line, token_legend, turn_legend
from glassrl.ledger.model import OFF_POLICY_FIELDS, SYMBOLS, Ledger, ResponseLedger, TokenRow
from glassrl.ledger.phrases import phrase

if TYPE_CHECKING:
    from rich.console import Group

# Left out of the views when no row of the ledger has them (role and turn: when no response has turns).
OPTIONAL_COLUMNS = ("token_id", "logprobs", "ref_logprobs", "step_end", "turn", "role", *OFF_POLICY_FIELDS)
COLUMNS = (
    "turn",
    "index",
    "token_id",
    "token",
    "logprobs",
    "ref_logprobs",
    "policy_version",
    "staleness",
    "rollout_logprobs",
    "is_weights",
    "is_keep",
    "kl",
    "token_scores",
    "token_rewards",
    "values",
    "deltas",
    "advantages",
    "returns",
    "whitened_advantages",
    "response_mask",
    "role",
    "step_end",
)


# TokenRow.role as a table cell: "obs" marks an observation (tool result) token.
ROLE_CELLS = {"generated": "gen", "observation": "obs"}


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
    if not any(resp.turns for resp in ledger.responses):
        present -= {"turn", "role"}  # a single-turn ledger: every token is generated
    return [name for name in COLUMNS if name not in OPTIONAL_COLUMNS or name in present]


def cell(row: TokenRow, name: str) -> str:
    value = getattr(row, name)
    if name in ("response_mask", "step_end", "is_keep"):
        return DASH if value is None else "1" if value else "0"
    if name == "token":
        return show_token(value)
    if name in ("index", "token_id", "turn", "policy_version", "staleness"):
        return DASH if value is None else str(value)
    if name == "role":
        return ROLE_CELLS.get(value, DASH)
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
        parts += [Text(line) for line in turn_legend(ledger, b)]
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
        turns = turn_legend(ledger, b)
        if turns:
            lines += ["```text", *turns, "```", ""]
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|")


# ---------------------------------------------------------------- legend


def legend_lines(ledger: Ledger, b: int, i: int, lang: str = "en") -> list[str]:
    """Token i of response b in words (glassrl.ledger.legend), as the terminal prints it."""
    return [terminal_line(line, lang) for line in token_legend(ledger, b, i, lang)]


def legend_text(ledger: Ledger, b: int, tokens: list[int], lang: str = "en") -> list[str]:
    """The legend under the table: group baselines (group estimators), then ``tokens`` of response ``b``."""
    lines = []
    baselines = baseline_legend(ledger, lang)
    if baselines:
        lines += [phrase("heading.baselines", lang), *("  " + x for x in baselines)]
    lines.append(phrase("heading.legend", lang))
    for i in tokens:
        lines += legend_lines(ledger, b, i, lang)
    return lines
