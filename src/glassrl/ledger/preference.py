"""The preference ledger: per token of a pair's chosen and rejected responses, log π_θ, log π_ref
and the implicit reward ρ_i, with the sums the loss compares.

    ledger = PreferenceLedger.from_dict(json.loads(line))   # a file of glassrl dpo, or explain --format jsonl
    print("\\n".join(ledger.lines("zh")))                   # the table and its legend, in Chinese

DPO's reward of a response, r(x, y) = β·log π_θ(y|x)/π_ref(y|x), is a sum over its tokens of
ρ_i = β·(log π_θ(a_i|s_i) − log π_ref(a_i|s_i)) (Rafailov et al. 2023, eq. 5; Rafailov et al.
2024, "From r to Q*", read each ρ_i as the token's credit): the ledger shows every ρ_i, and its
sums are the rewards of the loss (glassrl.algos.losses.preference), not a recomputation. SimPO
(reference-free) has ρ_i = β·log π_θ(a_i|s_i) and r = their mean (``reduction`` token-mean).

This module holds the rows, their JSON form and the text (tables and legend, en and zh); it
imports no torch, so the report reads a ledger offline. glassrl.ledger.implicit_rewards computes
one from log-probs with the loss's own functions.
"""

from __future__ import annotations

import unicodedata
from dataclasses import asdict, dataclass
from typing import Any

from glassrl.ledger.phrases import LANGUAGES

SIDES = ("chosen", "rejected")


@dataclass(frozen=True)
class PreferenceToken:
    """One response token: its index i, id, text a_i, log π_θ(a_i|s_i), log π_ref(a_i|s_i)
    (None without a reference) and implicit reward ρ_i."""

    i: int
    token_id: int
    token: str
    logprob: float
    ref_logprob: float | None
    reward: float
    nll: float | None = None  # ν_i, the token's NLL term (chosen side of RPO, CPO, ORPO), else None


@dataclass(frozen=True)
class PreferenceSide:
    """One response of the pair: its text, tokens, and the sums: ``reward`` r(x, y) as the loss
    reads it (Σ ρ_i, or their mean), ``logprob`` Σ log π_θ, ``ref_logprob`` Σ log π_ref (or None)."""

    name: str
    response: str
    tokens: tuple[PreferenceToken, ...]
    reward: float
    logprob: float
    ref_logprob: float | None


@dataclass(frozen=True)
class PreferenceLedger:
    """A pair's ledger: the loss (name, β and its other knobs, the reduction of the ρ_i), the
    prompt, both sides, the pair's loss (None for KTO, whose loss needs a batch's z₀)."""

    loss: str
    params: dict[str, float]
    reduction: str
    prompt: str
    chosen: PreferenceSide
    rejected: PreferenceSide
    pair_loss: float | None
    source: str = ""  # the run or model the numbers come from

    @property
    def margin(self) -> float:
        return self.chosen.reward - self.rejected.reward

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreferenceLedger:
        def side(d: dict[str, Any]) -> PreferenceSide:
            tokens = tuple(PreferenceToken(**t) for t in d["tokens"])
            return PreferenceSide(**{**d, "tokens": tokens})

        return cls(**{**data, "chosen": side(data["chosen"]), "rejected": side(data["rejected"])})

    def lines(self, lang: str = "en") -> list[str]:
        """The header, a table per side with its sums, the loss line and the legend, in ``lang``."""
        if lang not in LANGUAGES:
            raise ValueError(f"unknown language {lang!r}; valid: {', '.join(LANGUAGES)}")
        p = PHRASES[lang]
        knobs = " · ".join(f"{k} = {v:g}" for k, v in self.params.items())
        rule = p["rule.ref"] if self.chosen.ref_logprob is not None else p["rule.free"]
        out = [f"{self.loss} · {knobs} · {rule}", f"{p['prompt']} {self.prompt!r}"]
        if self.source:
            out.insert(1, f"{p['source']} {self.source}")
        for side in (self.chosen, self.rejected):
            out += ["", *self._table(side, p)]
        out += ["", self._loss_line(p), "", p["heading.legend"], *self._legend(p)]
        return out

    def _table(self, side: PreferenceSide, p: dict[str, str]) -> list[str]:
        ref = side.ref_logprob is not None
        total = p["sum.mean"] if self.reduction == "token-mean" else p["sum.sum"]
        head = f"{p[side.name]} {side.response!r} · r = {side.reward:.4f} ({total})"
        nll = any(t.nll is not None for t in side.tokens)
        columns = f"{'i':>3} {'id':>5}  {'a_i':<10} {'log π_θ':>10}" + (f" {'log π_ref':>10}" if ref else "")
        rows = [head, columns + f" {'ρ_i':>10}" + (f" {'ν_i':>10}" if nll else "")]
        for t in side.tokens:
            row = f"{t.i:>3} {t.token_id:>5}  {_cell(t.token)} {t.logprob:>10.4f}"
            row += (f" {t.ref_logprob:>10.4f}" if ref else "") + f" {t.reward:>10.4f}"
            rows.append(row + (f" {t.nll:>10.4f}" if nll else ""))
        sums = f"{'Σ':>3} {'':>5}  {'':<10} {side.logprob:>10.4f}" + (f" {side.ref_logprob:>10.4f}" if ref else "")
        sums += f" {sum(t.reward for t in side.tokens):>10.4f}"
        rows.append(sums + (f" {sum(t.nll or 0.0 for t in side.tokens):>10.4f}" if nll else ""))
        return rows

    def _loss_line(self, p: dict[str, str]) -> str:
        c, r = self.chosen.reward, self.rejected.reward
        order = p["ordered"] if c > r else p["misordered"]
        line = p["margin"].format(c=c, r=r, margin=c - r, order=order)
        if self.pair_loss is None:
            return line + " " + p["loss.kto"]
        nll = [t.nll for t in self.chosen.tokens if t.nll is not None]
        if not nll:
            return line + " " + p[f"loss.{self.loss}"].format(loss=self.pair_loss, **self.params)
        term = self.pair_loss - sum(nll)
        words = p[f"loss.{self.loss}"].format(loss=term, **self.params)
        return f"{line} {words} {p['loss.nll'].format(nll=sum(nll), loss=self.pair_loss)}"

    def _legend(self, p: dict[str, str]) -> list[str]:
        """Two tokens in words: the largest |ρ_i| of each side, with the numbers of their rows."""
        out = []
        for side in (self.chosen, self.rejected):
            if not side.tokens:
                continue
            t = max(side.tokens, key=lambda x: abs(x.reward))
            slots = dict(side=p[side.name], i=t.i, token=t.token, lp=t.logprob, rho=t.reward)
            if t.ref_logprob is not None:
                sign = p["more"] if t.reward > 0 else p["less"]
                out.append("  " + p["legend.ref"].format(ref=t.ref_logprob, sign=sign, **slots, **self.params))
            else:
                out.append("  " + p["legend.free"].format(**slots, **self.params))
        out.append("  " + p["legend.sums"])
        return out


def _cell(token: str, width: int = 10) -> str:
    """A token as one table cell of ``width`` terminal columns: whitespace shown, a wide (CJK)
    character counted as two columns, cut with "…" when longer."""
    shown, used = "", 0
    for char in token.replace("\n", "\\n").replace(" ", "␣"):
        size = 2 if unicodedata.east_asian_width(char) in "WF" else 1
        if used + size > width - 1 and len(token) > len(shown) + 1:
            return shown + "…" + " " * (width - used - 1)
        shown, used = shown + char, used + size
    return shown + " " * (width - used)


# key -> sentence with named slots; the same keys and slots in every language.
PHRASES: dict[str, dict[str, str]] = {
    "en": {
        "rule.ref": "ρ_i = β·(log π_θ(a_i|s_i) − log π_ref(a_i|s_i))",
        "rule.free": "ρ_i = β·log π_θ(a_i|s_i) (reference-free)",
        "source": "model:",
        "prompt": "prompt",
        "chosen": "chosen",
        "rejected": "rejected",
        "sum.sum": "Σ_i ρ_i",
        "sum.mean": "mean of ρ_i: β/|y|·log π_θ(y|x)",
        "margin": "margin r_chosen − r_rejected = {c:.4f} − ({r:.4f}) = {margin:.4f}: {order}.",
        "ordered": "the pair is ordered right",
        "misordered": "the pair is ordered wrong (a tie counts as wrong)",
        "loss.dpo": (
            "Loss −(1−ε)·log σ(margin) − ε·log σ(−margin) = {loss:.4f} (β = {beta:g}, ε = {label_smoothing:g})."
        ),
        "loss.ipo": "Loss (margin/β − 1/(2β))² = {loss:.4f} (β = {beta:g}).",
        "loss.simpo": "Loss −log σ(margin − γ) = {loss:.4f} (γ = {simpo_gamma:g}).",
        "loss.cpo": (
            "Preference term −(1−ε)·log σ(margin) − ε·log σ(−margin) = {loss:.4f} (β = {beta:g}, ε = "
            "{label_smoothing:g}, CPO's NLL weight {cpo_alpha:g})."
        ),
        "loss.orpo": (
            "Odds-ratio term −β·log σ(log odds(y_w) − log odds(y_l)) = {loss:.4f} (odds = P/(1−P), P = exp(r/β); "
            "β = {beta:g})."
        ),
        "loss.bco": (
            "Loss −log σ(r_chosen − δ) − log σ(−(r_rejected − δ)) = {loss:.4f} (β = {beta:g}, δ = "
            "{bco_delta:.4f}: the running mean reward)."
        ),
        "loss.nll": (
            "Plus the NLL term on the chosen response Σ_i ν_i = {nll:.4f} (ν_i = −α·log π_θ(a_i|s_i)/|y_w|): the "
            "pair's loss is {loss:.4f}."
        ),
        "loss.kto": "KTO scores each response against z₀, a statistic of its training batch: no pair loss here.",
        "heading.legend": "Legend (s_i = prompt ⊕ y_<i, a_i = token i; ρ_i = token i's share of the implicit reward):",
        "more": "more",
        "less": "less",
        "legend.ref": (
            "{side}, token {i} ({token}): log π_θ = {lp:.4f} against log π_ref = {ref:.4f}: the trained policy "
            "gives a_{i} {sign} probability than π_ref, so ρ_{i} = β·({lp:.4f} − ({ref:.4f})) = {rho:.4f}."
        ),
        "legend.free": "{side}, token {i} ({token}): ρ_{i} = β·log π_θ = {beta:g}·{lp:.4f} = {rho:.4f}.",
        "legend.sums": (
            "The sums (Σ rows) are the rewards the loss compared: r(x, y) = Σ_i ρ_i, so a token's ρ_i is how "
            "much of the pair's margin it carries (DPO's reward is a sum of per-token credits, Rafailov et al. 2024)."
        ),
    },
    "zh": {
        "rule.ref": "ρ_i = β·(log π_θ(a_i|s_i) − log π_ref(a_i|s_i))",
        "rule.free": "ρ_i = β·log π_θ(a_i|s_i)（无参考模型）",
        "source": "模型：",
        "prompt": "提示",
        "chosen": "优选回答",
        "rejected": "劣选回答",
        "sum.sum": "Σ_i ρ_i",
        "sum.mean": "ρ_i 的平均：β/|y|·log π_θ(y|x)",
        "margin": "差值 r_优选 − r_劣选 = {c:.4f} − ({r:.4f}) = {margin:.4f}：{order}。",
        "ordered": "这对回答排序正确",
        "misordered": "这对回答排序错误（相等也算错）",
        "loss.dpo": "损失 −(1−ε)·log σ(差值) − ε·log σ(−差值) = {loss:.4f}（β = {beta:g}，ε = {label_smoothing:g}）。",
        "loss.ipo": "损失 (差值/β − 1/(2β))² = {loss:.4f}（β = {beta:g}）。",
        "loss.simpo": "损失 −log σ(差值 − γ) = {loss:.4f}（γ = {simpo_gamma:g}）。",
        "loss.cpo": (
            "偏好项 −(1−ε)·log σ(差值) − ε·log σ(−差值) = {loss:.4f}（β "
            "= {beta:g}，ε = {label_smoothing:g}，CPO 的 NLL 权重 "
            "{cpo_alpha:g}）。"
        ),
        "loss.orpo": (
            "优势比项 −β·log σ(log odds(y_w) − log odds(y_l)) = "
            "{loss:.4f}（odds = P/(1−P)，P = exp(r/β)；β = {beta:g}）。"
        ),
        "loss.bco": (
            "损失 −log σ(r_优选 − δ) − log σ(−(r_劣选 − δ)) = "
            "{loss:.4f}（β = {beta:g}，δ = {bco_delta:.4f}：奖励的滑动平均）。"
        ),
        "loss.nll": (
            "再加上优选回答的 NLL 项 Σ_i ν_i = {nll:.4f}（ν_i = −α·log "
            "π_θ(a_i|s_i)/|y_w|）：这对回答的损失是 {loss:.4f}。"
        ),
        "loss.kto": "KTO 把每个回答与 z₀（训练批次的统计量）比较：这里没有成对的损失。",
        "heading.legend": "图例（s_i = 提示 ⊕ y_<i，a_i = 第 i 个词元；ρ_i = 第 i 个词元在隐式奖励中的份额）：",
        "more": "更高",
        "less": "更低",
        "legend.ref": (
            "{side}，第 {i} 个词元（{token}）：log π_θ = {lp:.4f}，log π_ref = {ref:.4f}：训练后的策略给 a_{i} 的概率"
            "比 π_ref {sign}，所以 ρ_{i} = β·({lp:.4f} − ({ref:.4f})) = {rho:.4f}。"
        ),
        "legend.free": "{side}，第 {i} 个词元（{token}）：ρ_{i} = β·log π_θ = {beta:g}·{lp:.4f} = {rho:.4f}。",
        "legend.sums": (
            "Σ 行就是损失比较的奖励：r(x, y) = Σ_i ρ_i，所以一个词元的 ρ_i 就是它在这对回答的差值中承担的份额"
            "（DPO 的奖励是逐词元功劳之和，Rafailov 等 2024）。"
        ),
    },
}
