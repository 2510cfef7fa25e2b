"""Several reward sources with weights: score = Σ_k w_k · s_k, each source reported on its own.

Each response's combined result keeps every source's own result in
``details["sources"]`` (label -> :class:`RewardResult`), the weights in
``details["weights"]`` (label -> w_k), and every score in a flat, plain form for metrics in
``details["scores"]``: label -> s_k, and for a source that reports criteria (a rubric)
``"<label>/<criterion>"`` -> s_i, each a float, or None where that part failed::

    {"exact_match": 1.0, "rubric": 1.5, "rubric/accuracy": 1.0, "rubric/format": 1.0}

so a step can log ``reward/<label>/…`` and ``reward/rubric/<criterion>/…`` from one dict.
Process rewards combine the same way as scores: each source's step rewards are
weighted by its w_k, and steps ending at the same character offset are summed.

If any source failed for a response (timeout or error), the combined result is
that failure, its message naming the source: a weighted sum that quietly left a
component out would be a different reward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardRequest, RewardResult, RewardSource


class CombinedReward:
    """``[(source, weight), ...]`` -> one result per response; labels are the sources' names,
    or the ``labels`` given (None: the name), so that metrics read ``reward/accuracy/mean``.

    A name used twice gets a suffix (``user_function``, ``user_function:2``) so
    that every component keeps its own label; a label given twice is an error.
    """

    name = "combined"

    def __init__(
        self, sources: Sequence[tuple[RewardSource, float]], labels: Sequence[str | None] | None = None
    ) -> None:
        if not sources:
            raise GlassrlError("combined reward: no sources given")
        labelled: list[tuple[str, RewardSource, float]] = []
        seen: dict[str, int] = {}
        given = list(labels) if labels is not None else [None] * len(sources)
        for (source, weight), own in zip(sources, given, strict=True):
            if not isinstance(source, RewardSource):
                raise GlassrlError(f"combined reward: {source!r} is not a reward source (needs .name and .score)")
            if not math.isfinite(weight):
                raise GlassrlError(
                    f"combined reward: source {source.name!r} has weight {weight!r}, expected a finite number"
                )
            if own is not None:
                if not isinstance(own, str) or not own or "/" in own or own in {label for label, _, _ in labelled}:
                    raise GlassrlError(
                        f"combined reward: label {own!r} of source {source.name!r}: a label is a unique "
                        "non-empty name without '/' (it is the metric's reward/<label>/mean)"
                    )
                labelled.append((own, source, float(weight)))
                continue
            seen[source.name] = seen.get(source.name, 0) + 1
            label = source.name if seen[source.name] == 1 else f"{source.name}:{seen[source.name]}"
            labelled.append((label, source, float(weight)))
        taken = [label for label, _, _ in labelled]
        if len(set(taken)) != len(taken):
            clash = next(label for label in taken if taken.count(label) > 1)
            raise GlassrlError(f"combined reward: two sources are labelled {clash!r}; give one another label")
        self.sources = tuple(labelled)

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        per_source = [source.score(requests) for _, source, _ in self.sources]
        for (label, _, _), results in zip(self.sources, per_source):
            if len(results) != len(requests):
                # A broken source is a programming error, not a bad response.
                raise RuntimeError(
                    f"reward source {label!r} returned {len(results)} results for {len(requests)} requests"
                )
        combined = []
        for j in range(len(requests)):
            own = {label: per_source[k][j] for k, (label, _, _) in enumerate(self.sources)}
            details = {
                "sources": own,
                "weights": {label: w for label, _, w in self.sources},
                "scores": _plain_scores(own),
            }
            failed = next((label for label, result in own.items() if not result.is_ok), None)
            if failed is not None:
                message = f"{failed}: {own[failed].message}"
                if own[failed].status == "timeout":
                    combined.append(RewardResult.timeout(message, details))
                else:
                    combined.append(RewardResult.error(message, details, own[failed].traceback, own[failed].at))
                continue
            total = sum(w * own[label].score for label, _, w in self.sources)  # Σ_k w_k · s_k
            steps: dict[int, float] = {}
            for label, _, w in self.sources:
                for end, reward in own[label].process_rewards:
                    steps[end] = steps.get(end, 0.0) + w * reward
            combined.append(RewardResult.ok(total, sorted(steps.items()), details))
        return combined


def _plain_scores(own: dict[str, RewardResult]) -> dict[str, float | None]:
    """label -> score, and "<label>/<criterion>" -> criterion score for sources with criteria."""
    scores: dict[str, float | None] = {}
    for label, result in own.items():
        scores[label] = result.score
        criteria = result.details.get("criteria")
        if isinstance(criteria, dict):
            for criterion, score in criteria.items():
                scores[f"{label}/{criterion}"] = score
    return scores
