"""reasoning-gym (PyPI ``reasoning-gym``, ``glassrl[reasoning-gym]``): procedural tasks as prompts and a reward.

A reasoning-gym dataset is seeded: ``reasoning_gym.create_dataset(name, seed=, size=, **config)``
(reasoning_gym/factory.py:51) yields entries ``{"question", "answer", "metadata"}``, and the
dataset's ``score_answer(answer, entry)`` (reasoning_gym/dataset.py:63; ChainSum's at
reasoning_gym/arithmetic/chain_sum.py:119) scores an extracted answer in [0, 1]. Entry ``i`` of seed ``s`` is drawn from
``random.Random(s + i)`` (chain_sum.py:54; 97 of the 0.1.25 generators do so), so seeds 1 and 2 share
all but one entry: a held-out set takes a seed at least the training size away, and ``--exclude``
leaves out the questions the training file asks (a small task repeats questions across seeds).

Here (docs/agentic.md, "Bring your environment"):

- :func:`export` writes a dataset as JSON lines that ``data.train`` / ``data.eval`` read: ``prompt``
  (the question), ``answer``, and ``reasoning_gym`` (the dataset name and the whole entry, as JSON
  text), so a score needs nothing but the record::

      python -m glassrl.agents.hubs.reasoning_gym chain_sum --seed 1 --size 2000 --out data/rg_train.jsonl

- :func:`score` is a reward function in glassrl's style (``reward.sources: [{name: user_function,
  spec: "glassrl.agents.hubs.reasoning_gym:score"}]``): the answer is the last ``<answer>…</answer>``
  (reasoning-gym's own ``extract_answer``, reasoning_gym/utils.py:25) or, without that tag, the whole
  response stripped; the dataset's ``score_answer`` judges it;
- :class:`ReasoningGymEnvironment` is the same judge as a one-turn environment
  (``rollout.agent.environment: glassrl.agents.hubs.reasoning_gym:ReasoningGymEnvironment``): the
  first turn is the answer, scored as reward part ``reasoning_gym``; ``glassrl audit`` runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence, Set
from pathlib import Path
from typing import Any

from glassrl.agents.environment import StepResult
from glassrl.agents.hubs import require
from glassrl.agents.tools import Tool, ToolCall
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.files import replaced

FIELD = "reasoning_gym"  # the row's field holding {"dataset": name, "entry": the entry}, as JSON text
REWARD_PART = "reasoning_gym"


def _rg() -> Any:
    return require("reasoning_gym", "reasoning-gym", "reasoning-gym")


def entries(name: str, *, seed: int, size: int, config: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The ``size`` entries of reasoning-gym's dataset ``name`` made from ``seed`` (and the dataset's
    ``config`` fields); GlassrlError naming the dataset for an unknown name or field."""
    try:
        return list(_rg().create_dataset(name, seed=seed, size=size, **dict(config or {})))
    except (ValueError, TypeError, AssertionError) as err:
        raise GlassrlError(f"reasoning-gym dataset {name!r} (seed {seed}, size {size}): {err}") from None


def row(name: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """One JSON-lines row: the question as the prompt, the reference answer, the entry kept whole."""
    kept = json.dumps({"dataset": name, "entry": entry}, ensure_ascii=False, default=str)
    return {"prompt": str(entry["question"]), "answer": str(entry["answer"]), FIELD: kept}


def records(name: str, *, seed: int, size: int, config: Mapping[str, Any] | None = None) -> list[PromptRecord]:
    """The dataset as prompt records (what :func:`export` writes, read back)."""
    made = []
    for i, entry in enumerate(entries(name, seed=seed, size=size, config=config)):
        r = row(name, entry)
        made.append(PromptRecord(r["prompt"], r["answer"], {FIELD: r[FIELD]}, f"reasoning-gym:{name}/{seed}#{i}"))
    return made


def export(
    name: str,
    out: str | Path,
    *,
    seed: int,
    size: int,
    config: Mapping[str, Any] | None = None,
    exclude: Set[str] = frozenset(),
) -> tuple[Path, int]:
    """Write the dataset as JSON lines to ``out`` (replaced atomically), leaving out the entries whose
    question is in ``exclude`` (a training set's prompts: a held-out set of questions never trained
    on); returns the path and the rows written."""
    made = entries(name, seed=seed, size=size, config=config)
    lines = [json.dumps(row(name, e), ensure_ascii=False) for e in made if e["question"] not in exclude]
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced(path) as f:
        f.write("".join(line + "\n" for line in lines))
    return path, len(lines)


def prompts_of(path: str | Path) -> frozenset[str]:
    """The ``prompt`` of every row of a JSON-lines file (an export's questions); GlassrlError for a bad file."""
    try:
        return frozenset(json.loads(line)["prompt"] for line in Path(path).read_text(encoding="utf-8").splitlines())
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise GlassrlError(f"--exclude {path}: not a JSON-lines file of rows with a prompt ({err})") from None


def extracted(response: str) -> str:
    """The answer reasoning-gym's scorers expect: the last ``<answer>`` tag's text, else the response stripped."""
    tagged = require("reasoning_gym.utils", "reasoning-gym", "reasoning-gym").extract_answer(response)
    return response.strip() if tagged is None else tagged


def score(prompt: str, response: str, answer: str | None, metadata: Mapping[str, Any]) -> float:
    """glassrl-style reward function (rewards/styles.py): the dataset's ``score_answer`` of the extracted answer.
    Raises (an ``error`` result, never a silent 0) for a record that was not exported by this module."""
    if FIELD not in metadata:
        raise ValueError(f"the record has no {FIELD!r} field: export it with glassrl.agents.hubs.reasoning_gym")
    kept = json.loads(metadata[FIELD])
    scorer = _rg().get_score_answer_fn(kept["dataset"])  # reasoning_gym/factory.py:101
    return float(scorer(extracted(response), kept["entry"]))


class ReasoningGymEnvironment:
    """One turn, no tools: the turn is the answer, scored by :func:`score` (module docstring)."""

    tools: Sequence[Tool] = ()

    def __init__(self) -> None:
        _rg()
        self.record: PromptRecord | None = None

    def reset(self, record: PromptRecord) -> None:
        self.record = record

    def step(self, text: str, calls: Sequence[ToolCall]) -> StepResult:
        assert self.record is not None, "step before reset"
        value = score("", text, self.record.answer, self.record.metadata)
        return StepResult(done=True, reward_parts={REWARD_PART: value})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glassrl.agents.hubs.reasoning_gym", description="write a reasoning-gym dataset as JSON lines"
    )
    parser.add_argument("dataset", help="reasoning-gym dataset name, e.g. chain_sum, basic_arithmetic")
    parser.add_argument("--seed", type=int, required=True, help="the dataset's seed (train and eval: different seeds)")
    parser.add_argument("--size", type=int, required=True, help="entries to write")
    parser.add_argument("--out", required=True, help="the JSON-lines file to write")
    example = '{"max_terms": 2}'
    parser.add_argument("--config", default="{}", help=f"the dataset's config fields as JSON, e.g. '{example}'")
    parser.add_argument(
        "--exclude", metavar="FILE", help="leave out the questions of this JSON-lines file (the train set)"
    )
    args = parser.parse_args(argv)
    try:
        config = json.loads(args.config)
        if not isinstance(config, dict):
            raise GlassrlError(f"--config {args.config!r}: expected a JSON object")
        exclude = prompts_of(args.exclude) if args.exclude else frozenset()
        path, written = export(args.dataset, args.out, seed=args.seed, size=args.size, config=config, exclude=exclude)
    except json.JSONDecodeError as err:
        print(f"error: --config {args.config!r}: not JSON: {err.msg}", file=sys.stderr)
        return 2
    except GlassrlError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    left_out = f", {args.size - written} left out (in {args.exclude})" if args.exclude else ""
    print(f"wrote {written} {args.dataset} entries (seed {args.seed}{left_out}) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
