"""The legend's sentences, in every language: data, not logic (glassrl.ledger.legend decides which apply).

``PHRASES[lang]`` holds every sentence with named slots (``{i}``, ``{adv}``, …). A language is a new
table with the same keys and slots (tests check both); :func:`phrase` fills one.
"""

from __future__ import annotations

LANGUAGES = ("en", "zh")

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
