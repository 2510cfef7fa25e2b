"""Evaluation on the test prompts: k responses to each, judged correct or not, scored by the run's reward.

k = ``logging.eval_k``. With k = 1 the response is the greedy one; with k > 1 the k responses
are sampled at the rollout's temperature, top_p and top_k. Sampling draws from the rollout's
generator, which is put back where it was afterwards: a run with evaluations samples its
training responses exactly as the same run without them.

When a response is correct (one rule; docs/metrics.md and docs/data.md state it too):

- a record of a bundled task (``metadata["task"]`` in TASK_VERIFIERS) is judged by the task's
  verifier, correct when it scores 1.0: the verdict of ``task/accuracy``, so ``eval/accuracy``
  on the bundled tasks is what it has always been;
- any other record by the configured reward sources (``reward.sources``): when a source gives a
  verdict of its own (``details["correct"]``, as a verifier can), the response is correct when
  every source that gives one says so; when none does, when the combined reward reaches
  ``logging.eval_threshold`` (default 1.0: a 0/1 rule's full marks). A failed score (timeout or
  error) is never correct.

The training metric ``task/accuracy`` uses the same rule (:func:`correct`), with one exception:
a response that nothing can judge (no bundled task, no reference answer, no source verdict: a
reward model's or a majority vote's score on an unlabelled prompt) is not counted, rather than
judged by the threshold.

Metrics (docs/metrics.md, ``eval/``): ``eval/accuracy`` is mean@k, the mean over prompts of
c_i / k (c_i correct responses of prompt i); ``eval/pass_at_<j>`` for j = 1, 2, 4, … < k and
j = k, the unbiased estimator of Chen et al. 2021 (:func:`pass_at_k`); the configured reward's
mean over every response, in all and per source (``eval/reward/mean``,
``eval/reward/<source>/mean``) and per rubric criterion (``eval/reward/<source>/<criterion>/mean``,
a 0/1 criterion's pass rate), and its failure rate; ``eval/accuracy/<value>`` per value of the
metadata field ``logging.eval_group_by`` (a dotted path reaches nested fields).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

from glassrl.agents.metrics import tool_use
from glassrl.data.datasets import MissingField, lookup
from glassrl.data.records import PromptRecord
from glassrl.rewards.base import RewardRequest, RewardResult
from glassrl.rewards.tasks import TASK_VERIFIERS
from glassrl.rl.metrics import criterion_means
from glassrl.rl.phases import reward_requests
from glassrl.rollout.base import SamplingParams
from glassrl.workers.base import RewardWorker, RolloutWorker


def evaluate(
    records: Sequence[PromptRecord],
    prompt_ids: Callable[[Sequence[PromptRecord]], list[list[int]]],
    *,
    rollout: RolloutWorker,
    reward: RewardWorker,
    tokenizer,
    params: SamplingParams,
    k: int,
    threshold: float,
    group_by: str | None,
    chunk: int,
    samples: list[dict] | None = None,
) -> dict[str, float]:
    """eval/… of ``records`` (module docstring): ``k`` responses per prompt, generated ``chunk``
    responses at a time with ``params`` (greedy for k = 1), each judged and scored; with
    ``samples``, each response appended to it as a row (:func:`sample_row`)."""
    saved = {name: value for name, (_, value) in rollout.state_dict().items()}
    flags: list[list[bool]] = []
    results: list[list[RewardResult]] = []
    per_call = max(1, chunk // k)
    used: list[tuple[bool, bool]] = []  # multi-turn: (called a tool, a call ran) per response
    try:
        for start in range(0, len(records), per_call):
            batch = list(records[start : start + per_call])
            out = rollout.generate(prompt_ids(batch), n=k, params=params, records=batch)
            requests = reward_requests(out, [batch[g] for g in out.group_index.tolist()], tokenizer)
            scored = reward.score(requests)
            judged = verdicts(requests, scored, threshold)
            used += [tool_use(turns) for turns in out.turns or ()]
            if samples is not None:
                first = len(flags)  # the index of this chunk's first prompt
                samples += [
                    sample_row(first + i // k, i % k, req, res, ok, reason)
                    for i, (req, res, ok, reason) in enumerate(zip(requests, scored, judged, out.finish_reasons))
                ]
            for i in range(len(batch)):  # the k responses of a prompt are adjacent
                flags.append(judged[i * k : (i + 1) * k])
                results.append(scored[i * k : (i + 1) * k])
    finally:
        rollout.load_state_dict(saved)  # evaluation leaves the training samples as they were
    metrics = summarize(records, flags, results, group_by)
    if used:
        metrics["eval/tool/call_rate"] = sum(called for called, _ in used) / len(used)
        metrics["eval/tool/valid_call_rate"] = sum(valid for _, valid in used) / len(used)
    return metrics


def sample_row(
    prompt_index: int, sample: int, request: RewardRequest, result: RewardResult, correct: bool, finish_reason: str
) -> dict:
    """One evaluated response as a JSON-ready row: the prompt as the policy saw it, the response,
    its verdict and reward (each source's too), the record's answer, source and metadata."""
    sources = result.details.get("sources", {})
    return {
        "prompt_index": prompt_index,
        "sample": sample,
        "source": request.record.source,
        "prompt": request.prompt,
        "response": request.response,
        "finish_reason": finish_reason,
        "correct": correct,
        "reward": result.score,
        "status": result.status,
        "message": result.message or None,
        "rewards": {label: own.score for label, own in sources.items()},
        "answer": request.record.answer,
        "metadata": request.record.metadata,
    }


def verdicts(requests: Sequence[RewardRequest], results: Sequence[RewardResult], threshold: float) -> list[bool]:
    """Per response: correct or not (the rule of the module docstring)."""
    out = []
    for request, result in zip(requests, results):
        verifier = TASK_VERIFIERS.get(request.record.metadata.get("task"))
        if verifier is not None:
            own = verifier.score([request])[0]
            out.append(own.is_ok and own.score == 1.0)
        else:
            out.append(reward_verdict(result, threshold))
    return out


def correct(requests: Sequence[RewardRequest], results: Sequence[RewardResult], threshold: float) -> list[bool | None]:
    """Per response, the verdict of ``task/accuracy``: :func:`verdicts`, or None where nothing can
    judge it (module docstring: no bundled task, no reference answer, no source verdict)."""
    out: list[bool | None] = []
    for request, result, verdict in zip(requests, results, verdicts(requests, results, threshold), strict=True):
        record = request.record
        judged = record.metadata.get("task") in TASK_VERIFIERS or record.answer is not None or source_verdicts(result)
        out.append(verdict if judged else None)
    return out


def source_verdicts(result: RewardResult) -> list[bool]:
    """The verdicts the reward's sources give of their own (``details["correct"]``), and the combined result's."""
    sources = result.details.get("sources", {})
    given = [own.details["correct"] for own in sources.values() if isinstance(own.details.get("correct"), bool)]
    if isinstance(result.details.get("correct"), bool):
        given.append(result.details["correct"])
    return given


def reward_verdict(result: RewardResult, threshold: float) -> bool:
    """Whether the configured reward calls a response correct: every source verdict
    (``details["correct"]``) is True when any source gives one, else score >= ``threshold``."""
    if not result.is_ok:
        return False
    given = source_verdicts(result)
    return all(given) if given else result.score >= threshold


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from n samples of which c are correct (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code", eq. 1): 1 − C(n−c, k) / C(n, k), computed
    as 1 − Π_{j=n−c+1}^{n} (1 − k/j), the numerically stable form of their Figure 3."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / j for j in range(n - c + 1, n + 1))


def pass_ks(k: int) -> list[int]:
    """The j of the logged pass@j: powers of two below k, then k; none when k = 1 (pass@1 is eval/accuracy)."""
    if k == 1:
        return []
    return [2**p for p in range(k.bit_length()) if 2**p < k] + [k]


def summarize(
    records: Sequence[PromptRecord],
    flags: Sequence[Sequence[bool]],
    results: Sequence[Sequence[RewardResult]],
    group_by: str | None,
) -> dict[str, float]:
    """eval/… from the verdicts and reward results of each prompt's k responses (module docstring)."""
    k = len(flags[0]) if flags else 1
    metrics = {"eval/accuracy": _mean([sum(f) / len(f) for f in flags])}  # mean@k
    for j in pass_ks(k):
        metrics[f"eval/pass_at_{j}"] = _mean([pass_at_k(len(f), sum(f), j) for f in flags])
    flat = [r for row in results for r in row]
    metrics["eval/reward/mean"] = _mean([r.score for r in flat if r.is_ok])
    per_source: dict[str, list[float]] = {}
    for result in flat:
        for label, own in result.details.get("sources", {}).items():
            if own.is_ok:
                per_source.setdefault(label, []).append(own.score)
    metrics.update({f"eval/reward/{label}/mean": _mean(scores) for label, scores in per_source.items()})
    metrics.update({f"eval/reward/{key}/mean": value for key, value in criterion_means(flat).items()})
    metrics["eval/reward/failure_rate"] = sum(not r.is_ok for r in flat) / len(flat) if flat else math.nan
    if group_by is not None:
        groups: dict[str, list[float]] = {}
        for record, f in zip(records, flags):
            try:
                value = lookup(record.metadata, group_by)
            except MissingField:
                continue  # counted in eval/accuracy only
            groups.setdefault(metric_segment(value), []).append(sum(f) / len(f))
        metrics.update({f"eval/accuracy/{value}": _mean(group) for value, group in sorted(groups.items())})
    return metrics


def metric_segment(value) -> str:
    """A metadata value as one segment of a metric key: lower case, runs of other characters → "_"."""
    return re.sub(r"[^a-z0-9_-]+", "_", str(value).lower()).strip("_") or "_"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan
