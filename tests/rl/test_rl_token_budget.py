"""batch.max_tokens_per_micro_batch: micro-batches under a token budget (glassrl.models.micro_batches) give
the step of one full batch, for token-mean and sequence-mean aggregations (issue 40)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from glassrl.models.micro_batches import micro_batches, row_tokens
from helpers import gradients_before_each_step


def test_rows_packed_longest_first_under_the_budget(capsys):
    tokens = torch.tensor([5, 30, 12, 8, 20, 3, 50])  # row 6 alone is over the budget of 40
    index = torch.tensor([0, 1, 2, 3, 4, 5, 6])
    parts = micro_batches(index, tokens, rows=8, max_tokens=40)
    assert [p.tolist() for p in parts] == [[6], [1], [4, 2, 3], [0, 5]]
    assert sorted(torch.cat(parts).tolist()) == index.tolist()
    assert "a response of 50 tokens (prompt included) is longer than the budget" in capsys.readouterr().err
    # the row count still caps a micro-batch; keep_order keeps the given order (rows grouped by prompt)
    assert [p.tolist() for p in micro_batches(index, tokens, rows=2, max_tokens=1000)] == [[6, 1], [4, 2], [3, 0], [5]]
    assert [p.tolist() for p in micro_batches(index, tokens, rows=8, max_tokens=40, keep_order=True)] == [
        [0, 1],
        [2, 3, 4],
        [5],
        [6],
    ]
    # no budget: the count of responses, in order, as before
    assert [p.tolist() for p in micro_batches(index, tokens, rows=3, max_tokens=None)] == [[0, 1, 2], [3, 4, 5], [6]]


def _batch(B: int = 8, P: int = 5, T: int = 6):
    generator = torch.Generator().manual_seed(0)
    prompt_lengths = torch.tensor([5, 1, 3, 5, 2, 4, 5, 1])
    lengths = torch.tensor([6, 1, 3, 6, 2, 5, 4, 6])
    prompt_mask = torch.arange(P).expand(B, P) >= (P - prompt_lengths).unsqueeze(1)  # left padding
    response_mask = torch.arange(T).expand(B, T) < lengths.unsqueeze(1)
    return {
        "input_ids": torch.randint(5, 200, (B, P + T), generator=generator),
        "attention_mask": torch.cat([prompt_mask, response_mask], 1),
        "response_mask": response_mask,
        "old_logprobs": -torch.rand(B, T, generator=generator),
        "advantages": torch.randn(B, T, generator=generator),
        "ref_logprobs": -torch.rand(B, T, generator=generator),
    }


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_a_token_budget_gives_the_full_batch_s_gradient_and_weights(tiny_model_dir, loss_agg):
    from glassrl.algos.losses import PolicyLossParams
    from glassrl.models import load_causal_lm
    from glassrl.optim import lr_lambda
    from glassrl.rl.loss import actor_forward, actor_terms
    from glassrl.rl.update import run_updates

    batch = _batch()
    assert row_tokens(batch["attention_mask"]).tolist() == [11, 2, 6, 11, 4, 9, 9, 7]
    terms = actor_terms(
        policy_loss="ppo_clip",
        params=PolicyLossParams(),
        loss_agg=loss_agg,
        norm_length=6,
        kl_in_loss="k3",
        kl_coef=0.1,
        entropy_coef=0.01,
        positive_nll_coef=0.0,
    )
    results = []
    forward = partial(actor_forward, 1.0, True)
    # one pass of 8 rows; 12 tokens: 11 | 11 | 9 | 9 | 7 | 6+4+2 (unequal counts); 5 tokens: every row alone
    for max_tokens in (None, 12, 5):
        model = load_causal_lm(tiny_model_dir, device="cpu")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("constant", 0, 1))
        passes, seen = [], gradients_before_each_step(model, optimizer)
        metrics = run_updates(
            model,
            optimizer,
            scheduler,
            batch,
            [torch.arange(8)],
            micro_batch=8,
            max_tokens=max_tokens,
            grad_clip=None,
            forward=lambda m, micro, seen=passes: seen.append(micro["input_ids"].shape[0]) or forward(m, micro),
            terms=terms,
            prefix="actor",
        )
        grad = seen[-1]
        weights = torch.cat([p.detach().flatten() for p in model.parameters()])
        results.append((passes, grad, weights, metrics["actor/padding_share"]))
    assert [r[0] for r in results] == [[8], [1, 1, 1, 1, 1, 3], [1, 1, 1, 1, 1, 1, 1, 1]]
    # padded positions / all positions: 59 real tokens in 8 rows × 11 columns; under the budget each
    # micro-batch drops the prompt padding its rows share (not the responses' right padding: T stays 6):
    # 12 tokens: 11 + 11 + 10 + 11 + 7 + 3 × 9 = 77 positions; 5 tokens: prompt + 6 per row, 74 positions
    assert [r[3] for r in results] == pytest.approx([1 - 59 / 88, 1 - 59 / 77, 1 - 59 / 74])
    for _, grad, weights, _ in results[1:]:
        torch.testing.assert_close(grad, results[0][1], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(weights, results[0][2], rtol=1e-5, atol=1e-6)


def test_no_grad_passes_under_a_budget_return_rows_in_order(tiny_model_dir):
    from glassrl.models import load_causal_lm
    from glassrl.workers.local import Passes, micro_batched_logprobs

    model = load_causal_lm(tiny_model_dir, device="cpu")
    batch = _batch()
    whole, _ = micro_batched_logprobs(model, batch, Passes(micro_batch=8), with_entropy=False)
    budget, _ = micro_batched_logprobs(model, batch, Passes(micro_batch=8, max_tokens=12), with_entropy=False)
    mask = batch["response_mask"]
    torch.testing.assert_close(budget[mask], whole[mask], rtol=1e-5, atol=1e-5)
