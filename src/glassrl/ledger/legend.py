"""The legend: a token of a ledger, and each response's baseline, in words with the numbers of its row.

The one source of the legend. The terminal (``glassrl explain``, through
:func:`glassrl.ledger.render.legend_text`) and the report's token view
(:func:`glassrl.report.html.token_payload` embeds the lines; ``token_view.js`` only shows
them) both print what :func:`token_legend` and :func:`baseline_legend` return.

Each advantage estimator has its account here (:data:`ACCOUNTS`): the lines that tell a
token's credit, and the baseline of each response. Its entry in the registry
(glassrl.algos.advantages) holds a torch function; the report shows a ledger where torch
cannot be imported (DESIGN §2), so the accounts are keyed by the estimator's name and a
test checks that every registered estimator has one.

Languages are data. ``PHRASES[lang]`` holds every sentence with named slots (``{i}``,
``{adv}``, …); the functions below decide once, for every language, which sentences
apply to a token and fill the slots with the numbers of its row. A language is a new
table with the same keys and slots (tests check both).

The numbers are only displayed from the ledger, except the group statistics of the
baselines, which are recomputed with :mod:`statistics` so that a reader can see the
baseline (tests check that the two agree).
"""

from __future__ import annotations

import bisect
import math
import statistics
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from glassrl.ledger.model import Ledger, ResponseLedger, TokenRow

DASH = "—"
LANGUAGES = ("en", "zh")
LABEL_WIDTH = 8  # terminal columns of a line's label ("state   ", "状态    ")

# key -> sentence with named slots; the slots are the same in every language.
PHRASES: dict[str, dict[str, str]] = {
    "en": {
        "label.token": "token",
        "label.state": "state",
        "label.obs": "obs",
        "label.action": "action",
        "label.reward": "reward",
        "label.value": "value",
        "label.TD": "TD",
        "label.adv": "adv",
        "label.return": "return",
        "label.whiten": "whiten",
        "heading.baselines": "Baselines (how each response's advantage follows from its group or baseline):",
        "heading.legend": (
            "Legend (s_i = state before token i, a_i = the token; values[i] = V(s_i) is read before a_i):"
        ),
        "token": "response {b}, token {i}: a_{i} = {token}",
        "state.prompt": "s_{i} = the prompt = {prompt}",
        "state": "s_{i} = prompt ⊕ y_<{i} = {prompt} ⊕ {prefix}",
        "obs": (
            "a_{i} is an observation token (mask 0): not an action of the policy, so it has no reward, "
            "δ, A or R and does not train; GAE carries V and A across it."
        ),
        "action": "a_{i} = {token}, the token itself",
        "action.logprob": "; log π(a_{i}|s_{i}) = {logprob}",
        "action.ref_logprob": ", log π_ref(a_{i}|s_{i}) = {ref_logprob}",
        "label.sampled": "sampled",
        "sampled.sep": "; ",
        "sampled.version": "by the weights of version {v}, {lag} actor update(s) before the one that trains on it",
        "sampled.logprob": "log μ(a_{i}|s_{i}) = {mu} while sampling; ρ_{i} = π_old/μ = exp({old} − {mu}) = {rho}",
        "sampled.weight": "algo.off_policy: its policy-loss term × w_{i} = {w}",
        "sampled.dropped": "algo.off_policy dropped it: out of the policy loss and its denominator",
        "reward": "r_{i} = score_{i} = {r} (no KL in the reward)",
        "reward.kl": "r_{i} = score_{i} − β·kl_{i} = {score} − {beta}·{kl} = {r}",
        "value": "V(s_{i}) = {v}: the critic's estimate of {future}, read before a_{i}; it includes r_{i}",
        "TD.end": (
            "δ_{i} = r_{i} + γ·V(s_{T}) − V(s_{i}) = {r} + {gamma}·0 − {v} = {delta}   "
            "(V(s_{T}) = 0: the episode has ended)"
        ),
        "TD": "δ_{i} = r_{i} + γ·V(s_{j}) − V(s_{i}) = {r} + {gamma}·{v_next} − {v} = {delta}",
        "TD.carried": "   (s_{j}: next generated token; observation tokens {first}…{last} carried)",
        "adv.end": "A_{i} = δ_{i} = {adv}   (no token after it)",
        "adv.gae": "A_{i} = δ_{i} + γλ·A_{j} = {delta} + {gamma_lam}·{adv_next} = {adv}",
        "return.gae": (
            "R_{i} = A_{i} + V(s_{i}) = {adv} + {v} = {ret}: target of V(s_{i}), includes r_{i}; "
            "raw A_{i}, not the whitened one"
        ),
        "whiten": "Â_{i} = {white}: A_{i} whitened over all valid tokens; only the policy loss sees it",
        "adv.broadcast": (
            "A_{i} = {adv}: the advantage of the whole response (baseline above), "
            "the same on every generated token (task-level credit)"
        ),
        "return.no_critic": "R_{i} = {ret} (no critic is fitted to it)",
        "return.reinforce_pp": (
            "R_{i} = G_{i} = r_{i} + γ·G_(next) = {ret}: discounted sum of the rewards "
            "from a_{i} on (γ = {gamma}, no critic)"
        ),
        "adv.reinforce_pp": ("A_{i} = (G_{i} − mean G)/std G over all valid tokens = ({ret} − {mean})/{std} = {adv}"),
        "adv.process": (
            "A_{i} = Σ of the normalised step rewards r̃ of the steps ending at or after token {i} "
            "(tokens {ends}) = {adv}"
        ),
        "adv.generic": "A_{i} = {adv}, R_{i} = {ret} (estimator {estimator})",
        "group.scores": "group {gid}: S = Σ_i r_i per response = [{scores}], mean {mean}, std {std} (unbiased)",
        "group.steps": (
            "group {gid}: {n} step rewards, mean {mean}, std {std} (unbiased); each becomes r̃ = (r − mean)/(std + ε)"
        ),
        "baseline.grpo": "response {b}: A = (S − mean)/(std + ε) = ({S} − {mean})/({std} + ε) = {adv}",
        "baseline.dr_grpo": "response {b}: A = S − mean = {S} − {mean} = {adv} (no division by std)",
        "baseline.rloo": "response {b}: baseline = mean S of the other {n} = {others}; A = {S} − {baseline} = {adv}",
        "baseline.remax": "response {b}: A = S − reward of the greedy response = {S} − {baseline} = {adv}",
        "baseline.reinforce_pp_baseline": (
            "response {b}: S − mean = {ret} (= R), then whitened over all valid tokens → A = {adv}"
        ),
        "baseline.process": (
            "response {b}: step rewards at tokens {ends} = [{rewards}]; A_i = Σ r̃ of the steps ending at or after i"
        ),
        "heading.turns": (
            "Turns of response {b} (credit per turn: sums over its generated tokens; observation tokens have none):"
        ),
        "turn": "turn {k}: tokens {start}…{last} generated ({n}){obs}; finish {finish}{calls}{parts}",
        "turn.obs": ", observation tokens {first}…{last}",
        "turn.calls": "; calls {calls}",
        "turn.parts": "; environment reward {parts}",
        "turn.credit": "    Σ r_i = {rewards}   Σ A_i = {advantages}   mean A_i = {mean}",
    },
    # Terms as the reference documents use them: 优势, 回报, 价值, 奖励, 白化, 信用分配, 基线.
    "zh": {
        "label.token": "token",
        "label.state": "状态",
        "label.obs": "观测",
        "label.action": "动作",
        "label.reward": "奖励",
        "label.value": "价值",
        "label.TD": "TD",
        "label.adv": "优势",
        "label.return": "回报",
        "label.whiten": "白化",
        "heading.baselines": "基线（每个回答的优势如何由它的组或基线得出）：",
        "heading.legend": (
            "逐 token 说明（s_i = 生成 token i 之前的状态，a_i = 该 token；values[i] = V(s_i) 在 a_i 之前读出）："
        ),
        "token": "回答 {b}，token {i}：a_{i} = {token}",
        "state.prompt": "s_{i} = prompt 本身 = {prompt}",
        "state": "s_{i} = prompt ⊕ y_<{i} = {prompt} ⊕ {prefix}",
        "obs": (
            "a_{i} 是观测 token（mask 0）：不是策略的动作，所以没有奖励、δ、A 和 R，也不参与训练；"
            "GAE 把 V 和 A 原样传过它。"
        ),
        "action": "a_{i} = {token}，即这个 token 本身",
        "action.logprob": "；log π(a_{i}|s_{i}) = {logprob}",
        "action.ref_logprob": "，log π_ref(a_{i}|s_{i}) = {ref_logprob}",
        "label.sampled": "采样",
        "sampled.sep": "；",
        "sampled.version": "由第 {v} 版权重采样，比训练它的那次 actor 更新早 {lag} 次",
        "sampled.logprob": "采样时 log μ(a_{i}|s_{i}) = {mu}；ρ_{i} = π_old/μ = exp({old} − {mu}) = {rho}",
        "sampled.weight": "algo.off_policy：它的策略损失项 × w_{i} = {w}",
        "sampled.dropped": "algo.off_policy 丢弃了它：不计入策略损失及其分母",
        "reward": "r_{i} = score_{i} = {r}（奖励中没有 KL 项）",
        "reward.kl": "r_{i} = score_{i} − β·kl_{i} = {score} − {beta}·{kl} = {r}",
        "value": "V(s_{i}) = {v}：critic 对 {future} 的估计，在 a_{i} 之前读出；它包含 r_{i}",
        "TD.end": (
            "δ_{i} = r_{i} + γ·V(s_{T}) − V(s_{i}) = {r} + {gamma}·0 − {v} = {delta}   （V(s_{T}) = 0：回答已结束）"
        ),
        "TD": "δ_{i} = r_{i} + γ·V(s_{j}) − V(s_{i}) = {r} + {gamma}·{v_next} − {v} = {delta}",
        "TD.carried": "   （s_{j}：下一个生成的 token；观测 token {first}…{last} 被跨过）",
        "adv.end": "A_{i} = δ_{i} = {adv}   （其后没有 token）",
        "adv.gae": "A_{i} = δ_{i} + γλ·A_{j} = {delta} + {gamma_lam}·{adv_next} = {adv}",
        "return.gae": (
            "R_{i} = A_{i} + V(s_{i}) = {adv} + {v} = {ret}：V(s_{i}) 的训练目标，包含 r_{i}；"
            "用的是原始的 A_{i}，不是白化后的"
        ),
        "whiten": "Â_{i} = {white}：A_{i} 在全部有效 token 上白化的结果；只有策略损失使用它",
        "adv.broadcast": ("A_{i} = {adv}：整个回答的优势（基线见上），每个生成的 token 都相同（任务级信用分配）"),
        "return.no_critic": "R_{i} = {ret}（没有 critic 拟合它）",
        "return.reinforce_pp": (
            "R_{i} = G_{i} = r_{i} + γ·G_(next) = {ret}：从 a_{i} 起各奖励的折扣和（γ = {gamma}，没有 critic）"
        ),
        "adv.reinforce_pp": (
            "A_{i} = (G_{i} − G 的均值)/G 的标准差（在全部有效 token 上）= ({ret} − {mean})/{std} = {adv}"
        ),
        "adv.process": "A_{i} = 在 token {i} 或其后结束的各步的归一化步奖励 r̃ 之和（token {ends}）= {adv}",
        "adv.generic": "A_{i} = {adv}，R_{i} = {ret}（估计器 {estimator}）",
        "group.scores": "组 {gid}：每个回答的 S = Σ_i r_i = [{scores}]，均值 {mean}，标准差 {std}（无偏）",
        "group.steps": (
            "组 {gid}：{n} 个步奖励，均值 {mean}，标准差 {std}（无偏）；每个变为 r̃ = (r − 均值)/(标准差 + ε)"
        ),
        "baseline.grpo": "回答 {b}：A = (S − 均值)/(标准差 + ε) = ({S} − {mean})/({std} + ε) = {adv}",
        "baseline.dr_grpo": "回答 {b}：A = S − 均值 = {S} − {mean} = {adv}（不除以标准差）",
        "baseline.rloo": "回答 {b}：基线 = 其余 {n} 个回答的 S 的均值 = {others}；A = {S} − {baseline} = {adv}",
        "baseline.remax": "回答 {b}：A = S − 贪心回答的奖励 = {S} − {baseline} = {adv}",
        "baseline.reinforce_pp_baseline": "回答 {b}：S − 均值 = {ret}（= R），再在全部有效 token 上白化 → A = {adv}",
        "baseline.process": "回答 {b}：位于 token {ends} 的步奖励 = [{rewards}]；A_i = 在 i 或其后结束的各步的 r̃ 之和",
        "heading.turns": "回答 {b} 的各轮（每轮的信用：对该轮生成的 token 求和；观测 token 没有信用）：",
        "turn": "第 {k} 轮：token {start}…{last} 为生成（{n} 个）{obs}；结束原因 {finish}{calls}{parts}",
        "turn.obs": "，观测 token {first}…{last}",
        "turn.calls": "；工具调用 {calls}",
        "turn.parts": "；环境奖励 {parts}",
        "turn.credit": "    Σ r_i = {rewards}   Σ A_i = {advantages}   A_i 均值 = {mean}",
    },
}


@dataclass(frozen=True)
class LegendLine:
    """One line of a token's legend: ``key`` names what it explains (state, reward, TD, adv, …)."""

    key: str
    text: str


def fmt(x: float | None) -> str:
    """A number to 4 decimals ("—" for None); −0.0000 prints as 0.0000."""
    if x is None:
        return DASH
    text = f"{x:.4f}"
    return "0.0000" if text == "-0.0000" else text


def factor(x: float | None) -> str:
    """A number after "·" in a formula: negatives in parentheses, so "0.1·(−0.05)" reads right."""
    text = fmt(x)
    return f"({text})" if text.startswith("-") else text


def num(x: float | None) -> str:
    """A parameter or input in the legend: short form (0.95, 1, 1e-06); "—" for None."""
    return DASH if x is None else f"{x:g}"


def phrase(key: str, lang: str = "en", **slots: object) -> str:
    """The sentence ``key`` in ``lang`` with its slots filled."""
    if lang not in PHRASES:
        raise ValueError(f"legend language {lang!r}: valid: {', '.join(LANGUAGES)}")
    return PHRASES[lang][key].format(**slots)


def label(key: str, lang: str = "en") -> str:
    """The short name of a legend line (the terminal's left column, the report's tag)."""
    return phrase(f"label.{key}", lang)


def labels(lang: str = "en") -> dict[str, str]:
    """Every line key -> its label in ``lang`` (the report ships these once per page)."""
    return {k.removeprefix("label."): v for k, v in PHRASES[lang].items() if k.startswith("label.")}


def terminal_line(line: LegendLine, lang: str = "en") -> str:
    """A legend line as the terminal prints it: the head line flush, the others indented under a label column."""
    if line.key == "token":
        return line.text
    if line.key == "obs":
        return "  " + line.text
    name = label(line.key, lang)
    return "  " + name + " " * max(LABEL_WIDTH - _width(name), 1) + line.text


def _width(text: str) -> int:
    """Terminal columns: CJK characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


# ---------------------------------------------------------------- one token


def token_legend(ledger: Ledger, b: int, i: int, lang: str = "en") -> list[LegendLine]:
    """Token i of response b in words, with the numbers of its row (DESIGN §1)."""
    resp = ledger.responses[b]
    row = resp.tokens[i]
    say = _Say(lang, i=i, b=b, token=repr(row.token))
    prefix = _tail(resp, i)
    lines = [
        say("token", "token"),
        say("state", "state.prompt", prompt=repr(_clip(resp.prompt)))
        if i == 0
        else say("state", "state", prompt=repr(_clip(resp.prompt)), prefix=repr(_clip(prefix))),
    ]
    if not row.response_mask:
        return [*lines, say("obs", "obs")]
    action = say.text("action")
    if row.logprobs is not None:
        action += say.text("action.logprob", logprob=fmt(row.logprobs))
    if row.ref_logprobs is not None:
        action += say.text("action.ref_logprob", ref_logprob=fmt(row.ref_logprobs))
    lines.append(LegendLine("action", action))
    sampled = _sampled(row, say)
    if sampled:
        lines.append(LegendLine("sampled", sampled))
    if row.kl is None:
        lines.append(say("reward", "reward", r=fmt(row.token_rewards)))
    else:
        lines.append(
            say(
                "reward",
                "reward.kl",
                score=fmt(row.token_scores),
                beta=num(ledger.beta),
                kl=factor(row.kl),
                r=fmt(row.token_rewards),
            )
        )
    lines += ACCOUNTS.get(ledger.estimator, GENERIC).credit(ledger, resp, i, say)
    return lines


def _sampled(row: TokenRow, say: _Say) -> str:
    """What sampled the token when it was not π_old (glassrl.algos.off_policy): its version and
    staleness, log μ and ρ_i, and algo.off_policy's decision; "" for a token sampled on-policy."""
    parts = []
    if row.policy_version is not None:
        parts.append(say.text("sampled.version", v=row.policy_version, lag=num(row.staleness)))
    if row.rollout_logprobs is not None and row.logprobs is not None:
        log_rho = row.logprobs - row.rollout_logprobs
        rho = math.exp(log_rho) if log_rho < 709 else math.inf  # beyond float64: inf, as torch.exp gives
        parts.append(say.text("sampled.logprob", mu=fmt(row.rollout_logprobs), old=fmt(row.logprobs), rho=fmt(rho)))
    if row.is_keep is not None:
        parts.append(say.text("sampled.weight", w=fmt(row.is_weights)) if row.is_keep else say.text("sampled.dropped"))
    return say.text("sampled.sep").join(parts)


class _Say:
    """Sentences of one token in one language; the token's slots (i, b, token) are filled for every phrase."""

    def __init__(self, lang: str, **slots: object) -> None:
        self.lang, self.slots = lang, slots

    def text(self, key: str, **slots: object) -> str:
        return phrase(key, self.lang, **self.slots, **slots)

    def __call__(self, line: str, key: str, **slots: object) -> LegendLine:
        return LegendLine(line, self.text(key, **slots))


def _tail(resp: ResponseLedger, i: int, n: int = 40) -> str:
    """The text of tokens 0…i−1 as :func:`_clip` shows it (its last ``n`` − 1 characters): only the
    tokens it needs are read, so that the legends of a whole response cost time linear in its length."""
    parts, size, j = [], 0, i
    while j > 0 and size <= n:
        j -= 1
        parts.append(resp.tokens[j].token)
        size += len(parts[-1])
    return "".join(reversed(parts))


def _once(key: object, compute):
    """``compute()`` for ``key`` (a ledger or a response), remembered for the last key asked: the
    legends of a response's tokens are written one after the other, each needing the same value."""
    if _LAST[0] is not key:
        _LAST[:] = [key, compute()]
    return _LAST[1]


_LAST: list = [None, None]


def _next_valid(resp: ResponseLedger, i: int) -> int | None:
    return next((j for j in range(i + 1, resp.length) if resp.tokens[j].response_mask), None)


def _credit_gae(ledger: Ledger, resp: ResponseLedger, i: int, say: _Say) -> list[LegendLine]:
    row, j = resp.tokens[i], _next_valid(resp, i)
    T, gamma = resp.length, num(ledger.gamma)
    future = f"r_{i}" if i == T - 1 else f"r_{i} + γ·r_{i + 1} + …"
    lines = [say("value", "value", v=fmt(row.values), future=future)]
    if j is None:
        lines += [
            say("TD", "TD.end", T=T, r=fmt(row.token_rewards), gamma=gamma, v=fmt(row.values), delta=fmt(row.deltas)),
            say("adv", "adv.end", adv=fmt(row.advantages)),
        ]
    else:
        nxt = resp.tokens[j]
        td = say.text(
            "TD",
            j=j,
            r=fmt(row.token_rewards),
            gamma=gamma,
            v_next=factor(nxt.values),
            v=fmt(row.values),
            delta=fmt(row.deltas),
        )
        if j > i + 1:
            td += say.text("TD.carried", j=j, first=i + 1, last=j - 1)
        lines += [
            LegendLine("TD", td),
            say(
                "adv",
                "adv.gae",
                j=j,
                delta=fmt(row.deltas),
                gamma_lam=num(ledger.gamma * (ledger.lam or 0.0)),
                adv_next=factor(nxt.advantages),
                adv=fmt(row.advantages),
            ),
        ]
    lines.append(say("return", "return.gae", adv=fmt(row.advantages), v=fmt(row.values), ret=fmt(row.returns)))
    return lines + _whitened(row, say)


def _whitened(row: TokenRow, say: _Say) -> list[LegendLine]:
    if row.whitened_advantages is None:
        return []
    return [say("whiten", "whiten", white=fmt(row.whitened_advantages))]


def _credit_broadcast(ledger: Ledger, resp: ResponseLedger, i: int, say: _Say) -> list[LegendLine]:
    row = resp.tokens[i]
    return [
        say("adv", "adv.broadcast", adv=fmt(row.advantages)),
        say("return", "return.no_critic", ret=fmt(row.returns)),
        *_whitened(row, say),
    ]


def _credit_reinforce_pp(ledger: Ledger, resp: ResponseLedger, i: int, say: _Say) -> list[LegendLine]:
    row = resp.tokens[i]
    mean, std = _once(
        ledger, lambda: _stats([t.returns for r in ledger.responses for t in r.tokens if t.response_mask])
    )
    return [
        say("return", "return.reinforce_pp", ret=fmt(row.returns), gamma=num(ledger.gamma)),
        say("adv", "adv.reinforce_pp", ret=fmt(row.returns), mean=fmt(mean), std=fmt(std), adv=fmt(row.advantages)),
        *_whitened(row, say),
    ]


def _credit_process(ledger: Ledger, resp: ResponseLedger, i: int, say: _Say) -> list[LegendLine]:
    row = resp.tokens[i]
    all_ends = _once(resp, lambda: [t.index for t in resp.tokens if t.step_end])
    ends = all_ends[bisect.bisect_left(all_ends, i) :]
    return [
        say("adv", "adv.process", ends=ends, adv=fmt(row.advantages)),
        say("return", "return.no_critic", ret=fmt(row.returns)),
        *_whitened(row, say),
    ]


def _credit_generic(ledger: Ledger, resp: ResponseLedger, i: int, say: _Say) -> list[LegendLine]:
    row = resp.tokens[i]
    return [
        say("adv", "adv.generic", adv=fmt(row.advantages), ret=fmt(row.returns), estimator=ledger.estimator),
        *_whitened(row, say),
    ]


# ---------------------------------------------------------------- turns


def turn_legend(ledger: Ledger, b: int, lang: str = "en") -> list[str]:
    """Response b's turns, two lines each: where the turn's generated and observation tokens lie,
    how it ended, its tool calls (name: status) and the environment's reward parts; then the
    task-level view of its credit, the same numbers as the token rows: Σ r_i, Σ A_i and the mean
    A_i over its generated tokens (an observation token has neither). [] for a single-turn response."""
    resp = ledger.responses[b]
    if not resp.turns:
        return []
    lines = [phrase("heading.turns", lang, b=b)]
    for k, turn in enumerate(resp.turns):
        obs = ""
        if turn.observation_end > turn.end:
            obs = phrase("turn.obs", lang, first=turn.end, last=turn.observation_end - 1)
        calls = ", ".join(f"{c.get('name')}: {c.get('status')}" for c in turn.tool_calls)
        parts = ", ".join(f"{name} {num(value)}" for name, value in turn.reward_parts.items())
        lines.append(
            phrase(
                "turn",
                lang,
                k=k,
                start=turn.start,
                last=turn.end - 1,
                n=turn.end - turn.start,
                obs=obs,
                finish=turn.finish_reason,
                calls=phrase("turn.calls", lang, calls=calls) if calls else "",
                parts=phrase("turn.parts", lang, parts=parts) if parts else "",
            )
        )
        rows = [t for t in resp.tokens[turn.start : turn.end] if t.response_mask]
        rewards = [t.token_rewards for t in rows if t.token_rewards is not None]
        advantages = [t.advantages for t in rows if t.advantages is not None]
        lines.append(
            phrase(
                "turn.credit",
                lang,
                rewards=fmt(sum(rewards) if rewards else None),
                advantages=fmt(sum(advantages) if advantages else None),
                mean=fmt(statistics.fmean(advantages) if advantages else None),
            )
        )
    return lines


# ---------------------------------------------------------------- group baselines


def sequence_score(resp: ResponseLedger) -> float:
    """S = Σ r_i over generated tokens: the score critic-free estimators compare (as verl)."""
    return sum(t.token_rewards for t in resp.tokens if t.response_mask and t.token_rewards is not None)


def baseline_legend(ledger: Ledger, lang: str = "en") -> list[str]:
    """How each response's advantage follows from its group: a line per group, then per response (indented)."""
    account = ACCOUNTS.get(ledger.estimator, GENERIC)
    group_line, response_line = account.group, account.response
    if response_line is None:
        return []
    lines = []
    for gid in dict.fromkeys(r.group_id for r in ledger.responses):
        if group_line is not None:
            lines.append(group_line(ledger, gid, lang))
        indent = "" if group_line is None else "  "
        for b, resp in enumerate(ledger.responses):
            if resp.group_id == gid:
                lines.append(indent + response_line(ledger, b, lang))
    return lines


def _first_advantage(resp: ResponseLedger) -> str:
    return fmt(next((t.advantages for t in resp.tokens if t.response_mask), None))


def _group_scores(ledger: Ledger, gid: int | None) -> list[float]:
    return [sequence_score(r) for r in ledger.responses if r.group_id == gid]


def _group_scores_line(ledger: Ledger, gid: int | None, lang: str) -> str:
    scores = _group_scores(ledger, gid)
    mean, std = _stats(scores)
    return phrase("group.scores", lang, gid=gid, scores=", ".join(fmt(x) for x in scores), mean=fmt(mean), std=fmt(std))


def _response_grpo(ledger: Ledger, b: int, lang: str) -> str:
    resp = ledger.responses[b]
    mean, std = _stats(_group_scores(ledger, resp.group_id))
    return phrase(
        "baseline.grpo",
        lang,
        b=b,
        S=fmt(sequence_score(resp)),
        mean=fmt(mean),
        std=fmt(std),
        adv=_first_advantage(resp),
    )


def _response_dr_grpo(ledger: Ledger, b: int, lang: str) -> str:
    resp = ledger.responses[b]
    mean, _ = _stats(_group_scores(ledger, resp.group_id))
    return phrase(
        "baseline.dr_grpo", lang, b=b, S=fmt(sequence_score(resp)), mean=factor(mean), adv=_first_advantage(resp)
    )


def _response_rloo(ledger: Ledger, b: int, lang: str) -> str:
    resp = ledger.responses[b]
    scores, S = _group_scores(ledger, resp.group_id), sequence_score(resp)
    others = (sum(scores) - S) / (len(scores) - 1)
    return phrase(
        "baseline.rloo",
        lang,
        b=b,
        n=len(scores) - 1,
        others=fmt(others),
        S=fmt(S),
        baseline=factor(others),
        adv=_first_advantage(resp),
    )


def _response_remax(ledger: Ledger, b: int, lang: str) -> str:
    resp = ledger.responses[b]
    return phrase(
        "baseline.remax",
        lang,
        b=b,
        S=fmt(sequence_score(resp)),
        baseline=factor(resp.baseline_reward),
        adv=_first_advantage(resp),
    )


def _response_reinforce_pp_baseline(ledger: Ledger, b: int, lang: str) -> str:
    resp = ledger.responses[b]
    raw = next((t.returns for t in resp.tokens if t.response_mask), None)
    return phrase("baseline.reinforce_pp_baseline", lang, b=b, ret=fmt(raw), adv=_first_advantage(resp))


def _group_steps_line(ledger: Ledger, gid: int | None, lang: str) -> str:
    steps = [t.token_rewards for r in ledger.responses if r.group_id == gid for t in r.tokens if t.step_end]
    mean, std = _stats(steps)
    return phrase("group.steps", lang, gid=gid, n=len(steps), mean=fmt(mean), std=fmt(std))


def _response_process(ledger: Ledger, b: int, lang: str) -> str:
    mine = [t for t in ledger.responses[b].tokens if t.step_end]
    return phrase(
        "baseline.process",
        lang,
        b=b,
        ends=[t.index for t in mine],
        rewards=", ".join(fmt(t.token_rewards) for t in mine),
    )


# ---------------------------------------------------------------- accounts


@dataclass(frozen=True)
class Account:
    """How the legend tells an estimator's credit. ``credit``: a token's lines after its reward
    (value, TD, advantage, return, whitened). ``response``: the line per response under
    "Baselines", how its advantage follows from its baseline (None: no such section), each
    group's responses after ``group``'s line for the group (None: the responses alone)."""

    credit: Callable[[Ledger, ResponseLedger, int, _Say], list[LegendLine]]
    response: Callable[[Ledger, int, str], str] | None = None
    group: Callable[[Ledger, int | None, str], str] | None = None


# Estimator (a name in glassrl.algos.advantages.ADVANTAGE_ESTIMATORS) -> its account.
ACCOUNTS: dict[str, Account] = {
    "gae": Account(_credit_gae),
    "grpo": Account(_credit_broadcast, _response_grpo, _group_scores_line),
    "dr_grpo": Account(_credit_broadcast, _response_dr_grpo, _group_scores_line),
    "grpo_process": Account(_credit_process, _response_process, _group_steps_line),
    "rloo": Account(_credit_broadcast, _response_rloo, _group_scores_line),
    "remax": Account(_credit_broadcast, _response_remax),
    "reinforce_pp": Account(_credit_reinforce_pp),
    "reinforce_pp_baseline": Account(_credit_broadcast, _response_reinforce_pp_baseline, _group_scores_line),
}
GENERIC = Account(_credit_generic)  # an estimator not in ACCOUNTS (a ledger of another version): the numbers


def _stats(xs: list[float]) -> tuple[float, float]:
    """(mean, unbiased std), as the estimators use (torch.std; Bessel's correction)."""
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else float("nan")


def _clip(text: str, n: int = 40) -> str:
    return text if len(text) <= n else "…" + text[-(n - 1) :]
