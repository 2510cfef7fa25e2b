"""Scores and credit of multi-turn responses, hand-computed: where the outcome score, the process
rewards and the environment's rewards sit, and GAE across an observation (DESIGN §1)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from glassrl.data.records import PromptRecord
from glassrl.rewards.base import RewardResult
from glassrl.rl import phases
from glassrl.rl.config import AlgoConfig
from glassrl.rollout.base import RolloutBatch, Turn

F64 = torch.float64
CALL = {"name": "calculator", "arguments": {"expression": "1+2"}, "status": "ok", "seconds": 0.0}


def _rollout(roles: list[list[int]], turns: list[tuple[Turn, ...]], texts: list[str]) -> RolloutBatch:
    r = torch.tensor(roles, dtype=torch.int8)
    B, T = r.shape
    return RolloutBatch(
        prompt_ids=torch.ones(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.bool),
        response_ids=torch.arange(B * T).view(B, T),
        response_mask=r == 1,
        group_index=torch.zeros(B, dtype=torch.long),
        finish_reasons=[t[-1].finish_reason for t in turns],
        texts=texts,
        response_context_mask=r != 0,
        turns=turns,
    )


def _score(rollout: RolloutBatch, results: list[RewardResult], estimator: str = "gae", tokenizer=None):
    record = PromptRecord("p", None, {}, "test")
    sampled = phases.Sampled(rollout, [record], [[1]], results)
    return phases.score(
        sampled, tokenizer, estimator=estimator, shapers=[], rollout=None, reward=None, max_new_tokens=8
    )


# One response: turn 0 = tokens 0, 1 (a call), observation 2, 3; turn 1 = token 4 (the answer).
ROLES = [[1, 1, 2, 2, 1, 0]]
TURNS = [(Turn(0, 2, 4, "tool_call", "", "", (CALL,), {"valid_call": 0.1}), Turn(4, 5, 5, "stop", "3"))]


def test_gae_across_an_observation_hand_table():
    # r = [0, 0.1 (valid_call), obs, obs, 1.0 (the outcome score)], V = [0.2, 0.4, 7, 7, 0.8]; the
    # 7s on the observation are never read. γ = 0.9, λ = 0.5, no KL in the reward:
    #   δ_4 = 1.0 − 0.8 = 0.2                         A_4 = 0.2
    #   δ_1 = 0.1 + 0.9·V(s_4) − 0.4 = 0.42           A_1 = 0.42 + 0.45·0.2 = 0.51
    #   δ_0 = 0 + 0.9·0.4 − 0.2 = 0.16                A_0 = 0.16 + 0.45·0.51 = 0.3895
    # R = A + V = [0.5895, 0.91, —, —, 1.0]: the call token bootstraps from the token after the result.
    exp = _score(_rollout(ROLES, TURNS, ["3"]), [RewardResult.ok(1.0)])
    torch.testing.assert_close(exp.token_scores, torch.tensor([[0.0, 0.1, 0.0, 0.0, 1.0, 0.0]]))
    exp.values = torch.tensor([[0.2, 0.4, 7.0, 7.0, 0.8, 5.0]], dtype=F64)
    exp.token_scores = exp.token_scores.to(F64)
    phases.token_rewards(exp, 0.0, kl_in_reward=False)
    phases.advantages(exp, AlgoConfig(advantage="gae", gamma=0.9, lam=0.5))
    torch.testing.assert_close(exp.deltas, torch.tensor([[0.16, 0.42, 0, 0, 0.2, 0]], dtype=F64))
    torch.testing.assert_close(exp.advantages, torch.tensor([[0.3895, 0.51, 0, 0, 0.2, 0]], dtype=F64))
    torch.testing.assert_close(exp.returns, torch.tensor([[0.5895, 0.91, 0, 0, 1.0, 0]], dtype=F64))


def test_grpo_scores_count_the_environments_reward():
    # Two responses to one prompt: the first called (valid_call 0.1) and answered right (1), the
    # second answered wrong without a call. S = Σ r_i = [1.1, 0]; GRPO: A = ±(1.1 − 0.55)/std, std
    # of [1.1, 0] = 0.7778 (unbiased), so A = ±0.7071 on every generated token.
    roles = [[1, 1, 2, 2, 1, 0], [1, 0, 0, 0, 0, 0]]
    turns = [TURNS[0], (Turn(0, 1, 1, "stop", "4"),)]
    exp = _score(_rollout(roles, turns, ["3", "4"]), [RewardResult.ok(1.0), RewardResult.ok(0.0)], "grpo")
    phases.token_rewards(exp, 0.0, kl_in_reward=False)
    phases.advantages(exp, AlgoConfig(advantage="grpo"))
    a = 0.55 / (0.55 * 2**0.5 + 1e-6)
    torch.testing.assert_close(exp.advantages[0], torch.tensor([a, a, 0, 0, a, 0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(exp.advantages[1], torch.tensor([-a, 0, 0, 0, 0, 0]), atol=1e-5, rtol=0)


def test_process_rewards_map_onto_the_final_turn():
    # The reward judges texts[b] = "ab", the final turn's text (tokens 4, 5). Response 0's step
    # ends at characters 1 and 2 fall on tokens 4 and 5, not on the first generated tokens of the
    # response; response 1 has no process rewards: one step, its score 0.5, on its last generated
    # token, 5 (the observation 6 after it takes no reward).
    roles = [[1, 1, 2, 2, 1, 1, 2]] * 2
    turns = [(Turn(0, 2, 4, "tool_call", "", "", (CALL,), {"valid_call": 0.1}), Turn(4, 6, 7, "length", "ab"))] * 2
    letters = {4: "a", 5: "b", 11: "a", 12: "b"}
    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens=False: "".join(letters.get(i, "?") for i in ids))
    results = [RewardResult.ok(1.0, process_rewards=[(1, 0.3), (2, 0.7)]), RewardResult.ok(0.5)]
    exp = _score(_rollout(roles, turns, ["ab", "ab"]), results, "grpo_process", tokenizer)
    torch.testing.assert_close(
        exp.token_scores, torch.tensor([[0.0, 0.1, 0.0, 0.0, 0.3, 0.7, 0.0], [0.0, 0.1, 0.0, 0.0, 0.0, 0.5, 0.0]])
    )
    # each turn's reward is one more step for grpo_process, which reads rewards at step ends
    assert exp.step_end_mask.tolist() == [[False, True, False, False, True, True, False]] + [
        [False, True, False, False, False, True, False]
    ]


def test_remax_baseline_counts_the_greedy_responses_environment_rewards():
    # The greedy response called (valid_call 0.1) and answered right (1): baseline 1.1, as S of a
    # sampled response that did the same.
    greedy = _rollout(ROLES, TURNS, ["3"])
    rollout = SimpleNamespace(generate=lambda prompts, n, params, records: greedy)
    reward = SimpleNamespace(score=lambda requests: [RewardResult.ok(1.0)])
    sampled = phases.Sampled(_rollout(ROLES * 2, TURNS * 2, ["3", "3"]), [PromptRecord("p", None, {}, "t")], [[1]], [])
    baseline, ok = phases.greedy_baseline(sampled, None, rollout, reward, 8)
    torch.testing.assert_close(baseline, torch.tensor([1.1, 1.1]))
    assert ok.tolist() == [True, True]


def test_task_accuracy_of_the_agentic_tasks():
    from glassrl.data.tasks import load_task
    from glassrl.rewards.base import RewardRequest, RewardResult
    from glassrl.rl.evaluation import correct

    add = load_task("tool-add", "test", size=1)[0]
    research = load_task("research", "test", size=1)[0]
    requests = [
        RewardRequest(add.prompt, str(add.metadata["sum"]), add),
        RewardRequest(add.prompt, str(add.metadata["sum"] + 1), add),
        RewardRequest(research.prompt, research.answer, research),  # the reference report: 2.5 of 2.5
        RewardRequest(research.prompt, "Google Cloud made $5 trillion in 2025.", research),
    ]
    zero = [RewardResult.ok(0.0)] * 4  # the configured reward has no say on a bundled task
    assert correct(requests, zero, 1.0) == [True, False, True, False]
