"""Cutting a mini-batch into micro-batches: a count of responses, or a token budget.

``batch.max_tokens_per_micro_batch`` (issue 40):

    parts = micro_batches(index, row_tokens(batch["attention_mask"]), rows=8, max_tokens=4096)

A count of responses (``rows``) holds the memory of a forward/backward pass only when every response
is as long as the longest; with lengths from 20 to 2,000 tokens the same count is 100× apart in work.
With ``max_tokens`` a micro-batch takes rows (at most ``rows`` of them) while their real tokens
(prompt + response, the attention mask's ones: what a padding-free forward computes, model.padding_free)
stay within the budget; the rows are first sorted longest first (stable), so a micro-batch holds rows of
similar lengths and its padding is small on the padded path too — "sorted packing" as in verl's
``use_dynamic_bsz`` (verl/utils/seqlen_balancing.py) and NeMo-RL's dynamic batching, greedy here.
Under the budget each micro-batch also drops the prompt padding its rows all share (:func:`trim_left`).
A row longer than the budget alone gets a micro-batch of its own (and one line says so, once per
process: the budget is then not an upper bound of that pass).

How the micro-batches are cut never changes the gradient: glassrl.rl.update weights each micro-batch's
aggregate by its share of the mini-batch's units (tokens or rows), so the accumulated gradient is the
whole mini-batch's for every cut (tests/rl/test_rl_token_budget.py).
"""

from __future__ import annotations

import sys

import torch

_SAID: set[str] = set()  # lines already printed by this process


def row_tokens(attention_mask: torch.Tensor) -> torch.Tensor:
    """Real tokens per row (B,): prompt and response, padding excluded."""
    return attention_mask.long().sum(-1)


def micro_batches(
    index: torch.Tensor, tokens: torch.Tensor, *, rows: int, max_tokens: int | None, keep_order: bool = False
) -> list[torch.Tensor]:
    """``index`` (N,) rows of a mini-batch -> its micro-batches (index tensors whose union is ``index``).

    ``tokens`` (B,) real tokens of every row of the batch (:func:`row_tokens`). ``max_tokens`` None:
    ``index`` cut in order into pieces of ``rows``. Otherwise greedy under the budget, longest rows first,
    or in ``index``'s own order with ``keep_order`` (model.shared_prefix: rows grouped by prompt stay
    grouped), each piece at most ``rows`` rows."""
    if max_tokens is None or len(index) == 0:
        return list(index.split(rows))
    lengths = tokens[index.to(tokens.device)].cpu()  # (N,)
    if not keep_order:
        order = lengths.argsort(descending=True, stable=True)
        index, lengths = index[order.to(index.device)], lengths[order]
    parts, start, used = [], 0, 0
    for i, n in enumerate(lengths.tolist()):
        if i > start and (used + n > max_tokens or i - start == rows):
            parts.append(index[start:i])
            start, used = i, 0
        used += n
        if n > max_tokens:
            _say_once(
                f"batch.max_tokens_per_micro_batch = {max_tokens}: a response of {n} tokens (prompt included) is "
                "longer than the budget and runs as a micro-batch of its own"
            )
    parts.append(index[start:])
    return parts


def trim_left(micro: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``micro`` without the leading columns that are padding in every row (left-padded prompts):
    ``input_ids`` and ``attention_mask`` (B, P+T) lose them, the response-wide tensors (B, T) keep their
    width. Position ids come from the mask (glassrl.models.logprobs), so the forward is the same, on fewer
    positions: under a token budget the rows are sorted by length, so a micro-batch's longest prompt is
    often much shorter than the batch's."""
    keep = micro["attention_mask"].any(0)  # (P+T,)
    first = int(keep.long().argmax()) if bool(keep.any()) else 0
    if first == 0:
        return micro
    return {key: value[:, first:] if key in ("input_ids", "attention_mask") else value for key, value in micro.items()}


def _say_once(line: str) -> None:
    key = line.split(":")[0]
    if key not in _SAID:
        _SAID.add(key)
        print(line, file=sys.stderr)
