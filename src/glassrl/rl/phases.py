"""Phases 2–5 of a training step (DESIGN §2), the one implementation of each:

    exp = score(sampled, tokenizer, ...)                         # 2. scores on tokens, rows that train
    model_outputs(exp, actor, reference, critic, kl_kind)        # 3. log π_old, H, log π_ref, kl, V
    off_policy(exp, version, correction)                         # 3. staleness; weights for what μ sampled
    teacher_outputs(exp, teacher, weight)                        # 3. log π_T (on-policy distillation)
    policy_outputs(exp, logprobs, entropy, kl_kind)              # 3, late: log π_old from the update (on-policy)
    token_rewards(exp, beta, kl_in_reward)                       # 4. r_i = score_i (+ w·(log π_T − log π_old)) − β·kl_i
    advantages(exp, algo)                                        # 5. A, R, δ, whitened A

``Trainer.step`` (glassrl.rl.loop) calls them between generation (phase 1) and the
update (phase 6); ``glassrl explain --model`` (glassrl.rl.explain) calls the
same functions with a checkpoint's models, so the ledger it prints is the trainer's.
Each fills fields of the :class:`~glassrl.rl.experience.Experience`.

Shapes: B responses of the step (prompts × n), T response width, S steps of a response
(process rewards). Token convention: docs/token-convention.md.

Reward failures (a source's ``timeout`` or ``error``): a failed response has no score,
so it takes no part in anything downstream — it is left out of the estimator's inputs
(so out of its group's baseline: a group is compared over its scored members only), and
its ``response_mask`` row is False (it does not train). Under a group estimator a group
left with fewer than 2 scored responses has no baseline and is left out the same way;
under ReMax so is a response whose greedy baseline failed. The metrics count them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from glassrl.algos.advantages import ADVANTAGE_ESTIMATORS, GROUP_ESTIMATORS, REQUIRED_INPUTS, AdvantageParams
from glassrl.algos.kl import kl_penalty
from glassrl.algos.off_policy import correct
from glassrl.algos.shaping import RunningRewardNormalizer, overlong_penalty
from glassrl.algos.token_rewards import place_outcome_scores, place_process_rewards, teacher_token_rewards
from glassrl.data.formatting import prompt_text
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.ledger import compute
from glassrl.ledger.compute import turn_rewards as place_turn_rewards
from glassrl.rewards.base import RewardRequest, RewardResult
from glassrl.rl.config import AlgoConfig
from glassrl.rl.experience import Experience
from glassrl.rollout.base import RolloutBatch, SamplingParams
from glassrl.run.atomic import write_text
from glassrl.workers.base import ActorForward, CriticForward, ReferenceWorker, RewardWorker, RolloutWorker


@dataclass
class Sampled:
    """What phase 1 hands to phase 2: ``rollout`` (B responses, group_index 0..k−1 into
    ``prompts``), the k prompt records and their token ids, and the B reward results."""

    rollout: RolloutBatch
    prompts: list[PromptRecord]
    prompt_ids: list[list[int]]
    results: list[RewardResult]


# ---------------------------------------------------------------- phase 2: score


def score(
    sampled: Sampled,
    tokenizer,
    *,
    estimator: str,
    shapers: Sequence,
    rollout: RolloutWorker,
    reward: RewardWorker,
    max_new_tokens: int,
) -> Experience:
    """Phase 2: the Experience of ``sampled`` with its scores on tokens and the rows that train.

    The reward results' outcome scores go through the score shapers (in order), then onto
    the tokens (:func:`place_scores`). ReMax also needs the greedy response's reward
    (:func:`greedy_baseline`, from ``rollout`` and ``reward``). A row trains when it was
    scored and the estimator can use it (:func:`estimator_rows`).
    """
    batch = sampled.rollout
    records = [sampled.prompts[g] for g in batch.group_index.tolist()]  # the record each response answers
    requests = reward_requests(batch, records, tokenizer)
    raw, scored = outcome_scores(sampled.results, batch.response_mask.device)
    scores = raw
    for shape in shapers:
        scores = shape(scores, scored, batch)
    token_scores, step_end_mask = place_scores(sampled.results, scores, batch, tokenizer)
    baseline_rewards, usable = None, scored
    if "baseline_rewards" in REQUIRED_INPUTS[estimator]:
        baseline_rewards, baseline_ok = greedy_baseline(sampled, tokenizer, rollout, reward, max_new_tokens)
        usable = scored & baseline_ok
    rows = estimator_rows(estimator, usable, batch.group_index)
    return Experience(
        rollout=batch,
        records=records,
        prompts=[r.prompt for r in requests],
        results=list(sampled.results),
        scored=scored,
        raw_scores=raw,
        scores=scores,
        token_scores=token_scores,
        step_end_mask=step_end_mask,
        baseline_rewards=baseline_rewards,
        response_mask=batch.response_mask & rows.unsqueeze(-1),  # (B, T)
    )


def reward_requests(rollout: RolloutBatch, records: Sequence[PromptRecord], tokenizer) -> list[RewardRequest]:
    """One request per response; ``records[b]`` is the row response b answers."""
    return [RewardRequest(prompt_text(tokenizer, r.prompt), text, r) for r, text in zip(records, rollout.texts)]


def check_failure_rate(results: Sequence[RewardResult], step: int, max_rate: float, traceback_file: Path) -> None:
    """GlassrlError naming the step, the count and the distinct failures (the first three, each
    once, with how many share it) when failures exceed ``max_rate``. The first failure with a
    traceback (the user's code raised; its message names the user's file:line) has it written
    to ``traceback_file``, which the line names."""
    failed = [r for r in results if not r.is_ok]
    if len(failed) / len(results) <= max_rate:
        return
    alike = Counter(f"{r.status}: {r.message}" + (f" (at {r.at})" if r.at else "") for r in failed)
    messages = "; ".join(m if n == 1 else f"{m} (×{n})" for m, n in list(alike.items())[:3])
    more = f"; {len(alike) - 3} other failures" if len(alike) > 3 else ""
    traced = next((r for r in failed if r.traceback), None)
    written = ""
    if traced is not None:
        write_text(traceback_file, f"{traced.status}: {traced.message}\n\n{traced.traceback}")
        written = f"; the first traceback: {traceback_file}"
    raise GlassrlError(
        f"step {step}: {len(failed)} of {len(results)} reward scores failed "
        f"({len(failed) / len(results):.0%} > reward.max_failure_rate = {max_rate:g}); first: {messages}{more}{written}"
    )


def outcome_scores(results: Sequence[RewardResult], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores (B,) float32, 0 where failed; scored (B,) bool)."""
    scored = torch.tensor([r.is_ok for r in results], dtype=torch.bool, device=device)
    scores = torch.tensor([r.score if r.is_ok else 0.0 for r in results], dtype=torch.float32, device=device)
    return scores, scored


def greedy_baseline(
    sampled: Sampled, tokenizer, rollout: RolloutWorker, reward: RewardWorker, max_new_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, Algorithm 1): the reward of the greedy response to each prompt,
    per response (B,), and whether it was scored (B,)."""
    params = SamplingParams(max_new_tokens, greedy=True)
    greedy = rollout.generate(sampled.prompt_ids, n=1, params=params, records=sampled.prompts)
    results = reward.score(reward_requests(greedy, sampled.prompts, tokenizer))
    scores, ok = outcome_scores(results, sampled.rollout.response_mask.device)
    placed = turn_rewards(greedy, scores.dtype)  # the environment's rewards count in S as in the sampled ones'
    if placed is not None:
        scores = scores + placed[0].sum(-1).to(scores.device)
    index = sampled.rollout.group_index
    return scores[index], ok[index]


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
    generated token and carrying its score. A reward judges the final answer
    (``texts[b]``): in a multi-turn response, its character offsets fall in the last turn.

    Multi-turn responses also carry the environment's rewards (``Turn.reward_parts``, e.g.
    tool-add's valid_call): :func:`turn_rewards` adds them on their turns' tokens.
    """
    mask = rollout.response_mask
    B, T = mask.shape
    if not any(r.is_ok and r.process_rewards for r in results):
        token_scores, step_end = place_outcome_scores(scores, mask), None
    else:
        positions = torch.arange(T, device=mask.device).expand(B, T)  # (B, T)
        last = torch.where(mask, positions, -1).amax(dim=-1)  # (B,) last generated token; observations may follow
        S = max(max(len(r.process_rewards) for r in results), 1)
        ends = torch.zeros((B, S), dtype=torch.long)
        rewards = torch.zeros((B, S), dtype=scores.dtype)
        valid = torch.zeros((B, S), dtype=torch.bool)
        for b, result in enumerate(results):
            first, stop = answer_span(rollout, b)
            if result.is_ok and result.process_rewards and stop > first:
                ids = rollout.response_ids[b, first:stop].tolist()
                offsets = [end for end, _ in result.process_rewards]
                steps_at = [first + k for k in step_end_tokens(tokenizer, ids, rollout.texts[b], offsets)]
                steps = [reward for _, reward in result.process_rewards]
            else:
                steps_at, steps = [int(last[b])], [float(scores[b])]
            n = len(steps_at)
            ends[b, :n], rewards[b, :n], valid[b, :n] = torch.tensor(steps_at), torch.tensor(steps), True
        token_scores = place_process_rewards(rewards, ends, valid, T).to(scores.device)
        step_end = torch.zeros((B, T), dtype=torch.bool).scatter(1, ends, valid).to(mask.device)  # (B, T)
    placed = turn_rewards(rollout, scores.dtype)
    if placed is not None:
        token_scores = token_scores + placed[0].to(token_scores.device)
        if step_end is not None:  # grpo_process reads rewards at step ends: a turn's reward is one more step
            step_end = step_end | placed[1].to(step_end.device)
    return token_scores, step_end


def answer_span(rollout: RolloutBatch, b: int) -> tuple[int, int]:
    """[start, end) of response b's final answer in response positions: the last turn's generated
    tokens (empty when it is not an answer: a call cut off or refused), or the whole single-turn
    response; the tokens ``texts[b]`` was decoded from."""
    if rollout.turns is None:
        return 0, int(rollout.response_mask[b].sum())
    last = rollout.turns[b][-1]
    return (last.start, last.end) if rollout.texts[b] else (last.start, last.start)


def without_turn_rewards(rollout: RolloutBatch) -> RolloutBatch:
    """``rollout`` with the environment's turn rewards taken away (reward.control: a control run pays the
    control's score alone; a tool-add call that ran earns nothing there). The rollout is changed in place
    (its ``turns`` replaced) and returned, so that the ledger, which re-places turn rewards, agrees."""
    if rollout.turns is not None:
        rollout.turns = [tuple(replace(t, reward_parts={}) for t in turns) for turns in rollout.turns]
    return rollout


def turn_rewards(rollout: RolloutBatch, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rewards (B, T), where (B, T) bool) of a multi-turn batch's environment rewards: each turn's
    reward parts, summed, on the turn's last generated token (glassrl.ledger.compute.turn_rewards);
    None when no turn has any.

    On the turn, not on the answer: under GAE the reward of a turn (tool-add's valid_call for a
    call that ran) is credited to the tokens that earned it and those before, not to the final
    answer written after it (with γλ < 1 the difference shows); group estimators read the sum
    S = Σ_i r_i, which counts it wherever it sits. Rewards are added to ``token_scores``, outside
    the score shapers (normalisation, clipping), which act on the reward sources' outcome score.
    """
    if rollout.turns is None or not any(t.reward_parts for turns in rollout.turns for t in turns):
        return None
    rewards, where = place_turn_rewards(rollout.turns, rollout.response_mask.shape[1], dtype)
    device = rollout.response_mask.device
    return rewards.to(device), where.to(device)


def estimator_rows(estimator: str, scored: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """(B,) bool: responses the estimator sees — scored ones, and for group estimators
    only those whose group keeps at least 2 scored members."""
    if estimator not in GROUP_ESTIMATORS:
        return scored
    _, inverse = torch.unique(group_index, return_inverse=True)
    members = torch.zeros(int(inverse.max()) + 1, dtype=torch.long, device=scored.device)
    members = members.index_add(0, inverse, scored.long())  # (G,) scored members per group
    return scored & (members[inverse] >= 2)


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
        try:
            self.normalizer.load_state_dict(parts["reward_normalizer"])
        except ValueError as err:  # algos' rule: ValueError inside, one line at the boundary
            raise GlassrlError(f"checkpoint part reward_normalizer: {err}") from None


class InitNormShaper:
    """Scores normalised with a mean and std fixed once, on the first batch it sees: the scored
    responses of the first step, sampled by the initial (SFT) policy. Ziegler et al. 2019, §2:
    the reward model is normalised "to have mean 0 and variance 1" on samples of the initial
    policy ρ, so that β has the same meaning whatever the reward model's scale
    (lm-human-preferences, train_reward.py ``normalize_after``); InstructGPT (Ouyang et al. 2022,
    §3.5) fixes the bias alone. (s − μ₀)/σ₀ with σ₀ the unbiased std; σ₀ = 0 or a single score
    fixes the offset only (scale 1). Checkpointed, so a resumed run and ``glassrl explain
    --model`` use the same μ₀, σ₀."""

    part_names = ("reward_init_norm",)

    def __init__(self) -> None:
        self.mean: float | None = None
        self.std: float | None = None

    def __call__(self, scores: torch.Tensor, scored: torch.Tensor, rollout: RolloutBatch) -> torch.Tensor:
        if self.mean is None:
            first = scores[scored].double()
            if first.numel() == 0:
                return scores  # nothing scored yet: fix the statistics on a later batch
            self.mean = first.mean().item()
            self.std = first.std().item() if first.numel() > 1 else 0.0
        scale = self.std if self.std else 1.0
        return (scores - self.mean) / scale

    def state_dict(self) -> dict:
        return {"reward_init_norm": ("json", {"mean": self.mean, "std": self.std})}

    def load_state_dict(self, parts: dict) -> None:
        self.mean, self.std = parts["reward_init_norm"]["mean"], parts["reward_init_norm"]["std"]


class NoEosShaper:
    """The score of a response that never stopped (finish reason "length": no EOS within
    rollout.max_new_tokens) is replaced by ``value``: Ziegler et al. 2019's code
    (lm-human-preferences, train_policy.py ``penalize``: ``where(valid, rewards,
    penalty_reward_value)``, −1 on a reward model normalised to mean 0, variance 1; Huang et
    al. 2022, "The N Implementation Details of RLHF with PPO"). A reward model reads a cut-off
    text at its last token as it reads a finished one, so without this a policy may learn to
    ramble. TRL's ``missing_eos_penalty`` subtracts instead; the replacement is the original."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self, scores: torch.Tensor, scored: torch.Tensor, rollout: RolloutBatch) -> torch.Tensor:
        cut = torch.tensor([r == "length" for r in rollout.finish_reasons], device=scores.device)  # (B,)
        return torch.where(cut & scored, torch.full_like(scores, self.value), scores)


class ClipShaper:
    """Scores clipped to [−c, c], after normalisation: Zheng et al. 2023 ("Secrets of RLHF in
    Large Language Models Part I: PPO", §5.3.1, reward normalisation and clipping); DeepSpeed-Chat
    clamps the reward model's score at ±5 (dschat/rlhf/ppo_trainer.py ``compute_rewards``,
    ``clip_reward_value``). Bounds what one exploited, out-of-distribution score can do."""

    def __init__(self, clip: float) -> None:
        self.clip = clip

    def __call__(self, scores: torch.Tensor, scored: torch.Tensor, rollout: RolloutBatch) -> torch.Tensor:
        return scores.clamp(-self.clip, self.clip)


# Score shapers, applied in this order to the outcome scores of phase 2:
# name -> (is it on for this AlgoConfig?, build it). Each is a callable
# (scores (B,), scored (B,) bool, rollout) -> scores (B,). Normalise first, then the
# no-EOS score (its value is in normalised units, as Ziegler et al.'s −1), clip last.
SCORE_SHAPERS = {
    "overlong": (
        lambda a: a.overlong is not None,
        lambda a: OverlongShaper(a.overlong.max_length, a.overlong.cache_length),
    ),
    "reward_norm": (lambda a: a.reward_norm, lambda a: NormShaper()),
    "reward_init_norm": (lambda a: a.reward_init_norm, lambda a: InitNormShaper()),
    "no_eos_score": (lambda a: a.no_eos_score is not None, lambda a: NoEosShaper(a.no_eos_score)),
    "score_clip": (lambda a: a.score_clip is not None, lambda a: ClipShaper(a.score_clip)),
}


def score_shapers(algo: AlgoConfig) -> list:
    """The score shapers ``algo`` turns on, fresh (a checkpoint restores their state)."""
    return [make(algo) for on, make in SCORE_SHAPERS.values() if on(algo)]


# ---------------------------------------------------------------- phase 3: model outputs


def model_batch(exp: Experience) -> dict[str, torch.Tensor]:
    """The tensors every forward pass reads (glassrl.workers.base): ids, attention, the training mask."""
    r = exp.rollout
    return {"input_ids": r.input_ids, "attention_mask": r.attention_mask, "response_mask": exp.response_mask}


def model_outputs(
    exp: Experience,
    actor: ActorForward | None,
    reference: ReferenceWorker | None,
    critic: CriticForward | None,
    kl_kind: str,
) -> None:
    """Phase 3: log π_old(a_i|s_i) and H(π_old(·|s_i)); with a reference log π_ref and the
    per-token KL estimate ``kl_kind``; with a critic V(s_i). All (B, T), no gradient.

    ``actor`` None: log π_old, H and the KL come later, from the update's own forward pass
    (:func:`policy_outputs`), when the batch makes one optimiser step (π_old = π_θ: Trainer.step)."""
    batch = model_batch(exp)
    if reference is not None:
        exp.ref_logprobs = reference.compute_logprobs(batch)
    if actor is not None:
        policy_outputs(exp, *actor.compute_logprobs(batch), kl_kind)
    if critic is not None:
        exp.values = critic.compute_values(batch)


def policy_outputs(exp: Experience, logprobs: torch.Tensor, entropy: torch.Tensor, kl_kind: str) -> None:
    """log π_old(a_i|s_i), H(π_old(·|s_i)) (B, T) and, with a reference, kl_i = the ``kl_kind``
    estimate between log π_old and log π_ref (B, T)."""
    exp.logprobs, exp.entropy = logprobs, entropy
    if exp.ref_logprobs is not None:
        exp.kl = kl_penalty(exp.logprobs, exp.ref_logprobs, kl_kind)


def off_policy(exp: Experience, version: int | None, correction: tuple[str, dict[str, float]] | None) -> None:
    """Phase 3, last: where the behaviour policy μ that sampled (log μ: ``rollout.rollout_logprobs``) is
    not π_old. ``version``: the actor updates so far, when the engine recorded each token's version
    (asynchronous training): staleness_i = version − the version that sampled a_i, on generated tokens.

    ``correction`` (name, knobs) of glassrl.algos.off_policy.OFF_POLICY: each token's weight and
    keep decision from ρ_i = π_old(a_i|s_i)/μ(a_i|s_i), π_old being phase 3's pass with the current
    weights (the decoupled objective: Hilton et al. 2022, §3). Without one, a batch sampled by older
    weights trains as PPO from the policy that sampled it (Schulman et al. 2017: π_old is the policy
    that collected the data; ``rollout.overlap`` does the same): ``bypass``, the clip anchored at μ."""
    rollout, mask = exp.rollout, exp.response_mask
    if version is not None and rollout.policy_versions is not None:
        versions = rollout.policy_versions.to(mask.device)
        exp.staleness = torch.where(rollout.response_mask, version - versions, 0)  # (B, T)
    if correction is None:  # a batch that brings the sampling weights' own log-probs has them as log π_old already
        exp.bypass = exp.staleness is not None and rollout.behaviour_logprobs is None
        return
    if rollout.rollout_logprobs is None:
        raise GlassrlError(f"algo.off_policy {correction[0]}: the rollout engine kept no log-probs of its samples")
    try:
        exp.correction = correct(
            correction[0], exp.logprobs, rollout.rollout_logprobs.to(mask.device), mask, correction[1]
        )
    except ValueError as err:  # algos' rule: ValueError inside, one line at the boundary
        raise GlassrlError(f"algo.off_policy: {err}") from None


def teacher_outputs(exp: Experience, teacher, weight: float) -> None:
    """Phase 3 with a teacher source (glassrl.rewards.teacher): log π_T(a_i|s_i) (B, T) of the
    sampled tokens, no gradient, and its weight w, for the per-token reward of phase 4."""
    r = exp.rollout
    exp.teacher_logprobs = teacher.token_logprobs(r.input_ids, r.attention_mask, r.response_mask.shape[1])
    exp.teacher_weight = weight


# ---------------------------------------------------------------- phase 4: token rewards


def token_rewards(exp: Experience, beta: float, kl_in_reward: bool) -> None:
    """Phase 4: r_i = token_scores_i − β·kl_i on training tokens, 0 elsewhere (B, T)
    (glassrl.ledger.compute.token_rewards, which ``glassrl explain`` runs on given numbers too);
    with a teacher, plus w·(log π_T − log π_old) on every one of them (glassrl.rewards.teacher).

    ``beta`` is the step's KL coefficient (the controller's value); it enters the
    rewards only when ``kl_in_reward`` (otherwise the KL is a loss term, or absent).
    """
    exp.beta = beta if exp.ref_logprobs is not None else 0.0
    exp.kl_in_reward = kl_in_reward
    exp.token_rewards = compute.token_rewards(exp.token_scores, exp.kl, exp.reward_beta, exp.response_mask)
    if exp.teacher_logprobs is not None:  # on-policy distillation: a reward on every token
        exp.teacher_rewards = teacher_token_rewards(
            exp.teacher_logprobs, exp.logprobs, exp.response_mask, exp.teacher_weight
        )
        exp.token_rewards = exp.token_rewards + exp.teacher_rewards


# ---------------------------------------------------------------- phase 5: advantages


def advantage_params(algo: AlgoConfig) -> AdvantageParams:
    """The parameters of ``algo.advantage``: the algo.* knobs its registry entry reads (γ, λ,
    VAPO's critic λ and length-adaptive α for gae), the others at their defaults."""
    knobs = ADVANTAGE_ESTIMATORS[algo.advantage].knobs
    return AdvantageParams(**{knob: getattr(algo, knob) for knob in knobs})


def advantages(exp: Experience, algo: AlgoConfig) -> None:
    """Phase 5: exp.advantages, returns (B, T) from the token rewards by ``algo.advantage``;
    deltas δ_i (with a critic); whitened_advantages when ``algo.whiten_advantages``
    (glassrl.ledger.compute.credit, which ``glassrl explain`` runs on given numbers too).

    The estimator runs on the rows that train only; other rows get 0 and are already
    out of ``exp.response_mask``. Whitening (PPO; verl masked_whiten: unbiased variance
    over every valid token of the step) needs 2 valid tokens.
    """
    estimator = algo.advantage
    optional = {
        "values": exp.values,
        "group_index": exp.rollout.group_index,
        "baseline_rewards": exp.baseline_rewards,
        "step_end_mask": exp.step_end_mask,
    }
    missing = [name for name in REQUIRED_INPUTS[estimator] if optional[name] is None]
    if missing:
        raise GlassrlError(
            f"algo.advantage = {estimator} needs {missing[0]}"
            + (
                "; the reward gives no process rewards (e.g. arith_verify with process_rewards: true)"
                if missing[0] == "step_end_mask"
                else ""
            )
        )
    out = compute.credit(
        estimator,
        exp.token_rewards,
        exp.response_mask,
        advantage_params(algo),
        whiten=algo.whiten_advantages,
        **optional,
    )
    exp.advantages, exp.returns = out.advantages, out.returns
    exp.deltas, exp.whitened_advantages = out.deltas, out.whitened_advantages
    if algo.mask_truncated:
        mask_truncated(exp)


def mask_truncated(exp: Experience) -> None:
    """TRL's mask_truncated_completions: a response cut at the length limit (finish reason
    "length") leaves the loss, as a row that does not train (its mask False, its A, R, δ 0), after
    the estimator has counted its score in its group's mean and std as TRL does."""
    cut = torch.tensor([r == "length" for r in exp.rollout.finish_reasons], device=exp.response_mask.device)  # (B,)
    keep = ~cut.unsqueeze(-1)  # (B, 1)
    exp.response_mask = exp.response_mask & keep
    for name in ("advantages", "returns", "deltas", "whitened_advantages"):
        value = getattr(exp, name)
        if value is not None:
            setattr(exp, name, torch.where(keep, value, 0.0))
