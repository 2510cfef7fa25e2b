"""``glassrl explain``: the token ledger of given responses, or of a model's (``--model``).

Without ``--model`` the user gives the prompt, the response tokens, the score(s), KL (or log-prob
pairs), values, γ, λ, β and an estimator (flags for one response, or
``--input FILE`` for several: glassrl.commands.explain_input). The command
computes token rewards, TD errors, advantages and returns with glassrl.algos,
exactly as the trainer does, and prints the ledger with a legend that walks
through chosen tokens with their numbers.

    glassrl explain --prompt "请问1+1=2？" --tokens 是 的 ， 等于 2 ！ --score 1 \\
        --kl 0.1 0.05 -0.05 0.1 0.2 0.05 --beta 0.1 \\
        --values 0.20 0.25 0.30 0.35 0.45 0.60 --gamma 1 --lam 0.95

With ``--model RUN_DIR_OR_CHECKPOINT`` the models compute every number of given
(``--response``) or sampled (``--sample N``) responses, as the trainer does
(glassrl.commands.explain_model):

    glassrl explain --model runs/grpo --prompt "请问1+1=2？" --response "是的，等于2！" --sample 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from glassrl.commands import explain_input, explain_model
from glassrl.commands.explain_model import DEFAULT_REWARD
from glassrl.errors import GlassrlError

if TYPE_CHECKING:
    from glassrl.ledger import Ledger

HELP = (
    "Print the token ledger (log-probs, KL, rewards, values, δ, advantages, returns) of given responses, "
    "or of a trained model's (--model)."
)
FORMATS = ("table", "markdown", "csv", "jsonl")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Numbers are read as strings and converted in explain_input, so that a bad
    # value is a one-line error naming the flag (argparse would print usage too).
    data = parser.add_argument_group("one response (or use --input)")
    data.add_argument("--prompt", help="the prompt text x")
    data.add_argument("--tokens", nargs="+", metavar="TOKEN", help="the response as an explicit token list")
    data.add_argument("--response", help="the response text, split by --tokenizer")
    data.add_argument("--score", metavar="X", help="outcome score, placed on the last generated token")
    data.add_argument("--token-scores", nargs="+", metavar="X", help="a score per token (instead of --score)")
    data.add_argument("--step-ends", nargs="+", metavar="I", help="process rewards: token index of each step end")
    data.add_argument("--step-scores", nargs="+", metavar="X", help="process rewards: the score of each step")
    data.add_argument("--kl", nargs="+", metavar="X", help="KL estimate per token")
    data.add_argument("--logprobs", nargs="+", metavar="X", help="log π(a_i|s_i) per token (with --ref-logprobs)")
    data.add_argument("--ref-logprobs", nargs="+", metavar="X", help="log π_ref(a_i|s_i) per token")
    data.add_argument("--values", nargs="+", metavar="X", help="V(s_i) per token (critic, read before token i)")
    data.add_argument("--mask", nargs="+", metavar="0|1", help="1 = generated token, 0 = tool/observation token")
    data.add_argument("--baseline-reward", metavar="X", help="ReMax: reward of the greedy response")
    model = parser.add_argument_group("a model computes the numbers (with --prompt, and --response or --sample)")
    model.add_argument(
        "--model",
        metavar="RUN_DIR|CHECKPOINT",
        help="a training run directory, one of its checkpoints, or a Hugging Face model directory",
    )
    model.add_argument("--sample", metavar="N", help="also sample N responses (the run's rollout settings)")
    model.add_argument("--seed", metavar="S", help="seed of the sampling generator (default 0)")
    model.add_argument(
        "--reward",
        metavar="NAME",
        help=f"reward source (default: the run's reward.sources; a plain model: {DEFAULT_REWARD})",
    )
    model.add_argument("--answer", metavar="TEXT", help="reference answer, for a prompt not in a bundled task's form")
    model.add_argument(
        "--reference",
        metavar="PATH",
        help="reference policy π_ref (default: the run's; a plain model: the model itself)",
    )
    params = parser.add_argument_group("parameters (override --input, or the run of --model)")
    params.add_argument("--input", metavar="FILE", help="JSON/YAML file with the responses and parameters")
    params.add_argument("--tokenizer", metavar="PATH", help="local Hugging Face tokenizer directory")
    params.add_argument("--gamma", metavar="γ", help="discount γ in [0, 1] (default 1)")
    params.add_argument("--lam", metavar="λ", help="GAE λ in [0, 1] (default 1)")
    params.add_argument("--beta", metavar="β", help="KL coefficient in the reward (default 0)")
    params.add_argument("--estimator", help="advantage estimator (default gae)")
    params.add_argument("--kl-kind", help="KL estimator for log-prob pairs: k1 (default), abs, k2, k3")
    params.add_argument(
        "--whiten",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also show whitened advantages (default: on for gae, as PPO)",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--format", choices=FORMATS, default="table", help="table (default), markdown, csv, jsonl")
    out.add_argument("--out", metavar="FILE", help="write to FILE instead of printing")
    out.add_argument("--html", metavar="FILE", help="also write the token view (the run report's) to FILE")
    out.add_argument("--legend-response", metavar="B", default="0", help="response the legend explains (default 0)")
    out.add_argument("--legend-token", metavar="I", help="token the legend explains (default: first and last)")


def run(args: argparse.Namespace) -> int:
    explain_model.check_flags(args)
    if args.model is not None:
        ledger, header = explain_model.from_args(args)
    else:
        ledger, header = build_ledger(explain_input.from_args(args)), []
    if args.html is not None:
        from glassrl.report.html import write_explain_html

        print(f"token view: {write_explain_html(ledger, args.html)}", file=sys.stderr)
    lines = legend(ledger, args.legend_response, args.legend_token) if args.format in ("table", "markdown") else []
    if args.format == "jsonl":
        text = ledger.jsonl()
    elif args.format == "csv":
        text = ledger.csv()
    elif args.format == "markdown":
        text = "".join(f"{line}\n\n" for line in header) + ledger.to_markdown()
        text += "\n```text\n" + "\n".join(lines) + "\n```\n"
    else:
        return _print_table(ledger, header, lines, args.out)
    if args.out is None:
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


def _print_table(ledger: Ledger, header: list[str], legend: list[str], out: str | None) -> int:
    from rich.console import Console
    from rich.text import Text

    def show(console: Console) -> None:
        for line in header:
            console.print(Text(line), soft_wrap=True)
        console.print(ledger.to_rich())
        for line in legend:
            console.print(Text(line, style="bold" if not line.startswith(" ") else ""), soft_wrap=True)

    if out is None:
        # Not a terminal (pipe, file): wide enough that the table is not squeezed.
        show(Console(highlight=False, width=None if sys.stdout.isatty() else 160))
    else:
        with open(out, "w", encoding="utf-8") as f:
            show(Console(file=f, highlight=False, width=160, color_system=None))
    return 0


def legend(ledger: Ledger, response: str, token: str | None) -> list[str]:
    """Group baselines (group estimators), then the chosen tokens of one response in words."""
    from glassrl.ledger.render import baseline_lines, legend_lines

    b = explain_input.integer(response, "--legend-response")
    if not 0 <= b < len(ledger.responses):
        raise GlassrlError(f"--legend-response: expected 0 … {len(ledger.responses) - 1}, got {b}")
    n = ledger.responses[b].length
    if token is None:
        picks = sorted({0, n - 1})
    else:
        i = explain_input.integer(token, "--legend-token")
        if not 0 <= i < n:
            raise GlassrlError(f"--legend-token: response {b} has tokens 0 … {n - 1}, got {i}")
        picks = [i]
    lines = []
    baselines = baseline_lines(ledger)
    if baselines:
        lines += [
            "Baselines (how each response's advantage follows from its group or baseline):",
            *("  " + x for x in baselines),
        ]
    lines.append("Legend (s_i = state before token i, a_i = the token; values[i] = V(s_i) is read before a_i):")
    for i in picks:
        lines += legend_lines(ledger, b, i)
    return lines


def build_ledger(spec: explain_input.ExplainSpec) -> Ledger:
    """Token rewards, advantages, returns (and δ, whitened A) of the spec's responses, as the trainer computes them."""
    import torch

    from glassrl.algos.advantages import (
        REQUIRED_INPUTS,
        AdvantageInputs,
        AdvantageParams,
        compute_advantages,
        td_errors,
    )
    from glassrl.algos.kl import kl_penalty
    from glassrl.algos.masked import masked_whiten
    from glassrl.algos.token_rewards import assemble_token_rewards, place_outcome_scores, place_process_rewards
    from glassrl.ledger import Ledger

    resps, dt = spec.responses, torch.float64  # float64: the printed digits are the arithmetic's, not fp32 noise
    B, T = len(resps), max(len(r.tokens) for r in resps)

    def pad(key: str, fill: float = 0.0, dtype: torch.dtype = dt) -> torch.Tensor | None:
        rows = [getattr(r, key) for r in resps]
        if any(row is None for row in rows):  # check() made values, KL, log-probs all-or-none
            return None
        return torch.tensor([list(row) + [fill] * (T - len(row)) for row in rows], dtype=dtype)  # (B, T)

    lengths = torch.tensor([len(r.tokens) for r in resps])  # (B,)
    inside = torch.arange(T).expand(B, T) < lengths.unsqueeze(1)  # (B, T)
    given_mask = torch.tensor([(r.mask or [True] * len(r.tokens)) + [False] * (T - len(r.tokens)) for r in resps])
    mask = inside & given_mask  # (B, T)

    has_score = torch.tensor([r.score is not None for r in resps])  # (B,)
    scores = torch.tensor([r.score if r.score is not None else 0.0 for r in resps], dtype=dt)  # (B,)
    token_scores = torch.where(
        has_score.unsqueeze(1),
        place_outcome_scores(scores, mask),
        torch.tensor(
            [(r.token_scores or [0.0] * len(r.tokens)) + [0.0] * (T - len(r.tokens)) for r in resps], dtype=dt
        ),
    )  # (B, T)
    step_end_mask = None
    if resps[0].step_ends is not None:
        S = max(len(r.step_ends) for r in resps)
        ends = torch.tensor([r.step_ends + [0] * (S - len(r.step_ends)) for r in resps])  # (B, S)
        step_scores = torch.tensor([r.step_scores + [0.0] * (S - len(r.step_scores)) for r in resps], dtype=dt)
        step_valid = torch.arange(S).expand(B, S) < torch.tensor([[len(r.step_ends)] for r in resps])  # (B, S)
        token_scores = token_scores + place_process_rewards(step_scores, ends, step_valid, T)
        step_end_mask = place_process_rewards(torch.ones(B, S, dtype=dt), ends, step_valid, T) > 0  # (B, T)

    logprobs, ref_logprobs = pad("logprobs"), pad("ref_logprobs")
    kl = kl_penalty(logprobs, ref_logprobs, spec.kl_kind) if logprobs is not None else pad("kl")
    token_rewards = assemble_token_rewards(
        token_scores, kl if kl is not None else torch.zeros(B, T, dtype=dt), spec.beta, mask
    )
    values = pad("values")
    grouped = "group_index" in REQUIRED_INPUTS[spec.estimator] or any(r.group is not None for r in resps)
    group_index = torch.tensor([r.group or 0 for r in resps]) if grouped else None  # (B,)
    baselines = [r.baseline_reward for r in resps]
    inputs = AdvantageInputs(
        token_rewards=token_rewards,
        response_mask=mask,
        values=values,
        group_index=group_index,
        baseline_rewards=None if None in baselines else torch.tensor(baselines, dtype=dt),
        step_end_mask=step_end_mask,
    )
    try:
        out = compute_advantages(spec.estimator, inputs, AdvantageParams(gamma=spec.gamma, lam=spec.lam))
    except ValueError as err:  # a case the checks above did not foresee: still one line, naming the input
        raise GlassrlError(f"{spec.source}: {err}") from None
    uses_lam = "values" in REQUIRED_INPUTS[spec.estimator]  # λ belongs to GAE, the critic's estimator
    return Ledger.from_tensors(
        prompts=[r.prompt for r in resps],
        token_texts=[r.tokens for r in resps],
        response_mask=mask,
        estimator=spec.estimator,
        gamma=spec.gamma,
        lam=spec.lam if uses_lam else None,
        beta=spec.beta,
        kl_kind=spec.kl_kind if logprobs is not None else None,
        token_ids=pad("token_ids", 0, torch.long),
        logprobs=logprobs,
        ref_logprobs=ref_logprobs,
        kl=kl,
        token_scores=token_scores,
        token_rewards=token_rewards,
        values=values,
        deltas=td_errors(token_rewards, values, mask, spec.gamma) if values is not None else None,
        advantages=out.advantages,
        returns=out.returns,
        whitened_advantages=masked_whiten(out.advantages, mask) if spec.whiten else None,
        step_end_mask=step_end_mask,
        scores=None if None in [r.score for r in resps] else scores,
        group_ids=group_index,
        baseline_rewards=inputs.baseline_rewards,
        lengths=lengths,
        finish_reasons=[r.finish_reason for r in resps],
        responses=[r.response if r.response is not None else "".join(r.tokens) for r in resps],
    )
