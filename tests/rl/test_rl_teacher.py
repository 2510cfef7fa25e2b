"""On-policy distillation: the teacher reward source (glassrl.rewards.teacher), its per-token
reward in phase 4, and a run of the trainer with it."""

from __future__ import annotations

import json

import pytest
import torch

from glassrl.algos.token_rewards import teacher_token_rewards
from glassrl.config import load_config
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.models import load_tokenizer, response_logprobs
from glassrl.rewards import build_combined
from glassrl.rewards.base import RewardRequest
from glassrl.rewards.teacher import TeacherSource, find_teacher
from glassrl.rl.config import TrainConfig
from glassrl.rl.loop import Trainer


def test_teacher_token_rewards_by_hand():
    # w = 0.5; log π_T − log π_old = (−1 − (−2), −3 − (−1)) = (1, −2) → (0.5, −1); padding 0 even if NaN
    teacher = torch.tensor([[-1.0, -3.0, float("nan")]])
    student = torch.tensor([[-2.0, -1.0, float("nan")]])
    mask = torch.tensor([[True, True, False]])
    out = teacher_token_rewards(teacher, student, mask, 0.5)
    assert out.tolist() == [[0.5, -1.0, 0.0]]


def test_the_source_scores_0_and_gives_the_teacher_s_log_probs(tiny_model_dir):
    source = TeacherSource(str(tiny_model_dir), batch_size=2, device="cpu")
    request = RewardRequest("p", "r", PromptRecord("p"))
    results = source.score([request, request])
    assert [(r.status, r.score) for r in results] == [("ok", 0.0), ("ok", 0.0)]
    ids = torch.tensor([[0, 5, 6, 7, 8], [4, 5, 6, 7, 0]])  # left-padded prompt, right-padded response
    mask = ids != 0
    mask[0, 0], mask[1, 0] = False, True
    expected, _ = response_logprobs(source.model, ids, mask, 2)
    torch.testing.assert_close(source.token_logprobs(ids, mask, 2), expected)
    combined = build_combined(
        [{"name": "arith_verify"}, {"name": "teacher", "path": str(tiny_model_dir), "weight": 0.3}]
    )
    found, weight = find_teacher(combined)
    assert isinstance(found, TeacherSource) and weight == 0.3
    assert find_teacher(build_combined([{"name": "arith_verify"}])) is None


def test_a_teacher_with_another_tokenizer_is_refused(tiny_model_dir):
    source = TeacherSource(str(tiny_model_dir), device="cpu")
    other = load_tokenizer(tiny_model_dir)
    other.add_tokens(["<new>"])
    with pytest.raises(GlassrlError, match="tokenizer of .* differs from the policy's"):
        source.check_tokenizer(other)


def test_teacher_on_ray_is_refused(fast):
    with pytest.raises(
        GlassrlError, match=r"reward.sources\[0\].name = 'teacher': on-policy distillation is not wired"
    ):
        load_config(TrainConfig, None, [*fast, "trainer.backend=ray", "reward.sources=[{name: teacher, path: x}]"])


def test_distillation_puts_the_teacher_s_reward_on_every_token(tiny_model_dir, fast, tmp_path):
    """Teacher = the student's own start: at step 1 the reward log π_T − log π_old is 0 on every
    token (up to the rounding of different batch shapes); the sum of the per-token rewards is
    what the estimator reads."""
    overrides = [
        *fast,
        "algo.advantage=reinforce_pp",
        "algo.gamma=0.0",
        "algo.kl.placement=none",
        f"reward.sources=[{{name: teacher, path: {tiny_model_dir}, weight: 1.0}}, {{name: arith_verify}}]",
    ]
    trainer = Trainer(load_config(TrainConfig, None, overrides), progress=False)
    assert trainer.teacher is not None and not trainer.old_logprobs_from_update
    seen = []
    real = trainer._update

    def spy(exp, step):
        seen.append(exp)
        return real(exp, step)

    trainer._update = spy
    trainer.train()
    first, second = seen
    mask = first.response_mask
    assert first.teacher_rewards is not None
    assert first.teacher_rewards[mask].abs().max() < 1e-4  # the teacher is the student at step 1
    mask = second.response_mask
    gap = torch.where(mask, second.teacher_logprobs - second.logprobs, 0.0)
    torch.testing.assert_close(second.teacher_rewards, gap)  # w = 1, every valid token
    assert (gap[mask] != 0).float().mean() > 0.5  # after one update the two differ on most tokens
    outcome = torch.where(mask, second.token_scores, 0.0)
    torch.testing.assert_close(second.token_rewards, torch.where(mask, outcome + gap, 0.0))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("teacher/reverse_kl" in r for r in rows if r["step"] > 0)
