"""Rule verifiers for the bundled tasks: exact match, numeric answer, arith-verify.

The bundled tasks (glassrl.data.tasks) own their formats and, for arith-verify, the rule that
judges a response (:func:`glassrl.data.tasks.arith_verify.grade`); the sources here turn those
judgements into scores. Text is compared after NFKC normalisation (glassrl.data.answers), so a
verifier does not care which punctuation width the model picked.

A record without the reference a verifier needs is an ``error`` result (a data
problem), never a 0. A response that states no answer is a wrong answer: 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from glassrl.data.answers import extract_last_number, normalize_text
from glassrl.data.tasks import arith_verify
from glassrl.rewards.base import RewardRequest, RewardResult


class ExactMatchVerifier:
    """1.0 when the normalised response equals the normalised reference answer, else 0.0."""

    name = "exact_match"

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        results = []
        for request in requests:
            answer = request.record.answer
            if answer is None:
                results.append(RewardResult.error(f"{request.record.source}: no reference answer to match"))
                continue
            results.append(RewardResult.ok(float(normalize_text(request.response) == normalize_text(answer))))
        return results


class NumericVerifier:
    """1.0 when the last number in the response equals the reference number, else 0.0.

    The reference is ``metadata["sum"]`` (the bundled tasks) or else the last number
    of the reference answer.
    """

    name = "numeric"

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        results = []
        for request in requests:
            record = request.record
            if "sum" in record.metadata:
                reference: str | None = str(record.metadata["sum"])
            else:
                reference = extract_last_number(record.answer) if record.answer is not None else None
            if reference is None:
                message = f"{record.source}: no reference number (metadata 'sum' or a number in the answer)"
                results.append(RewardResult.error(message))
                continue
            stated = extract_last_number(request.response)
            right = stated is not None and math.isclose(float(stated), float(reference), rel_tol=1e-9, abs_tol=1e-9)
            results.append(RewardResult.ok(float(right), details={"stated": stated, "reference": reference}))
        return results


class ArithVerifyVerifier:
    """The arith-verify task, judged by :func:`glassrl.data.tasks.arith_verify.grade`: the verdict
    (yes/no) and the stated sum must both be right, and the answer must be in the question's language
    (``metadata["lang"]``, when given):
    是的/不是 answer a Chinese question, Yes/No an English one. "是的，等于7！" to
    "Is 3+4=7?" is right arithmetic in the wrong language and scores 0 (the language
    consistency of DeepSeek-R1, Guo et al. 2025, §2.3.3, as a hard requirement).

    Score: 1.0 when both are right; with ``partial_credit`` 0.5 when only the verdict
    is right; else 0.0.

    With ``process_rewards`` the response is two steps, which gives the GRPO
    process-reward estimator (Shao et al. 2024, DeepSeekMath, §4.1.3) real step ends:
    step 1 is the verdict, up to and including the first comma (``"，"`` or ``","``),
    rewarded 1.0 when the verdict is right; step 2 is the rest, ending at the end of
    the response, rewarded 1.0 when the stated sum is right. A response without a
    comma (or with nothing after it) is one step carrying the outcome score.
    """

    name = "arith_verify"

    def __init__(self, partial_credit: bool = False, process_rewards: bool = False) -> None:
        self.partial_credit = partial_credit
        self.process_rewards = process_rewards

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        return [self._one(request) for request in requests]

    def _one(self, request: RewardRequest) -> RewardResult:
        metadata = request.record.metadata
        missing = [key for key in ("is_true", "sum") if key not in metadata]
        if missing:
            return RewardResult.error(f"{request.record.source}: arith_verify needs metadata {missing[0]!r}")
        response = request.response
        g = arith_verify.grade(response, metadata)
        verdict_ok, sum_ok = g.verdict_ok, g.sum_ok
        if verdict_ok and sum_ok:
            score = 1.0
        elif verdict_ok and self.partial_credit:
            score = 0.5
        else:
            score = 0.0
        steps: list[tuple[int, float]] = []
        if self.process_rewards:
            if 0 <= g.comma < len(response) - 1:
                steps = [(g.comma + 1, float(verdict_ok)), (len(response), float(sum_ok))]
            elif response:
                steps = [(len(response), score)]
        details = {
            "verdict": g.verdict,
            "language": g.language,
            "stated": g.stated,
            "verdict_ok": verdict_ok,
            "sum_ok": sum_ok,
        }
        return RewardResult.ok(score, steps, details)
