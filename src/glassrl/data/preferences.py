"""Preference data for reward-model, DPO and KTO training: the bundled set and JSONL files.

The bundled set, ``task:arith-verify-preferences``, is generated from the
arith-verify task ("Is 3+4=8?"), so it needs no download and its train and
test splits are exactly the task's (disjoint) splits. For each prompt:

- ``chosen``   = the task's reference answer (right verdict, right sum);
- ``rejected`` = a wrong response of one of three kinds, drawn per prompt from
  a generator seeded by ``(seed, split, index)``:

  ============== ================ ========== =======
  kind           verdict          sum        margin
  ============== ================ ========== =======
  wrong-verdict  flipped          right      1.0
  wrong-sum      right            wrong      1.0
  both-wrong     flipped          wrong      2.0
  ============== ================ ========== =======

  The margin counts the mistakes in the rejected response: with the margin
  loss (Touvron et al. 2023, Llama 2, §3.2.2, eq. 2) a response with two
  mistakes must score further below the reference than one with one mistake.
  A wrong sum is the true sum shifted by one of the task's own slips
  (``glassrl.data.tasks.arith_verify.DELTAS``: ±1, ±2, ±10), never negative.

A ``data`` config string is ``task:arith-verify-preferences`` (train split),
``task:arith-verify-preferences/test``, or the path of a JSONL file: one
object per line with ``"prompt"``, ``"chosen"``, ``"rejected"`` and an optional
``"margin"`` (number). The prompt is a string or chat messages
(``[{"role", "content"}, ...]``, as in a prompt dataset: glassrl.data.datasets);
a response is a string or, in TRL's conversational form, a list holding one
assistant message (``[{"role": "assistant", "content": ...}]``). TRL's implicit prompt
(no ``"prompt"``; ``chosen`` and ``rejected`` whole conversations) is read too: the prompt
is the messages both open with.

Unpaired data (KTO, :func:`load_labelled`): the same sources, each pair giving
its chosen response as desirable and its rejected one as undesirable (TRL's
``unpair_preference_dataset``), and JSONL rows in TRL's unpaired form,
``"prompt"``, ``"completion"``, ``"label"`` (true = desirable); a file may mix
the two kinds of row.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

from glassrl.data.datasets import parse_prompt
from glassrl.data.records import LabelledResponse, PreferencePair, PromptRecord
from glassrl.data.tasks import PREFIX, load_task, parse_task
from glassrl.data.tasks.arith_verify import DELTAS, VERDICTS
from glassrl.errors import GlassrlError
from glassrl.jsonl import jsonl_objects

NAME = "arith-verify-preferences"
BUNDLED = PREFIX + NAME

# kind -> (verdict flipped, sum wrong, margin = number of mistakes)
REJECTION_KINDS: dict[str, tuple[bool, bool, float]] = {
    "wrong-verdict": (True, False, 1.0),
    "wrong-sum": (False, True, 1.0),
    "both-wrong": (True, True, 2.0),
}


def preference_pairs(split: str, *, seed: int = 0, size: int | None = None) -> list[PreferencePair]:
    """The bundled arith-verify preference set: one pair per arith-verify prompt of ``split``.

    Deterministic in ``(split, seed, size)``; see the module docstring for how the
    rejected response and its margin are chosen.
    """
    records = load_task("arith-verify", split, seed=seed, size=size)
    pairs = []
    for index, record in enumerate(records):
        rng = random.Random(f"arith-verify-preferences/{seed}/{split}/{index}")
        kind = rng.choice(sorted(REJECTION_KINDS))
        flip, wrong_sum, margin = REJECTION_KINDS[kind]
        pairs.append(
            PreferencePair(
                prompt=_text(record),
                chosen=record.answer,
                rejected=_wrong_answer(record, flip=flip, wrong_sum=wrong_sum, rng=rng),
                margin=margin,
                source=f"{BUNDLED}/{split}#{index} ({kind})",
            )
        )
    return pairs


def _text(record: PromptRecord) -> str:
    if not isinstance(record.prompt, str):
        raise GlassrlError(f"{record.source}: preference pairs need a plain-text prompt")
    return record.prompt


def _wrong_answer(record: PromptRecord, *, flip: bool, wrong_sum: bool, rng: random.Random) -> str:
    """Edit the reference answer: swap its verdict word and/or replace its sum (its only number)."""
    meta = record.metadata
    answer, total = str(record.answer), meta["sum"]
    if flip:
        right, wrong = VERDICTS[meta["lang"], meta["is_true"]], VERDICTS[meta["lang"], not meta["is_true"]]
        answer = wrong + answer.removeprefix(right)
    if wrong_sum:
        slipped = rng.choice([total + d for d in DELTAS if total + d >= 0])
        answer = answer.replace(str(total), str(slipped))
    return answer


def load_preference_file(path: str | Path) -> list[PreferencePair]:
    """Read preference pairs from a JSONL file; errors name ``file:line`` and the field."""
    pairs = [_pair(row, where) for row, where in _rows(path)]
    if not pairs:
        raise GlassrlError(f"{path}: no preference pairs in the file")
    return pairs


def _finite(number: float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an integer beyond any float
        return False


def _rows(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise GlassrlError(f"preference file not found: {path}")
    return jsonl_objects(path)


def _pair(row: dict[str, Any], where: str) -> PreferencePair:
    if "prompt" not in row:
        row = _explicit_prompt(row)
    for field in ("prompt", "chosen", "rejected"):
        if field not in row:
            raise GlassrlError(f'{where}: missing field "{field}"')
    margin = row.get("margin")
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))):
        raise GlassrlError(f'{where}: field "margin" must be a number, got {margin!r}')
    if margin is not None and not _finite(margin):  # 1e400 reads as inf, 10**400 is beyond any float
        raise GlassrlError(f'{where}: field "margin" must be a finite number, got {margin!r:.40}')
    return PreferencePair(
        prompt=_prompt(row["prompt"], where),
        chosen=_response(row, "chosen", where),
        rejected=_response(row, "rejected", where),
        margin=None if margin is None else float(margin),
        source=where,
    )


def _explicit_prompt(row: dict[str, Any]) -> dict[str, Any]:
    """TRL's implicit prompt: ``chosen`` and ``rejected`` as whole conversations, the prompt
    their shared opening messages (TRL's ``extract_prompt``); a row of another form is left
    as it is (the missing field is then named)."""
    chosen, rejected = row.get("chosen"), row.get("rejected")
    if not (isinstance(chosen, list) and isinstance(rejected, list) and chosen and rejected):
        return row
    shared = 0
    while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
        shared += 1
    if shared == 0:
        return row
    return row | {"prompt": chosen[:shared], "chosen": chosen[shared:], "rejected": rejected[shared:]}


def _prompt(value: Any, where: str) -> str | tuple[dict[str, str], ...]:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return parse_prompt(value, f'{where}: field "prompt"')
    raise GlassrlError(f'{where}: field "prompt" must be a string or a list of messages, got {type(value).__name__}')


def _response(row: dict[str, Any], field: str, where: str) -> str:
    """A response's text: a string, or the content of a list holding one assistant message."""
    value = row[field]
    if isinstance(value, str):
        return value
    if (
        isinstance(value, list)
        and len(value) == 1
        and isinstance(value[0], dict)
        and value[0].get("role") == "assistant"
        and isinstance(value[0].get("content"), str)
    ):
        return value[0]["content"]
    raise GlassrlError(
        f'{where}: field "{field}" must be a string or one assistant message '
        f'[{{"role": "assistant", "content": ...}}], got {type(value).__name__}'
    )


def load_preferences(spec: str) -> list[PreferencePair]:
    """Resolve a ``data`` config string: ``task:arith-verify-preferences[/SPLIT]`` (SPLIT
    defaults to train) or a JSONL path."""
    ref = parse_task(spec)
    if ref is not None:
        if ref.name != NAME:
            raise GlassrlError(f"data: unknown preference task {PREFIX + ref.name!r} in {spec!r}; valid: {BUNDLED}")
        return preference_pairs(ref.split)
    return load_preference_file(spec)


def degenerate_pairs(pairs: list[PreferencePair], key: str) -> str | None:
    """A warning line naming the pairs that teach nothing, or None: chosen == rejected (the two
    log-probabilities cancel, so the pair adds no gradient to DPO's or the reward model's loss) and
    empty responses (a row cut short upstream, most likely). GlassrlError when every pair is one
    with chosen == rejected: such data trains nothing."""
    same = [p.source for p in pairs if p.chosen == p.rejected]
    if pairs and len(same) == len(pairs):
        raise GlassrlError(
            f"{key}: every pair's chosen and rejected responses are the same (first: {same[0]}); "
            "a pair teaches only by their difference"
        )
    empty = [p.source for p in pairs if not p.chosen.strip() or not p.rejected.strip()]
    return _warning(
        key, len(pairs), "pairs", [(same, "chosen == rejected (no gradient)"), (empty, "an empty response")]
    )


def degenerate_labelled(examples: list[LabelledResponse], key: str) -> str | None:
    """:func:`degenerate_pairs` for labelled responses: an empty response, and one response labelled
    both desirable and undesirable for one prompt (the two cancel)."""
    labels: dict[tuple[str, str], set[bool]] = {}
    for e in examples:
        labels.setdefault((repr(e.prompt), e.response), set()).add(e.desirable)
    both = [e.source for e in examples if e.desirable and len(labels[repr(e.prompt), e.response]) == 2]
    empty = [e.source for e in examples if not e.response.strip()]
    parts = [(both, "a response labelled both desirable and undesirable"), (empty, "an empty response")]
    return _warning(key, len(examples), "examples", parts)


def _warning(key: str, total: int, unit: str, parts: list[tuple[list[str], str]]) -> str | None:
    said = [f"{len(rows)} of {total} {unit} have {what} (first: {rows[0]})" for rows, what in parts if rows]
    return f"glassrl: warning: {key}: " + "; ".join(said) if said else None


def unpair(pairs: list[PreferencePair]) -> list[LabelledResponse]:
    """Each pair as two labelled responses: its chosen one desirable, its rejected one not."""
    return [
        LabelledResponse(pair.prompt, response, desirable, f"{pair.source} {side}")
        for pair in pairs
        for response, desirable, side in ((pair.chosen, True, "chosen"), (pair.rejected, False, "rejected"))
    ]


def labelled_rows(spec: str) -> bool:
    """Whether the ``data`` config string names a file with rows in KTO's own form (a ``label``)."""
    return parse_task(spec) is None and any("label" in row for row, _ in _rows(spec))


def load_labelled(spec: str) -> list[LabelledResponse]:
    """Unpaired data (module docstring) from a ``data`` config string."""
    if parse_task(spec) is not None:
        return unpair(load_preferences(spec))
    examples: list[LabelledResponse] = []
    for row, where in _rows(spec):
        if "label" not in row:
            examples += unpair([_pair(row, where)])
            continue
        for field in ("prompt", "completion"):
            if field not in row:
                raise GlassrlError(f'{where}: missing field "{field}"')
        if not isinstance(row["label"], bool):
            raise GlassrlError(f'{where}: field "label" must be true or false, got {row["label"]!r}')
        completion = _response(row, "completion", where)
        examples.append(LabelledResponse(_prompt(row["prompt"], where), completion, row["label"], where))
    if not examples:
        raise GlassrlError(f"{spec}: no examples in the file")
    return examples
