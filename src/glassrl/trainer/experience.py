"""The experience of one step (every tensor of DESIGN §1) and the phases that fill it.

Shapes: B responses of the step (prompts × n), T response width, S steps of a
response (process rewards). Token convention: docs/token-convention.md.

Reward failures (a source's ``timeout`` or ``error``): a failed response has no
score, so it takes no part in anything downstream — it is left out of the
estimator's inputs (so out of its group's baseline: a group is compared over its
scored members only), and its ``response_mask`` row is False (it does not train).
Under a group estimator a group left with fewer than 2 scored responses has no
baseline and is left out the same way. The metrics count both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from glassrl.algos.advantages import (
    GROUP_ESTIMATORS,
    REQUIRED_INPUTS,
    AdvantageInputs,
    AdvantageParams,
    compute_advantages,
    td_errors,
)
from glassrl.algos.masked import masked_whiten
from glassrl.algos.shaping import RunningRewardNormalizer, overlong_penalty
from glassrl.algos.token_rewards import assemble_token_rewards, place_outcome_scores, place_process_rewards
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardRequest, RewardResult
from glassrl.rollout.base import RolloutBatch


@dataclass
class Experience:
    """Everything computed for the B responses of one step.

    rollout: the sampled batch (ids, masks, finish reasons, texts, group_index).
    records: B dataset rows, the one each response answers.
    results: B reward results (ok / timeout / error).
    scored (B,) bool: the reward result is ok.
    scores (B,) float: outcome score after shaping (the one placed on tokens; 0 where not scored).
    response_mask (B, T) bool: generated tokens that train — False on whole rows
        of failed or baseline-less responses.
    logprobs, entropy (B, T): log π_old(a_i|s_i), H(π_old(·|s_i)).
    ref_logprobs, kl (B, T) or None: log π_ref(a_i|s_i), kl_i (when a reference is used).
    values, deltas (B, T) or None: V(s_i), δ_i (with a critic).
    token_scores (B, T); step_end_mask (B, T) bool or None (process rewards).
    token_rewards (B, T): r_i = token_scores_i − β·kl_i (β = 0 unless KL is in the reward).
    baseline_rewards (B,) or None: ReMax's greedy-response reward.
    advantages, returns (B, T): raw estimator outputs.
    whitened_advantages (B, T) or None: what the policy loss sees when whitening is on.
    beta: β used in the token rewards.
    raw_scores (B,) or None: the combined reward's score before shaping (0 where not scored).
    """

    rollout: RolloutBatch
    records: list[PromptRecord]
    results: list[RewardResult]
    scored: torch.Tensor
    scores: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    values: torch.Tensor | None = None
    token_scores: torch.Tensor | None = None
    step_end_mask: torch.Tensor | None = None
    token_rewards: torch.Tensor | None = None
    baseline_rewards: torch.Tensor | None = None
    deltas: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    whitened_advantages: torch.Tensor | None = None
    beta: float = 0.0
    raw_scores: torch.Tensor | None = None

    @property
    def policy_advantages(self) -> torch.Tensor:
        """The advantages the policy loss sees: whitened when whitening is on, else raw."""
        return self.advantages if self.whitened_advantages is None else self.whitened_advantages


def prompt_text(tokenizer, prompt) -> str:
    """The prompt as the policy saw it: plain text as is, chat messages rendered by the template."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)


def reward_requests(rollout: RolloutBatch, records: Sequence[PromptRecord], tokenizer) -> list[RewardRequest]:
    """One request per response; ``records[b]`` is the row response b answers."""
    return [RewardRequest(prompt_text(tokenizer, r.prompt), text, r) for r, text in zip(records, rollout.texts)]


def check_failure_rate(results: Sequence[RewardResult], step: int, max_rate: float) -> None:
    """GlassrlError naming the step, the count and the first messages when failures exceed ``max_rate``."""
    failed = [r for r in results if not r.is_ok]
    if len(failed) / len(results) > max_rate:
        messages = "; ".join(f"{r.status}: {r.message}" for r in failed[:3])
        raise GlassrlError(
            f"step {step}: {len(failed)} of {len(results)} reward scores failed "
            f"({len(failed) / len(results):.0%} > reward.max_failure_rate = {max_rate:g}); first: {messages}"
        )


def outcome_scores(results: Sequence[RewardResult], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores (B,) float32, 0 where failed; scored (B,) bool)."""
    scored = torch.tensor([r.is_ok for r in results], dtype=torch.bool, device=device)
    scores = torch.tensor([r.score if r.is_ok else 0.0 for r in results], dtype=torch.float32, device=device)
    return scores, scored


def step_end_tokens(tokenizer, token_ids: list[int], text: str, ends: Sequence[int]) -> list[int]:
    """Token index holding character ``end − 1`` of ``text`` for each character offset ``end``.

    Rewards give step ends as character offsets (glassrl.rewards.base); the token
    that completes ``text[:end]`` is the first k whose decoded prefix
    ``decode(token_ids[:k+1])`` starts with ``text[:end]`` (decoding prefixes, so it
    works for any tokenizer, byte-level BPE splitting a character included).
    ``token_ids`` are the response's valid tokens; ``ends`` are increasing.
    """
    positions, k = [], 0
    for end in ends:
        target = text[:end]
        while k < len(token_ids) - 1 and not tokenizer.decode(token_ids[: k + 1], skip_special_tokens=True).startswith(
            target
        ):
            k += 1
        positions.append(k)
    return positions


def place_scores(
    results: Sequence[RewardResult], scores: torch.Tensor, rollout: RolloutBatch, tokenizer
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(token_scores (B, T), step_end_mask (B, T) or None).

    Without process rewards: each outcome score on its row's last generated token
    (EOS when the response stopped; glassrl.algos.token_rewards.place_outcome_scores).
    When any result carries process rewards, they replace the outcome score on the
    tokens (DeepSeekMath process supervision, Shao et al. 2024, §4.1.3): step rewards
    sit on their step-end tokens; a row without steps is one step ending at its last
    generated token and carrying its score.
    """
    mask = rollout.response_mask
    if not any(r.is_ok and r.process_rewards for r in results):
        return place_outcome_scores(scores, mask), None
    B, T = mask.shape
    last = mask.long().sum(-1) - 1  # (B,) responses are contiguous from 0
    S = max(max(len(r.process_rewards) for r in results), 1)
    ends = torch.zeros((B, S), dtype=torch.long)
    rewards = torch.zeros((B, S), dtype=scores.dtype)
    valid = torch.zeros((B, S), dtype=torch.bool)
    for b, result in enumerate(results):
        if result.is_ok and result.process_rewards:
            ids = rollout.response_ids[b][mask[b]].tolist()
            offsets = [end for end, _ in result.process_rewards]
            positions = step_end_tokens(tokenizer, ids, rollout.texts[b], offsets)
            steps = [reward for _, reward in result.process_rewards]
        else:
            positions, steps = [int(last[b])], [float(scores[b])]
        n = len(positions)
        ends[b, :n], rewards[b, :n], valid[b, :n] = torch.tensor(positions), torch.tensor(steps), True
    token_scores = place_process_rewards(rewards, ends, valid, T).to(scores.device)
    step_end = torch.zeros((B, T), dtype=torch.bool).scatter(1, ends, valid).to(mask.device)  # (B, T)
    return token_scores, step_end


class OverlongShaper:
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13) added to the score."""

    def __init__(self, max_length: int, cache_length: int) -> None:
        self.max_length, self.cache_length = max_length, cache_length

    def __call__(self, scores: torch.Tensor, scored: torch.Tensor, rollout: RolloutBatch) -> torch.Tensor:
        penalty = overlong_penalty(rollout.lengths, self.max_length, self.cache_length)  # (B,)
        return scores + penalty.to(scores)


class NormShaper:
    """Scores normalised by the running mean and std of every score seen so far
    (glassrl.algos.shaping.RunningRewardNormalizer); the statistics are checkpointed."""

    part_names = ("reward_normalizer",)

    def __init__(self) -> None:
        self.normalizer = RunningRewardNormalizer()

    def __call__(self, scores: torch.Tensor, scored: torch.Tensor, rollout: RolloutBatch) -> torch.Tensor:
        self.normalizer.update(scores[scored])
        return self.normalizer.normalize(scores)

    def state_dict(self) -> dict:
        return {"reward_normalizer": ("torch", self.normalizer.state_dict())}

    def load_state_dict(self, parts: dict) -> None:
        self.normalizer.load_state_dict(parts["reward_normalizer"])


# Score shapers, applied in this order to the outcome scores of phase 2:
# name -> (is it on for this AlgoConfig?, build it). Each is a callable
# (scores (B,), scored (B,) bool, rollout) -> scores (B,).
SCORE_SHAPERS = {
    "overlong": (
        lambda a: a.overlong is not None,
        lambda a: OverlongShaper(a.overlong.max_length, a.overlong.cache_length),
    ),
    "reward_norm": (lambda a: a.reward_norm, lambda a: NormShaper()),
}


def token_rewards(token_scores: torch.Tensor, kl: torch.Tensor | None, beta: float, mask: torch.Tensor) -> torch.Tensor:
    """r_i = token_scores_i − β·kl_i on training tokens, 0 elsewhere (B, T)."""
    kl = torch.zeros_like(token_scores) if kl is None else kl
    return assemble_token_rewards(token_scores, kl, beta, mask)


def estimator_rows(estimator: str, scored: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """(B,) bool: responses the estimator sees — scored ones, and for group estimators
    only those whose group keeps at least 2 scored members."""
    if estimator not in GROUP_ESTIMATORS:
        return scored
    _, inverse = torch.unique(group_index, return_inverse=True)
    members = torch.zeros(int(inverse.max()) + 1, dtype=torch.long, device=scored.device)
    members = members.index_add(0, inverse, scored.long())  # (G,) scored members per group
    return scored & (members[inverse] >= 2)


def estimate_advantages(exp: Experience, estimator: str, params: AdvantageParams, whiten: bool, gamma: float) -> None:
    """Fill exp.advantages, returns, deltas and whitened_advantages from exp.token_rewards.

    The estimator runs on the rows of ``estimator_rows`` only; other rows get 0 and
    are already out of ``exp.response_mask``. Whitening (PPO; verl masked_whiten:
    unbiased variance over every valid token of the step) needs 2 valid tokens.
    """
    rows = exp.response_mask.any(-1).nonzero().flatten()  # (K,)
    optional = {
        "values": exp.values,
        "group_index": exp.rollout.group_index,
        "baseline_rewards": exp.baseline_rewards,
        "step_end_mask": exp.step_end_mask,
    }
    needed = REQUIRED_INPUTS[estimator]
    missing = [name for name in needed if optional[name] is None]
    if missing:
        raise GlassrlError(
            f"algo.advantage = {estimator} needs {missing[0]}"
            + (
                "; the reward gives no process rewards (e.g. arith_verify with process_rewards: true)"
                if missing[0] == "step_end_mask"
                else ""
            )
        )
    advantages = torch.zeros_like(exp.token_rewards)
    returns = torch.zeros_like(exp.token_rewards)
    if len(rows):
        inputs = AdvantageInputs(
            token_rewards=exp.token_rewards[rows],
            response_mask=exp.response_mask[rows],
            **{name: optional[name][rows] for name in needed},
        )
        out = compute_advantages(estimator, inputs, params)
        advantages = advantages.index_copy(0, rows, out.advantages)
        returns = returns.index_copy(0, rows, out.returns)
    exp.advantages, exp.returns = advantages, returns
    if exp.values is not None:
        exp.deltas = td_errors(exp.token_rewards, exp.values, exp.response_mask, gamma)
    if whiten and int(exp.response_mask.sum()) >= 2:
        exp.whitened_advantages = masked_whiten(advantages, exp.response_mask)
