"""``python -m glassrl.commands.demo --walkthrough`` (or ``python -m glassrl.walkthrough``): the token convention
in four ledgers, without a model.

1. The worked example of the reference documents (dialogue c, question 1):
   "请问1+1=2？" → "是的，等于2！", GAE with γ = 1, λ = 0.95.
2. The same with λ = 0: the advantage is the one-step TD error.
3. The same with λ = 1: the advantage is the Monte-Carlo return minus V.
4. A GRPO group of 4 responses with scores [1, 0, 1, 0]: one advantage per
   response, broadcast to its tokens.

Each part prints the equivalent ``glassrl explain`` command, then runs exactly
that command in-process. The inputs are the files in examples/explain/ of the
source tree. Runs in seconds on a CPU.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from glassrl.errors import GlassrlError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "explain"
REFERENCE = "examples/explain/reference_dialogue_c.json"
GROUP = "examples/explain/grpo_group.json"


def _argv(command: list[str]) -> list[str]:
    """The command with example paths made absolute, so that it runs from any directory."""
    return [str(EXAMPLES / Path(a).name) if a.startswith("examples/explain/") else a for a in command]


def _ledger(command: list[str]):
    from glassrl.cli import build_parser
    from glassrl.commands import explain, explain_input

    args = build_parser(only="explain").parse_args(_argv(command))
    return explain.build_ledger(explain_input.from_args(args))


def _parts() -> list[tuple[str, list[str], str]]:
    """(title, explain arguments, explanation) per part; the explanations quote the ledgers' numbers."""
    from glassrl.ledger.render import fmt

    base = ["explain", "--input", REFERENCE]
    ref = _ledger(base).responses[0].tokens
    td = _ledger([*base, "--lam", "0"]).responses[0].tokens
    mc = _ledger([*base, "--lam", "1"]).responses[0].tokens
    group = _ledger(["explain", "--input", GROUP]).responses
    return [
        (
            "1. The reference example: GAE, γ = 1, λ = 0.95",
            base,
            "Prompt 请问1+1=2？, response 是的，等于2！ in 6 tokens (dialogue c, question 1). Row i is the action "
            "a_i = y_i taken in the state s_i = prompt ⊕ y_<i. The outcome score 1 sits on the last token; every "
            "token pays β·kl_i, so r_i = score_i − β·kl_i. V(s_i) is read before a_i, so it estimates "
            "r_i + γ·r_{i+1} + … and includes r_i. δ_i = r_i + γ·V(s_{i+1}) − V(s_i) with V(s_6) = 0, "
            "A_i = δ_i + γλ·A_{i+1} from the back, R_i = A_i + V(s_i) is the critic's target (raw A), and Â_i, "
            f"the whitened A, is what the policy loss sees. The final score reaches the first token: "
            f"A_0 = {fmt(ref[0].advantages)}.",
        ),
        (
            "2. λ = 0: one-step TD",
            [*base, "--lam", "0", "--legend-token", "0"],
            f"With λ = 0 the advantage is the TD error alone, A_i = δ_i (A_0 = δ_0 = {fmt(td[0].advantages)}), "
            f"and the return is r_i + γ·V(s_{{i+1}}) (R_0 = {fmt(td[0].returns)}). Low variance, but the credit "
            "of the final score reaches a_0 only through the critic's V(s_1): if the critic is wrong, so is A.",
        ),
        (
            "3. λ = 1: Monte-Carlo",
            [*base, "--lam", "1", "--legend-token", "0"],
            "With λ = 1 the δ's telescope: A_i = r_i + γ·r_{i+1} + … − V(s_i), the Monte-Carlo return minus the "
            f"value, and R_i is the plain discounted return (R_0 = {fmt(mc[0].returns)}, "
            f"A_0 = {fmt(mc[0].returns)} − {fmt(mc[0].values)} = {fmt(mc[0].advantages)}). Unbiased, but every "
            "later token's luck lands on a_0. The returns are not monotone here: the negative KL estimate on "
            f"'，' makes r_2 > 0, so R_2 = {fmt(mc[2].returns)} > R_3 = {fmt(mc[3].returns)}.",
        ),
        (
            "4. GRPO: a group of 4 responses, task-level credit",
            ["explain", "--input", GROUP],
            "No critic. The 4 responses to the same prompt (scores 1, 0, 1, 0) are compared with each other: "
            "S = Σ r_i per response, A = (S − mean)/(std + ε) with the group's mean and unbiased std, and that "
            f"one number is broadcast to every token of the response (A = {fmt(group[0].tokens[0].advantages)} "
            f"for the correct answers, {fmt(group[1].tokens[0].advantages)} for the wrong ones). Every token of "
            "a correct answer is pushed up equally, '是' as much as '2': task-level credit, where GAE gives "
            "each token its own.",
        ),
    ]


def explain_walkthrough() -> int:
    """Print the four parts; 0, or 2 when the example files are missing."""
    from rich.console import Console
    from rich.rule import Rule
    from rich.text import Text

    from glassrl.cli import main as glassrl_main

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    try:
        if not EXAMPLES.is_dir():
            raise GlassrlError(f"the walkthrough reads {EXAMPLES}; run it from a source checkout")
        parts = _parts()
    except GlassrlError as err:
        print(f"glassrl walkthrough: error: {err}", file=sys.stderr)
        return 2
    title = "glassrl walkthrough: the token ledger, number by number (docs/token-convention.md)"
    console.print(Text(title, style="bold"))
    for title, command, explanation in parts:
        console.print(Rule(Text(title, style="bold")))
        console.print(Text(explanation))
        console.print(Text("$ glassrl " + shlex.join(command), style="bold cyan"))
        sys.stdout.flush()
        glassrl_main(_argv(command))
        console.print()
    return 0


if __name__ == "__main__":
    sys.exit(explain_walkthrough())
