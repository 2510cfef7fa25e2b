"""Human views of a :class:`~glassrl.ledger.Ledger`: text tables, Markdown, and the legend in the terminal.

Numbers are shown to 4 decimals; a quantity that was not computed shows as
"—". The optional columns (token id, log-probs, step ends) are left out when no row
has them; the convention's columns (kl_i … Â_i) are always shown, so that a
missing critic reads as "—" rather than disappearing. Observation tokens
(mask False) are dim in the terminal's table; a token another policy sampled adds its version, staleness,
log μ and the off-policy correction's weight and decision (v, lag, log μ, w_i, keep); a multi-turn ledger adds the
columns ``turn`` and
``role`` (gen / obs) and, under each response, its turns with their credit
(:func:`glassrl.ledger.legend.turn_legend`).

The legend's words and numbers come from :mod:`glassrl.ledger.legend` (the one
source, which the report shows too); :func:`legend_text` lays them out for the
terminal: the group baselines, then the chosen tokens, each line under its label.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rich.cells import cell_len

from glassrl.ledger.legend import DASH, baseline_legend, fmt, num, terminal_line, token_legend, turn_legend
from glassrl.ledger.model import OFF_POLICY_FIELDS, SYMBOLS, Ledger, ResponseLedger, TokenRow
from glassrl.ledger.phrases import phrase

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


def to_text(ledger: Ledger, width: int | None = None, styled: bool = False) -> list[str]:
    """The run line, then per response its line, its token table and its turns: the lines ``glassrl
    explain`` prints. Every column is as wide as its widest cell, so no value is cut: a file or a
    pipe gets the whole table (``width`` None). With ``width`` (a terminal's) the columns that do not
    fit go to further tables below, each repeating the token's own columns (turn, i, a_i).
    ``styled``: ANSI bold for the run line, dim for tokens that do not train (observations).

    The layout is rich's ``box.SIMPLE_HEAD`` table (a space at the edges, three between columns, a
    rule under the header), written directly: rich's Table took about 2 ms a row (a 32 k-token
    response over a minute, issue 37 item 5); this is linear in the cells, with no per-row objects.
    """
    shown = columns(ledger)
    lines = [_style(run_line(ledger), BOLD if styled else "")]
    for b, resp in enumerate(ledger.responses):
        heads = [SYMBOLS[name] for name in shown]
        cells = [[_visible(cell(row, name)) for row in resp.tokens] for name in shown]  # column by column
        # a number or "—" takes one terminal column a character; only token text may hold wide characters
        widths = [
            max(_width(head), *map(_width if name == "token" else len, column))
            for head, name, column in zip(heads, shown, cells)
        ]
        padded = [_pad(column, w, name) for column, w, name in zip(cells, widths, shown)]
        dim = [DIM if styled and not row.response_mask else "" for row in resp.tokens]
        lines.append(response_line(b, resp))
        for panel in _panels(shown, widths, width):
            rule = " " + "─" * (sum(widths[c] for c in panel) + 3 * (len(panel) - 1))
            lines += ["", _join(_pad([heads[c]], widths[c], shown[c])[0] for c in panel), rule]
            rows = map(_join, zip(*(padded[c] for c in panel)))
            lines += [_style(row, style) for row, style in zip(rows, dim)] if styled else rows
            lines.append("")
        lines += turn_legend(ledger, b)
    return lines


BOLD, DIM = "\x1b[1m", "\x1b[2m"  # ANSI styles (a terminal only)
KEY_COLUMNS = ("turn", "index", "token")  # repeated in each part of a table too wide for the terminal
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _style(text: str, style: str) -> str:
    return f"{style}{text}\x1b[0m" if style else text


def _visible(text: str) -> str:
    """A cell with control characters written as escapes: a token's ESC cannot drive the terminal."""
    return _CONTROL.sub(lambda m: ascii(m[0])[1:-1], text) if _CONTROL.search(text) else text


def _width(text: str) -> int:
    """Terminal columns of ``text`` (a CJK character takes two)."""
    return len(text) if text.isascii() else cell_len(text)


def _pad(column: list[str], width: int, name: str) -> list[str]:
    """The cells of a column padded to ``width`` terminal columns: token text on the left, numbers on the right."""
    if name != "token":
        return [text.rjust(width) for text in column]
    return [text + " " * (width - _width(text)) for text in column]


def _join(cells: Iterable[str]) -> str:
    return (" " + "   ".join(cells)).rstrip()


def _panels(shown: list[str], widths: list[int], width: int | None) -> list[list[int]]:
    """Column indices of each table: one with every column, or (to fit ``width``) the key columns
    and, greedily, as many others as fit (at least one)."""
    total = sum(widths) + 3 * (len(widths) - 1) + 2
    if width is None or total <= width:
        return [list(range(len(shown)))]
    key = [c for c, name in enumerate(shown) if name in KEY_COLUMNS]
    panels: list[list[int]] = []
    used = 0
    for c, name in enumerate(shown):
        if name in KEY_COLUMNS:
            continue
        if panels and used + 3 + widths[c] <= width:
            panels[-1].append(c)
            used += 3 + widths[c]
        else:
            panels.append([*key, c])
            used = sum(widths[k] + 3 for k in key) + widths[c] + 2
    return [sorted(p) for p in panels]


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
