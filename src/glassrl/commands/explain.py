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

With ``--model`` a run of ``glassrl dpo`` and ``--chosen``/``--rejected`` instead of
``--response``, the preference ledger of that pair: per token log π_θ, log π_ref and the
implicit reward, whose sums are the loss's rewards (glassrl.commands.explain_preference):

    glassrl explain --model runs/dpo-arith --prompt "37+45=82？" --chosen "是的，等于82。" --rejected "不，等于83。"

With ``--mismatch RUN_DIR [--step N]`` it splits a step's gap between the sampler's log μ and the
trainer's log π_old among its causes (glassrl.commands.explain_mismatch):

    glassrl explain --mismatch runs/grpo --step 4

With ``--ledger FILE`` it shows a ledger a run wrote as it is (an asynchronous run's per-token
version, staleness, log μ and off-policy weight among its columns and in the legend):

    glassrl explain --ledger runs/tool_add/ledgers/step_000010.jsonl --legend-token 3 --lang zh
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from glassrl.commands import explain_input
from glassrl.errors import GlassrlError
from glassrl.ledger import read_jsonl
from glassrl.ledger.phrases import LANGUAGES
from glassrl.ledger.render import legend_text, to_markdown, to_text

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
    model.add_argument("--chosen", metavar="TEXT", help="with a glassrl dpo run: the preferred response of a pair")
    model.add_argument("--rejected", metavar="TEXT", help="with a glassrl dpo run: the dispreferred response")
    model.add_argument("--sample", metavar="N", help="also sample N responses (the run's rollout settings)")
    model.add_argument("--seed", metavar="S", help="seed of the sampling generator (default 0)")
    model.add_argument(
        "--reward",
        metavar="NAME|FILE.py:FN",
        help="reward source, or your function (module:fn or file.py:fn, any style) (default: the run's "
        "reward.sources; a plain model: `glassrl train`'s default reward.sources for a prompt in a bundled "
        "task's form, else "
        "math against --answer)",
    )
    model.add_argument("--answer", metavar="TEXT", help="reference answer, for a prompt not in a bundled task's form")
    model.add_argument(
        "--reference",
        metavar="PATH",
        help="reference policy π_ref (default: the run's; a plain model: the model itself)",
    )
    params = parser.add_argument_group("parameters (override --input, or the run of --model)")
    params.add_argument("--input", metavar="FILE", help="JSON/YAML file with the responses and parameters")
    params.add_argument(
        "--ledger",
        metavar="FILE",
        help="a ledger file a run wrote (RUN_DIR/ledgers/step_N.jsonl), shown as it is: asynchronous "
        "training's version, staleness, log μ and off-policy weight per token included",
    )
    params.add_argument(
        "--mismatch",
        metavar="RUN_DIR",
        help="where a step's gap log μ − log π_old comes from: its tokens recomputed with each factor (precision, "
        "batch layout, weights version, re-rendering, engine) as the sampler or the trainer had it (docs/debugging.md)",
    )
    params.add_argument("--step", metavar="N", help="with --mismatch: the step (default: the latest it can explain)")
    params.add_argument("--top", metavar="K", help="with --mismatch: tokens listed (default 5)")
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
    out.add_argument("--lang", choices=LANGUAGES, default="en", help="language of the legend: en (default), zh")


def run(args: argparse.Namespace) -> int:
    from glassrl.jsonl import check_plain

    for flag in ("prompt", "response", "tokens", "chosen", "rejected", "answer"):
        # a shell's undecodable bytes arrive as lone surrogates ($'hi\xff'), which no tokenizer encodes
        check_plain(getattr(args, flag), "command line", f"--{flag}")
    explain_input.check_model_flags(args)  # explain_model (it loads torch and transformers) only for --model
    for flag, value in (("--out", args.out), ("--html", args.html)):
        if value is not None:
            _check_output(flag, value)
    if args.mismatch is not None:
        given = [f for f in ("model", "input", "prompt", "tokens", "response", "ledger", "html") if getattr(args, f)]
        if given:
            raise GlassrlError(f"--mismatch explains a run's step; --{given[0]} does something else: choose one")
        from glassrl.commands import explain_mismatch  # torch and transformers: only for --mismatch

        return _emit(explain_mismatch.run(args), args.out)
    if args.step is not None or args.top is not None:
        raise GlassrlError(f"--{'step' if args.step is not None else 'top'}: only with --mismatch RUN_DIR")
    if args.ledger is not None:
        given = [flag for flag in ("model", "input", "prompt", "tokens", "response") if getattr(args, flag) is not None]
        if given:
            raise GlassrlError(f"--ledger shows a ledger a run wrote; --{given[0]} computes one: choose one")
    if args.model is not None or args.chosen is not None or args.rejected is not None:
        # imported here: it loads torch, which explain's other modes may not need
        from glassrl.commands import explain_preference

        if explain_preference.check_flags(args):
            return _print_pair(*explain_preference.from_args(args), args)
    if args.ledger is not None:
        ledger = read_jsonl(args.ledger)
        header = [f"{args.ledger}: step {ledger.step}"]
    elif args.model is not None:
        from glassrl.commands import explain_model

        ledger, header = explain_model.from_args(args)
    else:
        ledger, header = build_ledger(explain_input.from_args(args)), []
    if args.html is not None:
        from glassrl.report.html import write_explain_html

        with _writing("--html", args.html):
            print(f"token view: {write_explain_html(ledger, args.html, lang=args.lang)}", file=sys.stderr)
    table = args.format in ("table", "markdown")
    lines = legend(ledger, args.legend_response, args.legend_token, args.lang) if table else []
    if args.format == "jsonl":
        text = ledger.jsonl()
    elif args.format == "csv":
        text = ledger.csv()
    elif args.format == "markdown":
        text = "".join(f"{line}\n\n" for line in header) + to_markdown(ledger)
        text += "\n```text\n" + "\n".join(lines) + "\n```\n"
    else:
        return _print_table(ledger, header, lines, args.out)
    return _emit(text, args.out)


def _print_pair(ledger, header: list[str], args: argparse.Namespace) -> int:
    """A preference ledger (glassrl.ledger.preference) as text, Markdown or one JSON line."""
    import json

    lines = ledger.lines(args.lang)
    if args.format == "jsonl":
        text = json.dumps(ledger.to_dict(), ensure_ascii=False) + "\n"
    elif args.format == "markdown":
        text = "".join(f"{line}\n\n" for line in header) + "```text\n" + "\n".join(lines) + "\n```\n"
    else:
        text = "\n".join([*header, *lines]) + "\n"
    return _emit(text, args.out)


def _emit(text: str, out: str | None) -> int:
    """``text`` to stdout, or to the file ``out``."""
    if out is None:
        sys.stdout.write(text)
    else:
        with _writing("--out", out):
            Path(out).write_text(text, encoding="utf-8")
    return 0


def _check_output(flag: str, value: str) -> None:
    """An output path that can be written: not a directory, in a directory that exists (checked
    before the ledger is computed, so that a typo costs nothing)."""
    path = Path(value)
    if path.is_dir():
        raise GlassrlError(f"{flag} {value}: is a directory; give a file name")
    if not path.parent.is_dir():
        raise GlassrlError(f"{flag} {value}: the directory {path.parent} does not exist")


@contextmanager
def _writing(flag: str, value: str) -> Iterator[None]:
    """A write error (no space left, no permission) as one line naming the flag."""
    try:
        yield
    except OSError as err:
        raise GlassrlError(f"{flag} {value}: cannot write: {err.strerror or err}") from None


def _print_table(ledger: Ledger, header: list[str], legend: list[str], out: str | None) -> int:
    """The table and its legend: in a terminal fitted to its width (columns that do not fit in a
    further table), bold and dim; to a pipe, a file or ``--out``, every column whole and no styles."""
    import shutil

    terminal = out is None and sys.stdout.isatty()
    styled = terminal and not os.environ.get("NO_COLOR")
    bold = (lambda line: f"\x1b[1m{line}\x1b[0m") if styled else (lambda line: line)
    width = shutil.get_terminal_size().columns if terminal else None
    lines = [
        *header,
        *to_text(ledger, width, styled),
        *(line if line.startswith(" ") else bold(line) for line in legend),
    ]
    return _emit("".join(f"{line}\n" for line in lines), out)


def legend(ledger: Ledger, response: str, token: str | None, lang: str = "en") -> list[str]:
    """Group baselines (group estimators), then the chosen tokens of one response in words."""
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
    return legend_text(ledger, b, picks, lang)


def build_ledger(spec: explain_input.ExplainInput) -> Ledger:
    """Token rewards, advantages, returns (and δ, whitened A) of the spec's responses, as the trainer
    computes them (glassrl.ledger.compute.from_given); a case the checks did not foresee is still one
    line naming the input."""
    from glassrl.ledger.compute import from_given

    try:
        return from_given(
            spec.responses,
            estimator=spec.estimator,
            gamma=spec.gamma,
            lam=spec.lam,
            beta=spec.beta,
            kl_kind=spec.kl_kind,
            whiten=spec.whiten,
        )
    except ValueError as err:  # raised by glassrl.algos
        raise GlassrlError(f"{spec.source}: {err}") from None
