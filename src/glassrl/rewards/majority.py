"""Majority vote as the reward, with no labels: TTRL (Zuo et al. 2025, TTRL, §2).

The responses to one prompt form a group. Each response's final answer is
extracted; the most frequent answer of the group is the pseudo-label; a response
scores 1.0 when its answer equals the pseudo-label, else 0.0. The vote itself is
:func:`glassrl.algos.shaping.majority_vote`.

Groups: requests whose records share ``metadata[group_key]`` form a group;
requests without that key are grouped by identical prompt text. A response with
no extractable answer does not vote and scores 0.0 (it states no answer, so it
cannot agree with the majority). An extractor that raises gives that response an
``error`` result; it does not vote.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from glassrl.rewards.base import RewardRequest, RewardResult
from glassrl.rewards.user_function import import_spec
from glassrl.rewards.verifiers import extract_last_number

AnswerExtractor = Callable[[str], "str | None"]


class MajorityVoteSource:
    """1.0 when a response's answer equals its group's majority answer, else 0.0.

    extract_answer: ``response -> answer or None``, or a ``"module:function"`` naming
                    one; default: the last number of the response
    group_key:      metadata key that names a response's group
    """

    name = "majority_vote"

    def __init__(self, extract_answer: AnswerExtractor | str | None = None, group_key: str = "group_id") -> None:
        if isinstance(extract_answer, str):
            extract_answer = import_spec(extract_answer, "extract_answer")
        self.extract_answer: AnswerExtractor = extract_answer or extract_last_number
        self.group_key = group_key

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        # torch loads on the first vote, so that importing
        # glassrl.rewards stays torch-free (rewards/timeout.py's user-function worker imports it)
        import torch

        from glassrl.algos.shaping import majority_vote

        if not requests:
            return []
        answers: list[str | None] = []
        failures: dict[int, str] = {}
        for j, request in enumerate(requests):
            try:
                answer = self.extract_answer(request.response)
            except Exception as err:  # noqa: BLE001 - one response's failure is its error result
                failures[j] = f"extract_answer raised {type(err).__name__}: {err}"
                answer = None
            answers.append(None if answer is None else str(answer))
        groups: dict[Hashable, int] = {}
        for request in requests:
            groups.setdefault(self._group(request), len(groups))
        group_index = torch.tensor([groups[self._group(r)] for r in requests], dtype=torch.long)  # (B,)
        labels, rewards = majority_vote(answers, group_index)
        results = []
        for j, reward in enumerate(rewards.tolist()):
            if j in failures:
                results.append(RewardResult.error(failures[j]))
                continue
            results.append(RewardResult.ok(reward, details={"answer": answers[j], "pseudo_label": labels[j]}))
        return results

    def _group(self, request: RewardRequest) -> tuple[str, Any]:
        metadata = request.record.metadata
        if self.group_key in metadata:
            return ("group", metadata[self.group_key])
        return ("prompt", request.prompt)
