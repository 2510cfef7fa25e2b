"""The mismatch microscope: why the sampler's log-probs differ from the trainer's.

Each generated token a_i has two log-probs: log μ(a_i|s_i), what the sampler computed while it
sampled (the ledger's ``rollout_logprobs``), and log π_old(a_i|s_i), what the trainer computed
again before the update (the ledger's ``logprobs``). Their gap Δ_i = log μ − log π_old should be
0 in an on-policy run and never is. This module recomputes the tokens' log-probs with each
*factor* set as the sampler had it or as the trainer has it, and splits the measured gap among
the factors:

    precision  the forward pass's arithmetic: the weights cast to float32 / bfloat16 / float16, or
               autocast-bfloat16 / autocast-float16 over float32 weights (``model.compute_dtype``,
               glassrl.models.precision: how a glassrl run computes in bfloat16)
    batch      how the sequence is laid out: the sampling batch decoded a token at a time with a
               KV cache ("decode"), or one forward pass over the trainer's micro-batches, padded,
               packed or with shared prompts, or each sequence alone
    staleness  the weights: the version each token was sampled with, or the trainer's current one
    rerender   the ids: as sampled, or the text re-rendered and re-tokenised (a trainer that
               rebuilds the conversation through the chat template scores other ids)
    engine     the sampler's engine (HF loop, vLLM): the ids scored by that engine's own scorer
               (``Recompute.engines``; vLLM's: glassrl.diagnose.mismatch_vllm), its own batching
               (the layout does not apply there); without one its part stays in "not reproduced"

The decomposition. With S the set of factors put on the sampler's side (the others stay on the
trainer's), ℓ_S the recomputed log-probs and D(S) = mean_i |ℓ_S,i − log μ_i| over the generated
tokens, the value of S is v(S) = D(∅) − D(S): how much of the distance to μ closes when those
factors take the sampler's setting. Each factor's part is its Shapley value (Shapley 1953):

    φ_f = Σ_{S ⊆ F∖{f}} |S|! (|F|−|S|−1)! / |F|! · (v(S ∪ {f}) − v(S))

exact over the 2^|F| subsets (|F| ≤ 5 here), so the parts do not depend on an order and sum to
v(F) = D(∅) − D(F) (efficiency). Two rows close the table so that it sums exactly to the
measured gap G = mean_i |log μ_i − log π_old,i| (the ledger's numbers): "not reproduced" = D(F),
what is left when every factor is on the sampler's side (the factors do not explain it), and
"trainer not reproduced" = G − D(∅), where recomputing with the trainer's settings does not give
the ledger's π_old. The factors explain the gap when these two rows are small: Σ φ_f within
5 % of G. A token's own parts are the same Shapley values of v_i(S) = |ℓ_∅,i − μ_i| − |ℓ_S,i − μ_i|;
their mean over tokens is φ_f (Shapley values are linear in v).

"Alone" beside each part is v({f}): that factor switched by itself, the others left to the
trainer. Torch and transformers are imported here: ``glassrl explain --mismatch`` pays for them,
``explain --ledger`` does not import this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations

import torch
from transformers import DynamicCache

from glassrl.models.logprobs import position_ids_from_mask, response_logprobs
from glassrl.rollout.decoding import cache_argument

FACTORS = ("precision", "batch", "staleness", "rerender", "engine")
LAYOUTS = ("decode", "padded", "packed", "shared_prefix", "alone")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PRECISIONS = (*DTYPES, "autocast-bfloat16", "autocast-float16")


@dataclass(frozen=True)
class Sample:
    """One response of a step: ids as sampled, and the two log-probs of each of its tokens.

    ``mask[i]``: token i was generated and counts (observation tokens and padding do not);
    ``sampler[i]`` log μ, ``trainer[i]`` log π_old (0.0 where ``mask`` is False); ``versions[i]``
    the policy version that sampled token i (None: the run did not record versions)."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    mask: tuple[bool, ...]
    sampler: tuple[float, ...]
    trainer: tuple[float, ...]
    versions: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Side:
    """One side's setting of every factor. ``version`` None: each token's own (``Sample.versions``)."""

    dtype: str = "float32"
    layout: str = "padded"
    version: int | None = None
    rerender: bool = False
    engine: str = "hf"


@dataclass
class Recompute:
    """What recomputing needs: ``weights(version)`` the policy of that version (float32, eval
    mode), ``render(sample)`` the (prompt ids, response ids) a re-rendering trainer scores,
    ``token_bytes(ids)`` the byte length of each token's text (to align re-tokenised ids),
    the sampling temperature and the trainer's micro-batch size (responses). ``engines``: engine
    name -> a scorer ``(seqs, side) -> rows``, each sequence's (prompt ids, response ids) scored in
    that engine with ``side``'s precision and version (a list of log-probs per response token);
    its ``note`` attribute, if any, is the engine row's note. ``load(version, dtype)``: the policy
    loaded in a 16-bit dtype, as a run with ``model.dtype`` bfloat16 holds it (a float32 model cast
    with ``.to`` casts its rotary buffers too, and computes otherwise); without it, the cast."""

    weights: Callable[[int], torch.nn.Module]
    temperature: float = 1.0
    micro_batch: int = 8
    render: Callable[[Sample], tuple[list[int], list[int]]] | None = None
    token_bytes: Callable[[list[int]], list[int]] | None = None
    pad_id: int = 0
    engines: dict[str, Callable[[list[tuple[list[int], list[int]]], Side], list[list[float]]]] = field(
        default_factory=dict
    )
    load: Callable[[int, str], torch.nn.Module] | None = None
    _models: dict = field(default_factory=dict)

    def model(self, version: int, dtype: str) -> torch.nn.Module:
        key = (version, dtype)
        if key not in self._models:
            if dtype in DTYPES and dtype != "float32":
                loaded = self.load(version, dtype) if self.load is not None else None
                self._models[key] = loaded if loaded is not None else _copy_as(self.weights(version), DTYPES[dtype])
            else:
                self._models[key] = self.weights(version)
        return self._models[key]


def _copy_as(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of ``model`` with its floating weights in ``dtype`` (the original is kept)."""
    import copy

    return copy.deepcopy(model).to(dtype)


@dataclass(frozen=True)
class Part:
    """One factor's row of the table: its part of the gap and the two sides' settings."""

    factor: str
    share: float | None  # φ_f, nats per token; None: the factor is not attributed (``note`` says why)
    alone: float | None  # v({f})
    sampler: str  # the sampler's setting, as text
    trainer: str  # the trainer's setting
    note: str = ""


@dataclass(frozen=True)
class TokenShare:
    """One token of the largest |Δ|: its two log-probs and each factor's part of its own gap."""

    response: int
    index: int
    sampler: float
    trainer: float
    leading: str  # the factor with the largest part of this token's gap
    parts: dict[str, float]

    @property
    def delta(self) -> float:
        return self.sampler - self.trainer


@dataclass(frozen=True)
class Attribution:
    """What :func:`attribute` found (module docstring: the parts sum to ``gap``)."""

    gap: float  # G = mean |log μ − log π_old| over the counted tokens (the ledger's numbers)
    tokens: int
    parts: tuple[Part, ...]
    not_reproduced: float  # D(F)
    trainer_drift: float  # G − D(∅)
    top: tuple[TokenShare, ...]
    what_if: dict[str, float] = field(default_factory=dict)  # "dtype=bfloat16" -> D with that alone changed

    @property
    def explained(self) -> float:
        return sum(p.share for p in self.parts if p.share is not None)

    def to_dict(self) -> dict:
        """Every number of the table as plain JSON values (``explain --mismatch --format jsonl``)."""
        import dataclasses

        return {
            "gap": self.gap,
            "tokens": self.tokens,
            "parts": [dataclasses.asdict(p) for p in self.parts],
            "not_reproduced": self.not_reproduced,
            "trainer_not_reproduced": self.trainer_drift,
            "explained": self.explained,
            "top": [dataclasses.asdict(t) | {"delta": t.delta} for t in self.top],
            "what_if": self.what_if,
        }

    def ranked(self) -> list[str]:
        """The attributed factors, largest part first."""
        return [p.factor for p in sorted(self.parts, key=lambda p: -(p.share or 0.0)) if p.share is not None]


def shapley(players: Sequence[str], value: Callable[[frozenset], torch.Tensor]) -> dict[str, torch.Tensor]:
    """Exact Shapley values of ``players`` under ``value`` (a tensor per coalition: per-token values)."""
    n, out = len(players), {}
    for p in players:
        others = [q for q in players if q != p]
        total = 0.0
        for r in range(len(others) + 1):
            weight = math.factorial(r) * math.factorial(n - r - 1) / math.factorial(n)
            for coalition in combinations(others, r):
                s = frozenset(coalition)
                total = total + weight * (value(s | {p}) - value(s))
        out[p] = total
    return out


def attribute(
    samples: Sequence[Sample],
    sampler: Side,
    trainer: Side,
    recompute: Recompute,
    *,
    absent: dict[str, str] | None = None,
    top: int = 5,
    what_if: bool = False,
) -> Attribution:
    """Split the gap between ``samples``' log μ and log π_old among the factors where ``sampler``
    and ``trainer`` differ (module docstring). ``absent``: factor -> why it cannot be recomputed
    (its share stays in "not reproduced"). ``what_if``: also D with the trainer's precision set to
    each dtype and its layout to each layout, one at a time."""
    absent = dict(absent or {})
    mask = torch.tensor([m for s in samples for m in s.mask], dtype=torch.bool)  # (N,)
    if not bool(mask.any()):
        raise ValueError("attribute: no generated token carries both log-probs")
    mu = torch.tensor([x for s in samples for x in s.sampler], dtype=torch.float64)[mask]  # (K,)
    old = torch.tensor([x for s in samples for x in s.trainer], dtype=torch.float64)[mask]  # (K,)
    cache: dict[Side, torch.Tensor] = {}

    def logprobs(side: Side) -> torch.Tensor:
        if side not in cache:
            cache[side] = recompute_logprobs(samples, side, recompute)[mask]
        return cache[side]

    differ = [f for f in FACTORS if getattr(sampler, _FIELD[f]) != getattr(trainer, _FIELD[f])]
    scorer = recompute.engines.get(sampler.engine) if sampler.engine != "hf" else None
    active = [f for f in differ if f not in absent and (f != "engine" or scorer is not None)]
    if "engine" in differ and "engine" not in absent and "engine" not in active:
        absent["engine"] = f"no scorer of {sampler.engine} given; its part stays in 'not reproduced'"

    def side_of(coalition: frozenset) -> Side:
        return replace(trainer, **{_FIELD[f]: getattr(sampler, _FIELD[f]) for f in coalition})

    base = (logprobs(trainer) - mu).abs()  # (K,)

    def value(coalition: frozenset) -> torch.Tensor:
        return base - (logprobs(side_of(coalition)) - mu).abs()

    phi = shapley(active, value) if active else {}
    parts = []
    for f in FACTORS:
        s_text, t_text = (_setting(side, f, samples) for side in (sampler, trainer))
        if f in phi:
            note = getattr(scorer, "note", "") if f == "engine" else ""
            parts.append(Part(f, float(phi[f].mean()), float(value(frozenset({f})).mean()), s_text, t_text, note))
        else:
            note = absent.get(f, "" if f in differ else "the same on both sides")
            parts.append(Part(f, None if f in differ else 0.0, None, s_text, t_text, note))
    gap = float((mu - old).abs().mean())
    full = float((logprobs(side_of(frozenset(active))) - mu).abs().mean())
    shares = _token_shares(samples, mask, mu, old, phi, top)
    extra = _what_if(trainer, logprobs, mu, [sampler.engine] if scorer is not None else []) if what_if else {}
    return Attribution(gap, int(mask.sum()), tuple(parts), full, gap - float(base.mean()), shares, extra)


def _setting(side: Side, factor: str, samples: Sequence[Sample]) -> str:
    """A side's setting of ``factor`` as the table shows it (a per-token version: the versions met)."""
    value = getattr(side, _FIELD[factor])
    if factor == "staleness":
        if value is not None:
            return f"v{value}"
        met = sorted({v for s in samples for v, m in zip(s.versions or (), s.mask) if m})
        return "v" + ",".join(map(str, met)) + " (own)"
    return str(value)


_FIELD = {"precision": "dtype", "batch": "layout", "staleness": "version", "rerender": "rerender", "engine": "engine"}


def _what_if(trainer: Side, logprobs: Callable[[Side], torch.Tensor], mu: torch.Tensor, engines) -> dict[str, float]:
    out = {}
    for dtype in PRECISIONS:
        out[f"precision={dtype}"] = float((logprobs(replace(trainer, dtype=dtype)) - mu).abs().mean())
    for layout in LAYOUTS:
        out[f"batch={layout}"] = float((logprobs(replace(trainer, layout=layout)) - mu).abs().mean())
    out["rerender=True"] = float((logprobs(replace(trainer, rerender=True)) - mu).abs().mean())
    for engine in engines:
        out[f"engine={engine}"] = float((logprobs(replace(trainer, engine=engine)) - mu).abs().mean())
    return out


def _token_shares(samples, mask, mu, old, phi, top) -> tuple[TokenShare, ...]:
    where = [(b, i) for b, s in enumerate(samples) for i in range(len(s.mask))]
    where = [w for w, m in zip(where, mask.tolist()) if m]  # (K,) (response, index)
    order = torch.argsort((mu - old).abs(), descending=True)[:top].tolist()
    out = []
    for k in order:
        parts = {f: float(v[k]) for f, v in phi.items()}
        leading = max(parts, key=lambda f: abs(parts[f])) if parts else "—"
        out.append(TokenShare(where[k][0], where[k][1], float(mu[k]), float(old[k]), leading, parts))
    return tuple(out)


def recompute_logprobs(samples: Sequence[Sample], side: Side, rc: Recompute) -> torch.Tensor:
    """(N,) float64: every token's log-prob recomputed with ``side``, the samples' tokens in order
    (0 where a sample's mask is False)."""
    if side.version is not None:
        return _with_weights(samples, side, rc)
    versions = sorted({v for s in samples for v, m in zip(s.versions or (), s.mask) if m})
    if not versions:
        raise ValueError("attribute: the sampler's weights are per token, and no sample records its version")
    per = {v: _with_weights(samples, replace(side, version=v), rc) for v in versions}
    out, k = [], 0
    for s in samples:
        for i in range(len(s.mask)):
            v = s.versions[i] if s.versions is not None and s.mask[i] else versions[0]
            out.append(float(per[v][k]))
            k += 1
    return torch.tensor(out, dtype=torch.float64)


def _with_weights(samples, side: Side, rc: Recompute) -> torch.Tensor:
    if side.dtype not in PRECISIONS:
        raise ValueError(f"attribute: unknown precision {side.dtype!r}; valid: {', '.join(PRECISIONS)}")
    if side.engine != "hf":  # another engine scores the ids itself, with its own batching
        if side.engine not in rc.engines:
            raise ValueError(f"attribute: no scorer of engine {side.engine!r} (Recompute.engines)")
        return _scored(samples, lambda seqs: rc.engines[side.engine](seqs, side), side, rc)
    model = rc.model(side.version, side.dtype)
    score = lambda seqs: _layout(model, seqs, side.layout, rc)  # noqa: E731
    if side.dtype.startswith("autocast-"):  # matrix products in half precision, as glassrl.models.precision
        with torch.autocast(device_type="cpu", dtype=DTYPES[side.dtype.removeprefix("autocast-")]):
            return _scored(samples, score, side, rc)
    return _scored(samples, score, side, rc)


def _scored(samples, score, side: Side, rc: Recompute) -> torch.Tensor:
    """``score(seqs)``: per sequence (prompt ids, response ids), its response tokens' log-probs."""
    own = [(list(s.prompt_ids), list(s.response_ids)) for s in samples]
    if side.rerender:
        if rc.render is None or rc.token_bytes is None:
            raise ValueError("attribute: rerender needs Recompute.render and Recompute.token_bytes")
        rendered = [rc.render(s) for s in samples]
        scored = score([(list(p), list(r)) for p, r in rendered])
        rows = [  # against the samples' own ids scored with ``side``
            align_retokenised(rc.token_bytes(list(s.response_ids)), rc.token_bytes(list(r)), row, mine)
            for s, (_, r), row, mine in zip(samples, rendered, scored, score(own))
        ]
    else:
        rows = score(own)
    return torch.tensor([x for row in rows for x in row], dtype=torch.float64)


def align_retokenised(
    own_bytes: list[int], new_bytes: list[int], new_lp: list[float], own_lp: list[float]
) -> list[float]:
    """The re-rendered ids' log-probs ``new_lp`` on the sampled tokens: the responses are cut into
    the shortest spans whose ends are token boundaries in both tokenisations; a span's log-prob
    (the sum of its tokens') is the probability of the same text, so each sampled token of a span
    gets its own log-prob ``own_lp`` plus an even share of the span's difference (a span tokenised
    alike keeps the re-rendered token's own number)."""
    own_ends = _ends(own_bytes)
    new_ends = _ends(new_bytes)
    total = max(own_ends[-1] if own_ends else 0, new_ends[-1] if new_ends else 0)
    own_ends[-1:] = [total] if own_ends else []
    new_ends[-1:] = [total] if new_ends else []
    cuts = sorted(set(own_ends) & set(new_ends))
    out, i, j = [], 0, 0
    for cut in cuts:
        own_span, new_span = [], []
        while i < len(own_ends) and own_ends[i] <= cut:
            own_span.append(i)
            i += 1
        while j < len(new_ends) and new_ends[j] <= cut:
            new_span.append(j)
            j += 1
        if len(own_span) == 1 and len(new_span) == 1:
            out.append(new_lp[new_span[0]])
            continue
        diff = sum(new_lp[k] for k in new_span) - sum(own_lp[k] for k in own_span)
        out.extend(own_lp[k] + diff / len(own_span) for k in own_span)
    out.extend(own_lp[len(out) :])  # tokens of no text (a stop token) keep their own
    return out


def _ends(lengths: list[int]) -> list[int]:
    ends, at = [], 0
    for n in lengths:
        at += n
        ends.append(at)
    return ends


def _layout(model, seqs: list[tuple[list[int], list[int]]], layout: str, rc: Recompute) -> list[list[float]]:
    """Per sequence, the log-prob of each response token with ``layout`` (module docstring)."""
    if layout == "decode":
        return _decode(model, seqs, rc)
    size = 1 if layout == "alone" else rc.micro_batch
    out = []
    for start in range(0, len(seqs), size):
        chunk = seqs[start : start + size]
        ids, attention, T = _padded(chunk, rc.pad_id)
        with torch.no_grad():
            lp, _ = response_logprobs(
                model,
                ids,
                attention,
                T,
                temperature=rc.temperature,
                packed=layout == "packed",
                shared_prefix=layout == "shared_prefix",
            )  # (b, T)
        out += [lp[b, : len(r)].double().tolist() for b, (_, r) in enumerate(chunk)]
    return out


def _padded(seqs, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Prompts left-padded, responses right-padded: ids and mask (b, P+T), and T."""
    P = max(len(p) for p, _ in seqs)
    T = max(len(r) for _, r in seqs)
    ids = torch.full((len(seqs), P + T), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), P + T), dtype=torch.bool)
    for b, (p, r) in enumerate(seqs):
        ids[b, P - len(p) : P] = torch.tensor(p)
        ids[b, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
        attention[b, P - len(p) : P + len(r)] = True
    return ids, attention, T


def _decode(model, seqs, rc: Recompute) -> list[list[float]]:
    """The sampler's way: the whole batch at once, prompts left-padded, then one token per step
    through a KV cache (glassrl.rollout.hf.decode), log softmax(logits / temperature) of the token
    that was sampled (glassrl.rollout.decoding.sampled_logprobs). Rows that ended are fed padding,
    masked out."""
    ids, attention, T = _padded(seqs, rc.pad_id)
    P = ids.shape[1] - T
    name = cache_argument(model) or "past_key_values"
    cache = DynamicCache()
    out = torch.zeros((len(seqs), T), dtype=torch.float64)
    with torch.no_grad():
        for t in range(-1, T):
            end = P if t < 0 else P + t + 1
            begin = 0 if t < 0 else P + t
            mask = attention[:, :end].long()
            positions = position_ids_from_mask(attention[:, :end])[:, begin:end]
            result = model(
                input_ids=ids[:, begin:end],
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{name: cache},
            )
            step_logits = result.logits[:, -1].float() / rc.temperature  # (b, V)
            if t + 1 < T:
                chosen = ids[:, P + t + 1]  # (b,)
                lp = step_logits.gather(-1, chosen.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(step_logits, -1)
                out[:, t + 1] = lp.double()
    return [out[b, : len(r)].tolist() for b, (_, r) in enumerate(seqs)]


def byte_lengths(tokenizer) -> Callable[[list[int]], list[int]]:
    """``ids`` -> the byte length of each token's text (special tokens: 0), from the byte-level
    tokens themselves: decoding one token of a split character would give U+FFFD instead."""
    specials = set(tokenizer.all_special_ids)

    def lengths(ids: list[int]) -> list[int]:
        return [0 if i in specials else len(tokenizer.decode([i]).encode()) for i in ids]

    def exact(ids: list[int]) -> list[int]:  # prefix decodes: right for every split character
        out, before = [], 0
        for k in range(1, len(ids) + 1):
            now = len(tokenizer.decode([i for i in ids[:k] if i not in specials]).encode())
            out.append(now - before)
            before = now
        return out

    def choose(ids: list[int]) -> list[int]:
        quick = lengths(ids)
        text = len(tokenizer.decode([i for i in ids if i not in specials]).encode())
        return quick if sum(quick) == text and "\ufffd" not in tokenizer.decode(ids) else exact(ids)

    return choose


def text_render(tokenizer) -> Callable[[Sample], tuple[list[int], list[int]]]:
    """A trainer that re-renders: the response decoded to text and encoded again (its special
    tokens kept where they were, at the end), the prompt's ids unchanged."""
    specials = set(tokenizer.all_special_ids)

    def render(sample: Sample) -> tuple[list[int], list[int]]:
        ids = list(sample.response_ids)
        tail = []
        while ids and ids[-1] in specials:
            tail.insert(0, ids.pop())
        text = tokenizer.decode(ids)
        return list(sample.prompt_ids), tokenizer.encode(text, add_special_tokens=False) + tail

    return render


def render_attribution(result: Attribution, tokens: Sequence[Sequence[str]] | None = None) -> list[str]:
    """The table (a part per factor, the two closing rows, the measured gap they sum to), the
    what-if lines and the tokens that carry most of the gap. ``tokens[b][i]``: the text of token i
    of response b (the ids' positions otherwise)."""
    G = result.gap
    pct = lambda x: f"{100 * x / G:6.1f} %" if G > 0 else "      —"  # noqa: E731
    lines = [
        f"measured gap G = mean |log μ − log π_old| = {G:.6g} nats/token over {result.tokens} tokens",
        f"{'factor':<24}{'sampler':<19}{'trainer':<19}{'part φ':>13}{'share':>10}{'alone':>13}  note",
    ]
    for p in result.parts:
        share = "absent" if p.share is None else f"{p.share:.6g}"
        alone = "" if p.alone is None else f"{p.alone:.6g}"
        pc = "" if p.share is None else pct(p.share)
        lines.append(f"{p.factor:<24}{p.sampler:<19}{p.trainer:<19}{share:>13}{pc:>10}{alone:>13}  {p.note}")
    closing = (
        ("not reproduced", result.not_reproduced, "every factor on the sampler's side still differs from log μ"),
        ("trainer not reproduced", result.trainer_drift, "the trainer's settings recomputed vs the ledger's log π_old"),
    )
    for name, value, note in closing:
        lines.append(f"{name:<24}{'':<38}{value:>13.6g}{pct(value):>10}{'':>13}  {note}")
    total = result.explained + result.not_reproduced + result.trainer_drift
    lines.append(f"{'sum = G':<24}{'':<38}{total:>13.6g}{pct(total):>10}")
    lines.append(f"factors explain {pct(result.explained).strip()} of G (Shapley values over the factors that differ)")
    if result.what_if:
        lines.append("one factor changed at a time from the trainer's settings: mean |recomputed − log μ|")
        lines += [f"  {name:<30}{value:.6g}" for name, value in result.what_if.items()]
    if result.top:
        lines.append("tokens carrying most of the gap (Δ = log μ − log π_old; the factor with the largest part)")
        for t in result.top:
            text = repr(tokens[t.response][t.index]) if tokens is not None else ""
            lines.append(
                f"  response {t.response} token {t.index} {text}: log μ {t.sampler:.5f}, log π_old {t.trainer:.5f}, "
                f"Δ {t.delta:+.3g}, {t.leading}"
            )
    return lines
