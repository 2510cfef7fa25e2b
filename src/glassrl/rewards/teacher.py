"""A teacher model as a reward source: on-policy distillation, a reward on every token.

On the student's own samples, token i of a response earns

    r_i^T = w · (log π_T(a_i|s_i) − log π_θ(a_i|s_i))

the negative reverse KL between student and teacher at the sampled token: GKD (Agarwal et al.
2024, "On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes", eq. 4
with λ = 1, every sequence the student's own, and D the reverse KL) in the one-sample estimate
that Thinking Machines' "On-Policy Distillation" (Lu et al. 2025) trains on as a per-token reward
(GKD sums the divergence over the vocabulary instead). Unlike an outcome score it is dense: every
token learns where the teacher would have gone, not only whether the answer was right.

The teacher is frozen like the reference policy and reads the student's tokens: it must share
the student's tokenizer (checked when the run is built). log π_θ is the trainer's log π_old
(phase 3), so the reward is put on the tokens in phase 4 (glassrl.rl.phases.token_rewards), beside
β·kl_i; this source's :meth:`score` only marks the responses as scored, with an outcome score of 0
(nothing extra on the last token). With other sources (a task's verifier) the combined reward is
theirs plus this per-token part: ``reward.sources: [{name: teacher, path: ..., weight: 1.0},
{name: arith_verify}]``. ``weight`` is w. The ledger shows log π_T per token.

torch and transformers load when the source is built, so that importing glassrl.rewards stays
torch-free (as glassrl.rewards.reward_model).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardRequest, RewardResult

DETAIL = "per-token reward w·(log π_T − log π_θ) on every token, added in phase 4; outcome score 0"


class TeacherSource:
    """The teacher policy loaded from ``path`` (a causal LM checkpoint; ``dtype``, ``device`` as
    glassrl.models.load_causal_lm); ``batch_size`` responses per forward pass."""

    name = "teacher"

    def __init__(self, path: str, batch_size: int = 16, dtype: str = "auto", device: str = "auto") -> None:
        from glassrl.models import load_causal_lm, load_tokenizer, resolve_model_path

        if batch_size < 1:
            raise GlassrlError(f"teacher: batch_size must be >= 1, got {batch_size}")
        checkpoint = resolve_model_path(path, "teacher path")
        self.path = str(checkpoint)
        self.model = load_causal_lm(checkpoint, dtype=dtype, device=device).eval().requires_grad_(False)
        self.tokenizer = load_tokenizer(checkpoint)
        self.batch_size = batch_size

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        return [RewardResult.ok(0.0, details={"teacher": DETAIL}) for _ in requests]

    def token_logprobs(self, input_ids: Any, attention_mask: Any, response_len: int) -> Any:
        """log π_T(a_i|s_i) (B, T) of the response tokens of ``input_ids`` (B, P+T) in the batch
        layout (glassrl.data.collate), at temperature 1, without gradient, float32 on the input's device."""
        import torch

        from glassrl.models import response_logprobs

        device = next(self.model.parameters()).device
        chunks = []
        with torch.no_grad():
            for start in range(0, input_ids.shape[0], self.batch_size):
                ids = input_ids[start : start + self.batch_size].to(device)
                mask = attention_mask[start : start + self.batch_size].to(device)
                chunks.append(response_logprobs(self.model, ids, mask, response_len)[0])
        return torch.cat(chunks).to(input_ids.device)

    def check_tokenizer(self, tokenizer) -> None:
        """The student's tokenizer must be the teacher's: the teacher scores the student's token ids."""
        if tokenizer.get_vocab() != self.tokenizer.get_vocab():
            raise GlassrlError(
                f"reward source teacher: the tokenizer of {self.path} differs from the policy's; "
                "on-policy distillation reads the student's token ids, so they must share one"
            )


def find_teacher(reward: Any) -> tuple[TeacherSource, float] | None:
    """The (teacher, weight w) among a combined reward's sources (glassrl.rewards.combine), or None;
    GlassrlError when there are several (one per-token reward is what the ledger shows)."""
    found = [(s, w) for _, s, w in getattr(reward, "sources", ()) if isinstance(s, TeacherSource)]
    if len(found) > 1:
        raise GlassrlError("reward.sources: more than one teacher; give one")
    return found[0] if found else None
