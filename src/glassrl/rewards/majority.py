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

An extractor named by a spec (``"module:function"`` or ``"path/to/file.py:function"``, relative
to ``base_dir``) is user code from a config: like a user-function reward, it is imported and run
in an isolated worker (:mod:`glassrl.worker_pool`), one call per batch within ``timeout_s``;
only the answers' text comes back. A callable given directly runs in-process (code you wrote).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardRequest, RewardResult
from glassrl.rewards.user_function import load_callable, load_in_worker, preload, resolve_spec
from glassrl.rewards.verifiers import extract_last_number
from glassrl.worker_pool import default_pool, describe_error

AnswerExtractor = Callable[[str], "str | None"]


class MajorityVoteSource:
    """1.0 when a response's answer equals its group's majority answer, else 0.0.

    extract_answer: ``response -> answer or None``, or a spec naming one (module docstring);
                    default: the last number of the response
    group_key:      metadata key that names a response's group
    timeout_s:      for a spec'd extractor: one batch's extraction
    base_dir:       what a spec's relative file path is read from (the trainer passes the config's directory)
    """

    name = "majority_vote"

    def __init__(
        self,
        extract_answer: AnswerExtractor | str | None = None,
        group_key: str = "group_id",
        timeout_s: float = 10.0,
        base_dir: str = ".",
    ) -> None:
        if not timeout_s > 0:
            raise GlassrlError(f"majority_vote: timeout_s must be > 0, got {timeout_s!r}")
        self.spec: str | None = None
        if isinstance(extract_answer, str):
            self.spec = resolve_spec(extract_answer, base_dir, "extract_answer")
            load_in_worker(default_pool(), self.spec, f"extract_answer {extract_answer!r}", 60.0)
            extract_answer = None
        self.extract_answer: AnswerExtractor = extract_answer or extract_last_number
        self.group_key = group_key
        self.timeout_s = float(timeout_s)

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        # torch loads on the first vote, so that importing
        # glassrl.rewards stays torch-free (worker_pool.py's user-function worker imports it)
        import torch

        from glassrl.algos.shaping import majority_vote

        if not requests:
            return []
        answers, failures = self._answers([r.response for r in requests])
        groups: dict[Hashable, int] = {}
        for request in requests:
            groups.setdefault(self._group(request), len(groups))
        group_index = torch.tensor([groups[self._group(r)] for r in requests], dtype=torch.long)  # (B,)
        labels, rewards = majority_vote(answers, group_index)
        results = []
        for j, reward in enumerate(rewards.tolist()):
            if failures[j] is not None:
                results.append(failures[j])
                continue
            results.append(RewardResult.ok(reward, details={"answer": answers[j], "pseudo_label": labels[j]}))
        return results

    def _group(self, request: RewardRequest) -> tuple[str, Any]:
        metadata = request.record.metadata
        if self.group_key in metadata:
            return ("group", metadata[self.group_key])
        return ("prompt", request.prompt)

    def _answers(self, responses: list[str]) -> tuple[list[str | None], list[RewardResult | None]]:
        """Each response's answer (None: states none) and, where extraction failed, its failure."""
        if self.spec is None:
            answers: list[str | None] = []
            failures: list[RewardResult | None] = []
            for response in responses:
                try:
                    answer = self.extract_answer(response)
                except Exception as err:  # noqa: BLE001 - one response's failure is its error result
                    failures.append(RewardResult.error(f"extract_answer raised {type(err).__name__}: {err}"))
                    answer = None
                else:
                    failures.append(None)
                answers.append(None if answer is None else str(answer))
            return answers, failures
        outcome = default_pool().call(
            _extract_all, (self.spec, responses), self.timeout_s, setup=(preload, (self.spec,))
        )
        if outcome.status != "ok":
            make = RewardResult.timeout if outcome.status == "timeout" else RewardResult.error
            return [None] * len(responses), [make(f"extract_answer {self.spec}: {outcome.message}")] * len(responses)
        answers = [answer for answer, _ in outcome.value]
        failures = [None if message is None else RewardResult.error(message) for _, message in outcome.value]
        return answers, failures


def _extract_all(spec: str, responses: list[str]) -> list[tuple[str | None, str | None]]:
    """Runs in the worker: (answer text or None, error message or None) per response."""
    extract = load_callable(spec)
    out: list[tuple[str | None, str | None]] = []
    for response in responses:
        try:
            answer = extract(response)
            out.append((None if answer is None else str(answer), None))
        except Exception as err:  # noqa: BLE001 - one response's failure is its error result
            out.append((None, f"extract_answer raised {describe_error(err)}"))
    return out
