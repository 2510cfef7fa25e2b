"""The token ledger: every quantity of the token convention for each token of a batch's responses.

A :class:`Ledger` is the record of what the trainer (or ``glassrl explain``)
computed for a batch of responses: for each response a :class:`ResponseLedger`
(prompt, response text, score, group, length, finish reason; a multi-turn response's
:class:`LedgerTurn` list) holding one :class:`TokenRow` per response token, observation tokens
included (``role`` "observation", ``response_mask`` False). Token fields are named after the tensors
of docs/token-convention.md (DESIGN §1); renderers show the symbols
(:data:`SYMBOLS`). A quantity that was not computed (no critic under GRPO, no
log-probs when KL was given directly) is ``None``, never 0 or NaN.

Shapes: ``B`` responses, ``T`` padded response length.

The ledger file (:meth:`Ledger.to_jsonl`, JSON lines, read back exactly by :func:`read_jsonl`)
holds each response once: a ``"kind": "response"`` row (the run's fields and the response's:
prompt, response text, score, turns, ...), then its ``"kind": "token"`` rows (the step, the
response's index and the token's own fields). A file therefore grows linearly with the
response length, and rows are written one at a time (:meth:`Ledger.write_jsonl`). Files of the
first layout, every field on every token row (:meth:`Ledger.rows`), still read. docs/metrics.md,
"Reading a ledger file", reads both with pandas or duckdb. :meth:`Ledger.to_csv` writes the flat
rows; the Markdown and rich views are glassrl.ledger.render's. Torch is imported only by
:meth:`Ledger.from_tensors`, so a ledger file can be read without it; glassrl.ledger.compute
builds ledgers from a step's Experience or from given numbers.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from glassrl.errors import GlassrlError
from glassrl.jsonl import jsonl_objects
from glassrl.ledger.schema import checked

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TokenRow:
    """One response token y_i; float fields are None where the quantity was not computed."""

    index: int  # i, 0-based position in the response
    token_id: int | None
    token: str  # text of a_i = y_i
    logprobs: float | None  # log π(a_i | s_i)
    ref_logprobs: float | None  # log π_ref(a_i | s_i)
    kl: float | None  # kl_i
    token_scores: float | None  # score placed on token i
    token_rewards: float | None  # r_i = token_scores_i − β·kl_i
    values: float | None  # V(s_i), read before a_i
    deltas: float | None  # δ_i = r_i + γ·V(s_{i+1}) − V(s_i)
    advantages: float | None  # raw A_i
    returns: float | None  # R_i = A_i + V(s_i), raw A
    whitened_advantages: float | None  # what the policy loss sees
    response_mask: bool  # True: a generated token that trains; False: observation (or a row that does not train)
    step_end: bool | None  # process supervision: a step reward sits here; None without steps
    role: str | None = None  # "generated" (the policy wrote it) or "observation" (a tool's result); None: not recorded
    turn: int | None = (
        None  # index of the turn the token belongs to (observation: the turn it answers); None: single-turn
    )
    # Off-policy (a token that another policy μ sampled: asynchronous training, another engine); None: not recorded.
    policy_version: int | None = None  # the version (actor updates) of the weights that sampled a_i
    staleness: int | None = None  # actor updates between that version and the update that trains on a_i
    rollout_logprobs: float | None = None  # log μ(a_i | s_i), as the rollout engine computed it while sampling
    is_weights: float | None = None  # w_i, algo.off_policy's weight on the token's policy-loss term
    is_keep: bool | None = None  # algo.off_policy kept the token in the policy loss (False: dropped)


@dataclass(frozen=True)
class LedgerTurn:
    """One turn of a multi-turn response, in the response's token indices (glassrl.rollout.base.Turn):
    generated tokens [start, end), then the observation that answered it [end, observation_end)."""

    start: int
    end: int
    observation_end: int
    finish_reason: str  # tool_call, continue, stop, length, turn_limit, env_error
    tool_calls: tuple[dict[str, Any], ...] = ()  # {"name", "arguments", "status", "seconds"} per call
    reward_parts: dict[str, float] = field(default_factory=dict)  # the environment's rewards for the turn
    error: str = ""  # finish reason env_error: what became of the environment (it raised, exited, crashed, hung)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LedgerTurn:
        return cls(**{**data, "tool_calls": tuple(data.get("tool_calls", ()))})


@dataclass(frozen=True)
class ResponseLedger:
    """One response: per-response fields and its token rows (``length`` of them)."""

    prompt: str
    response: str
    score: float | None  # task score of the whole response (outcome reward)
    group_id: int | None  # responses to the same prompt share it (group estimators)
    length: int  # number of response tokens, observation tokens included
    finish_reason: str | None  # "stop" or "length" from generation; None when not generated
    baseline_reward: float | None  # ReMax: reward of the greedy response
    tokens: tuple[TokenRow, ...]
    turns: tuple[LedgerTurn, ...] | None = None  # multi-turn responses: every turn, in order; None: single-turn
    # s_0 exactly as the policy saw it, its token ids decoded (special tokens, an agentic run's tools
    # described by its call format); ``prompt`` is the text the rewards read. None: a ledger from before it
    prompt_as_seen: str | None = None


@dataclass(frozen=True)
class Ledger:
    """Responses of one batch (or one explain call) and the parameters they were computed with."""

    estimator: str
    gamma: float
    lam: float | None  # None for estimators without λ
    beta: float  # KL coefficient in the reward (0 when KL is not in the reward)
    kl_kind: str | None  # None when KL was given directly rather than estimated from log-probs
    responses: tuple[ResponseLedger, ...] = field(default_factory=tuple)
    step: int | None = None  # trainer step the sample was taken at; None outside training

    @classmethod
    def from_tensors(
        cls,
        *,
        prompts: list[str],
        token_texts: list[list[str]],
        response_mask: torch.Tensor,
        estimator: str,
        gamma: float,
        lam: float | None,
        beta: float,
        kl_kind: str | None,
        token_ids: torch.Tensor | None = None,
        logprobs: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
        kl: torch.Tensor | None = None,
        token_scores: torch.Tensor | None = None,
        token_rewards: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
        deltas: torch.Tensor | None = None,
        advantages: torch.Tensor | None = None,
        returns: torch.Tensor | None = None,
        whitened_advantages: torch.Tensor | None = None,
        step_end_mask: torch.Tensor | None = None,
        scores: torch.Tensor | None = None,
        group_ids: torch.Tensor | None = None,
        baseline_rewards: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        finish_reasons: list[str | None] | None = None,
        responses: list[str] | None = None,
        step: int | None = None,
        token_roles: torch.Tensor | None = None,
        turns: Sequence[Sequence[Any] | None] | None = None,
        prompts_as_seen: list[str] | None = None,
        policy_versions: torch.Tensor | None = None,
        staleness: torch.Tensor | None = None,
        rollout_logprobs: torch.Tensor | None = None,
        is_weights: torch.Tensor | None = None,
        is_keep: torch.Tensor | None = None,
    ) -> Ledger:
        """Build a ledger from the (B, T) tensors of one batch (DESIGN §1).

        Per-token tensors are (B, T) and None where the estimator does not have the
        quantity. ``response_mask`` and ``step_end_mask`` (B, T) bool; ``scores``, ``group_ids``,
        ``baseline_rewards``, ``lengths`` are (B,). ``token_texts[b]`` holds at least
        ``lengths[b]`` strings. On observation tokens (mask False) the quantities of
        :data:`ACTION_ONLY` are None whatever the tensors hold. ``lengths`` defaults to one past the last True of
        ``response_mask`` (padding after it is dropped; observation tokens before it
        are kept with mask False); a multi-turn batch passes its context lengths, so that the
        observation after the last generated token and every turn are kept. ``responses``
        defaults to the joined token texts.

        ``token_roles`` (B, T) int8 (glassrl.rollout.base: 1 generated, 2 observation) gives each
        row's ``role``; without it a token is "generated" where ``response_mask`` is True and
        "observation" elsewhere. ``turns[b]``: response b's turns (objects with start, end,
        observation_end, finish_reason, tool_calls, reward_parts: glassrl.rollout.base.Turn), or
        None for a single-turn response; they give each token its ``turn``. ``prompts_as_seen[b]``:
        s_0 as the policy saw it (its ids decoded), beside ``prompts[b]``, the text the rewards read.

        Off-policy tokens (:data:`OFF_POLICY_FIELDS`, (B, T), None on observation tokens as the
        quantities of :data:`ACTION_ONLY`): ``policy_versions`` and ``staleness`` long,
        ``rollout_logprobs`` (log μ) and ``is_weights`` float, ``is_keep`` bool
        (glassrl.rl.phases.off_policy).
        """
        import torch

        mask = response_mask.detach().to("cpu", torch.bool)  # (B, T)
        B, T = mask.shape
        if lengths is None:
            positions = torch.arange(1, T + 1).expand(B, T)  # (B, T)
            lengths = torch.where(mask, positions, 0).amax(dim=-1)  # (B,)
        per_token = {
            "token_ids": token_ids,
            "logprobs": logprobs,
            "ref_logprobs": ref_logprobs,
            "kl": kl,
            "token_scores": token_scores,
            "token_rewards": token_rewards,
            "values": values,
            "deltas": deltas,
            "advantages": advantages,
            "returns": returns,
            "whitened_advantages": whitened_advantages,
            "step_end_mask": step_end_mask,
            "policy_version": policy_versions,
            "staleness": staleness,
            "rollout_logprobs": rollout_logprobs,
            "is_weights": is_weights,
            "is_keep": is_keep,
        }
        for name, tensor in per_token.items():
            if tensor is not None and tuple(tensor.shape) != (B, T):
                raise ValueError(f"{name}: expected shape {(B, T)} like response_mask, got {tuple(tensor.shape)}")
        cols = {name: _lists(t) for name, t in per_token.items()}
        # On observation tokens these are not quantities (no action was taken), only the
        # 0 the tensors hold there; None says so (DESIGN §1: GAE carries V and A across).
        for name in (*ACTION_ONLY, *OFF_POLICY_FIELDS):
            if cols[name] is not None:
                cols[name] = [
                    [x if m else None for x, m in zip(row, mrow)] for row, mrow in zip(cols[name], mask.tolist())
                ]
        mask_rows, length_list = mask.tolist(), _lists(lengths)
        role_rows = _lists(token_roles)
        score_list, group_list, base_list = _lists(scores), _lists(group_ids), _lists(baseline_rewards)
        built = []
        for b in range(B):
            n = int(length_list[b])
            texts = list(token_texts[b][:n])
            if len(texts) != n:
                raise ValueError(f"token_texts[{b}]: expected {n} strings, got {len(texts)}")
            spans = None if turns is None or turns[b] is None else tuple(_turn(t) for t in turns[b])
            turn_of = _turn_index(spans, n)
            roles = [
                ROLES.get(role_rows[b][i], None) if role_rows is not None else ROLES[1 if mask_rows[b][i] else 2]
                for i in range(n)
            ]
            rows = tuple(
                TokenRow(
                    index=i,
                    token_id=_at(cols["token_ids"], b, i, int),
                    token=texts[i],
                    logprobs=_at(cols["logprobs"], b, i),
                    ref_logprobs=_at(cols["ref_logprobs"], b, i),
                    kl=_at(cols["kl"], b, i),
                    token_scores=_at(cols["token_scores"], b, i),
                    token_rewards=_at(cols["token_rewards"], b, i),
                    values=_at(cols["values"], b, i),
                    deltas=_at(cols["deltas"], b, i),
                    advantages=_at(cols["advantages"], b, i),
                    returns=_at(cols["returns"], b, i),
                    whitened_advantages=_at(cols["whitened_advantages"], b, i),
                    response_mask=bool(mask_rows[b][i]),
                    step_end=_at(cols["step_end_mask"], b, i, bool),
                    role=roles[i],
                    turn=turn_of[i],
                    policy_version=_at(cols["policy_version"], b, i, int),
                    staleness=_at(cols["staleness"], b, i, int),
                    rollout_logprobs=_at(cols["rollout_logprobs"], b, i),
                    is_weights=_at(cols["is_weights"], b, i),
                    is_keep=_at(cols["is_keep"], b, i, bool),
                )
                for i in range(n)
            )
            built.append(
                ResponseLedger(
                    prompt=prompts[b],
                    response=responses[b] if responses is not None else "".join(texts),
                    score=None if score_list is None else float(score_list[b]),
                    group_id=None if group_list is None else int(group_list[b]),
                    length=n,
                    finish_reason=None if finish_reasons is None else finish_reasons[b],
                    baseline_reward=None if base_list is None else float(base_list[b]),
                    tokens=rows,
                    turns=spans,
                    prompt_as_seen=None if prompts_as_seen is None else prompts_as_seen[b],
                )
            )
        return cls(
            estimator=estimator,
            gamma=float(gamma),
            lam=None if lam is None else float(lam),
            beta=float(beta),
            kl_kind=kl_kind,
            responses=tuple(built),
            step=step,
        )

    def rows(self) -> list[dict[str, Any]]:
        """Flat rows, every field on every token row: the CSV's rows (and the first ledger files' layout)."""
        run = {name: getattr(self, name) for name in RUN_FIELDS}
        out = []
        for b, resp in enumerate(self.responses):
            head = _response_fields(b, resp)
            for row in resp.tokens:
                out.append({**run, **head, **_token_fields(row)})
        return out

    def records(self) -> Iterator[dict[str, Any]]:
        """The rows of the ledger file, in order: each response's row (:data:`RESPONSE_ROW`), then
        its token rows (:data:`TOKEN_ROW`)."""
        run = {name: getattr(self, name) for name in RUN_FIELDS}
        for b, resp in enumerate(self.responses):
            yield {"kind": "response", **run, **_response_fields(b, resp)}
            for row in resp.tokens:
                yield {"kind": "token", "step": self.step, "response_index": b} | _token_fields(row)

    def jsonl_lines(self) -> Iterator[str]:
        """The lines of the ledger file, one row each, made as they are asked for."""
        for record in self.records():
            yield json.dumps(record, ensure_ascii=False) + "\n"

    def write_jsonl(self, file: TextIO) -> None:
        """Write the ledger file's lines to an open text file, one at a time."""
        for line in self.jsonl_lines():
            file.write(line)

    def to_jsonl(self, path: str | Path) -> None:
        """Write the ledger file (module docstring); read it back with :func:`read_jsonl`."""
        with Path(path).open("w", encoding="utf-8") as f:
            self.write_jsonl(f)

    def jsonl(self) -> str:
        """The text that :meth:`to_jsonl` writes."""
        return "".join(self.jsonl_lines())

    def to_csv(self, path: str | Path) -> None:
        """The rows of :meth:`rows` as CSV; a missing quantity is an empty cell."""
        Path(path).write_text(self.csv(), encoding="utf-8")

    def csv(self) -> str:
        """The CSV text that :meth:`to_csv` writes."""
        import io

        buf = io.StringIO()
        recorded = [
            f for f in OFF_POLICY_FIELDS if any(getattr(t, f) is not None for r in self.responses for t in r.tokens)
        ]
        writer = csv.DictWriter(buf, fieldnames=ALL_FIELDS + tuple(recorded), lineterminator="\n")
        writer.writeheader()
        for row in self.rows():  # turns: one JSON cell
            writer.writerow({**row, "turns": None if row["turns"] is None else json.dumps(row["turns"])})
        return buf.getvalue()


# Defined only where a generated token was an action (response_mask True).
ACTION_ONLY = ("token_rewards", "deltas", "advantages", "returns", "whitened_advantages")
# A token's off-policy numbers: on its row (file, CSV) only where recorded, so that a synchronous run's
# ledger is as before; absent: None.
OFF_POLICY_FIELDS = ("policy_version", "staleness", "rollout_logprobs", "is_weights", "is_keep")
RUN_FIELDS = ("step", "estimator", "gamma", "lam", "beta", "kl_kind")
RESPONSE_FIELDS = (
    "response_index",
    "prompt",
    "response",
    "score",
    "group_id",
    "length",
    "finish_reason",
    "baseline_reward",
    "turns",
    "prompt_as_seen",
)
TOKEN_FIELDS = tuple(f.name for f in dataclasses.fields(TokenRow) if f.name not in OFF_POLICY_FIELDS)  # every row's
ALL_FIELDS = RUN_FIELDS + RESPONSE_FIELDS + TOKEN_FIELDS  # a flat row (CSV; the first ledger files)
# The ledger file's two kinds of row: a response's fields once, then one row per token.
RESPONSE_ROW = ("kind", *RUN_FIELDS, *RESPONSE_FIELDS)
TOKEN_ROW = ("kind", "step", "response_index", *TOKEN_FIELDS)

# DESIGN §1 symbols, shown as column headers by the renderers.
SYMBOLS = {
    "index": "i",
    "token_id": "id",
    "token": "a_i",
    "logprobs": "log π(a_i|s_i)",
    "ref_logprobs": "log π_ref(a_i|s_i)",
    "kl": "kl_i",
    "token_scores": "score_i",
    "token_rewards": "r_i",
    "values": "V(s_i)",
    "deltas": "δ_i",
    "advantages": "A_i",
    "returns": "R_i",
    "whitened_advantages": "Â_i",
    "response_mask": "mask",
    "step_end": "step end",
    "role": "role",
    "turn": "turn",
    "policy_version": "v",
    "staleness": "lag",
    "rollout_logprobs": "log μ(a_i|s_i)",
    "is_weights": "w_i",
    "is_keep": "keep",
}
# token_roles values (glassrl.rollout.base: ROLE_GENERATED, ROLE_OBSERVATION) -> TokenRow.role
ROLES = {1: "generated", 2: "observation"}
# Fields added after the first ledger files were written: absent from such a file, read as None.
OPTIONAL_FIELDS = ("role", "turn", "turns", "prompt_as_seen")


def read_jsonl(path: str | Path) -> Ledger:
    """Load a ledger written by :meth:`Ledger.to_jsonl` (exactly: ``read_jsonl(p) == ledger``), or a
    file of the first layout (flat rows); every field is checked for its type (glassrl.ledger.schema).
    Errors name the file, the line and the field."""
    path = Path(path)
    if not path.is_file():
        raise GlassrlError(f"ledger file not found: {path}")
    objects = jsonl_objects(path)
    first = next(objects, None)
    if first is None:
        raise GlassrlError(f"{path}: no ledger rows")
    if "kind" not in first[0] and {"chosen", "rejected"} <= first[0].keys():
        raise GlassrlError(
            f"{first[1]}: a preference ledger (glassrl dpo's held-out pairs), not a token ledger of RL "
            "training: `glassrl report RUN_DIR` shows it; `glassrl explain --model RUN_DIR --prompt … "
            "--chosen … --rejected …` explains a pair"
        )
    read = _read_records if "kind" in first[0] else _read_flat_rows
    return read(itertools.chain([first], objects))


_TOKEN_ROW_FIELDS = ("step", "response_index", *TOKEN_FIELDS, *OFF_POLICY_FIELDS)


def _read_records(objects: Iterable[tuple[dict[str, Any], str]]) -> Ledger:
    """A ledger from the rows of :meth:`Ledger.records`."""
    run: dict[str, Any] | None = None
    responses: list[ResponseLedger] = []
    head: dict[str, Any] | None = None
    rows: list[TokenRow] = []
    where = ""
    for obj, where in objects:
        kind = obj.get("kind")
        if kind == "response":
            _require(obj, tuple(f for f in RESPONSE_ROW if f not in OPTIONAL_FIELDS), where)
            fields = checked(obj, RUN_FIELDS + RESPONSE_FIELDS, where)
            this_run = {name: fields[name] for name in RUN_FIELDS}
            if run is None:
                run = this_run
            elif not _same(this_run, run):
                raise GlassrlError(f"{where}: run fields differ from the first response (one ledger per file)")
            if head is not None:
                responses.append(_response(head, rows, where))
            if fields["response_index"] != len(responses):
                raise GlassrlError(f"{where}: field 'response_index': expected {len(responses)} (responses in order)")
            head, rows = fields, []
        elif kind == "token":
            if head is None or run is None:
                raise GlassrlError(f"{where}: a token row before any response row")
            _require(obj, TOKEN_ROW, where)
            fields = checked(obj, _TOKEN_ROW_FIELDS, where)
            if fields["response_index"] != head["response_index"]:
                raise GlassrlError(
                    f"{where}: a token row of response {fields['response_index']} "
                    f"under response {head['response_index']}"
                )
            if fields["step"] != run["step"]:
                raise GlassrlError(f"{where}: field 'step': {fields['step']}, its response row says {run['step']}")
            if fields["index"] != len(rows):
                raise GlassrlError(f"{where}: field 'index': expected {len(rows)} (tokens in order)")
            del fields["step"], fields["response_index"]
            rows.append(TokenRow(**fields))
        else:
            raise GlassrlError(f"{where}: kind {kind!r}: expected 'response' or 'token'")
    assert run is not None and head is not None  # the first row is a response row
    responses.append(_response(head, rows, where))
    return Ledger(**run, responses=tuple(responses))


def _read_flat_rows(objects: Iterable[tuple[dict[str, Any], str]]) -> Ledger:
    """A ledger from the flat rows of the first ledger files (:meth:`Ledger.rows`)."""
    run: dict[str, Any] | None = None
    groups: dict[int, tuple[dict[str, Any], list[TokenRow]]] = {}
    where = ""
    for obj, where in objects:
        missing = [name for name in ALL_FIELDS if name not in obj and name not in OPTIONAL_FIELDS]
        if missing:
            raise GlassrlError(f"{where}: missing field {missing[0]!r}")
        fields = checked(obj, ALL_FIELDS + OFF_POLICY_FIELDS, where)
        this_run = {name: fields[name] for name in RUN_FIELDS}
        if run is None:
            run = this_run
        elif not _same(this_run, run):
            raise GlassrlError(f"{where}: run fields differ from the first row (one ledger per file)")
        head, rows = groups.setdefault(fields["response_index"], (fields, []))
        if fields["index"] != len(rows):
            raise GlassrlError(f"{where}: field 'index': expected {len(rows)} (tokens of a response in order)")
        rows.append(TokenRow(**{name: fields[name] for name in (*TOKEN_FIELDS, *OFF_POLICY_FIELDS)}))
    assert run is not None
    responses = tuple(_response(head, rows, where, check_length=False) for _, (head, rows) in sorted(groups.items()))
    return Ledger(**run, responses=responses)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two rows' run fields agree (NaN equal to NaN: a β a run recorded as NaN is one value)."""
    return all(x == y or (x != x and y != y) for x, y in zip(a.values(), b.values()))


def _require(obj: dict[str, Any], fields: tuple[str, ...], where: str) -> None:
    missing = next((name for name in fields if name not in obj), None)
    if missing is not None:
        raise GlassrlError(f"{where}: missing field {missing!r}")


def _response(head: dict[str, Any], rows: list[TokenRow], where: str, check_length: bool = True) -> ResponseLedger:
    """The response of a response row and its token rows (as many as its length), its turns within them."""
    if check_length and len(rows) != head["length"]:
        raise GlassrlError(
            f"{where}: response {head['response_index']} has {len(rows)} token rows, its length is {head['length']}"
        )
    for k, turn in enumerate(head["turns"] or ()):
        if turn["observation_end"] > len(rows):
            raise GlassrlError(
                f"{where}: response {head['response_index']}: turn {k} ends at {turn['observation_end']}, "
                f"past its {len(rows)} tokens"
            )
    fields = {name: head.get(name) for name in RESPONSE_FIELDS[1:]}
    return ResponseLedger(**{**fields, "turns": _read_turns(fields["turns"])}, tokens=tuple(rows))


def _response_fields(b: int, resp: ResponseLedger) -> dict[str, Any]:
    """The response's own fields as a file row holds them (turns as plain dicts)."""
    head = {"response_index": b, **{name: getattr(resp, name) for name in RESPONSE_FIELDS[1:]}}
    head["turns"] = None if resp.turns is None else [_turn_fields(t) for t in resp.turns]
    return head


def _turn_fields(turn: LedgerTurn) -> dict[str, Any]:
    """A turn as a file holds it: ``error`` only when the environment failed."""
    return {k: v for k, v in dataclasses.asdict(turn).items() if k != "error" or v}


def _token_fields(row: TokenRow) -> dict[str, Any]:
    """A token's fields as its row holds them: every field of TOKEN_FIELDS, the off-policy ones recorded."""
    fields = {name: getattr(row, name) for name in TOKEN_FIELDS}
    return fields | {name: value for name in OFF_POLICY_FIELDS if (value := getattr(row, name)) is not None}


def _lists(tensor: torch.Tensor | None) -> list[Any] | None:
    return None if tensor is None else tensor.detach().cpu().tolist()


def _at(col: list[list[Any]] | None, b: int, i: int, kind: type = float) -> Any:
    return None if col is None or col[b][i] is None else kind(col[b][i])


def _read_turns(turns: list[dict[str, Any]] | None) -> tuple[LedgerTurn, ...] | None:
    return None if turns is None else tuple(LedgerTurn.from_dict(t) for t in turns)


def _turn(turn: Any) -> LedgerTurn:
    """A LedgerTurn of a rollout's Turn (or of anything with its fields)."""
    return LedgerTurn(
        start=int(turn.start),
        end=int(turn.end),
        observation_end=int(turn.observation_end),
        finish_reason=str(turn.finish_reason),
        tool_calls=tuple(dict(c) for c in turn.tool_calls),
        reward_parts={k: float(v) for k, v in turn.reward_parts.items()},
        error=str(getattr(turn, "error", "")),
    )


def _turn_index(spans: tuple[LedgerTurn, ...] | None, n: int) -> list[int | None]:
    """Per token of a response of ``n`` tokens: the turn holding it (its generated part or its observation)."""
    out: list[int | None] = [None] * n
    for k, span in enumerate(spans or ()):
        for i in range(span.start, min(span.observation_end, n)):
            out[i] = k
    return out
