"""PPO-ptx (Ouyang et al. 2022, InstructGPT, eq. 2): γ × the SFT loss of a supervised batch
joins every actor optimiser step; its data order is part of the resumable state."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.rl.config import TrainConfig
from run_helpers import KillAt, Killed, assert_same_weights, logged_metrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _pairs(path: Path) -> Path:
    rows = [
        {"prompt": f"请问{a}+{b}={a + b}？", "response": f"是的，等于{a + b}！"} for a in range(3) for b in range(3)
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _setup(tiny_model_dir):
    from glassrl.models import load_causal_lm, load_tokenizer

    torch.manual_seed(0)
    return load_causal_lm(tiny_model_dir, dtype="float32", device="cpu"), load_tokenizer(tiny_model_dir)


def test_the_gradient_includes_gamma_times_the_sft_gradient(tiny_model_dir, tmp_path):
    """One SGD step (lr 1, no clipping) with γ = 0.5 minus the same step with no ptx is −γ·∇CE."""
    from glassrl.data.collate import collate
    from glassrl.rl.loss import Term, actor_forward
    from glassrl.rl.ptx import PtxLoss, load_ptx_examples
    from glassrl.rl.update import run_updates
    from glassrl.supervised.sft import response_loss

    model, tokenizer = _setup(tiny_model_dir)
    examples = load_ptx_examples(str(_pairs(tmp_path / "pairs.jsonl")), tokenizer, 64)
    rl = collate(examples[:4], tokenizer.pad_token_id)  # an RL batch: any responses, loss = their NLL
    rl = {k: rl[k] for k in ("input_ids", "attention_mask", "response_mask")}
    nll = Term(
        "actor/policy_loss",
        1.0,
        "token-mean",
        None,
        mask=lambda m: m["response_mask"],
        per_token=lambda out, m: (-out["logprobs"], {}),
    )
    start = {k: v.clone() for k, v in model.state_dict().items()}

    def step(ptx):
        model.load_state_dict(start)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        metrics = run_updates(
            model,
            optimizer,
            scheduler,
            rl,
            [torch.arange(4)],
            micro_batch=2,
            grad_clip=None,
            forward=partial(actor_forward, 1.0, False),
            terms=[nll],
            prefix="actor",
            ptx=ptx,
        )
        return {k: v.clone() for k, v in model.state_dict().items()}, metrics

    without, m0 = step(None)
    ptx = PtxLoss(examples, coef=0.5, batch_size=3, micro_batch=2, pad_id=tokenizer.pad_token_id, seed=7)
    drawn = [
        examples[i] for i in torch.randperm(len(examples), generator=torch.Generator().manual_seed(7 * 1_000_003))[:3]
    ]
    with_ptx, m1 = step(ptx)
    assert "actor/ptx_loss" not in m0

    model.load_state_dict(start)  # the SFT gradient of the same three pairs, in one pass
    model.zero_grad()
    loss_sum, count = response_loss(model, collate(drawn, tokenizer.pad_token_id))
    (loss_sum / count).backward()
    assert m1["actor/ptx_loss"] == pytest.approx((loss_sum / count).item(), rel=1e-5)
    moved = 0
    for name, p in model.named_parameters():
        expected = -0.5 * p.grad
        assert torch.allclose(with_ptx[name] - without[name], expected, atol=1e-5), name
        moved += int(expected.abs().max() > 1e-4)
    assert moved  # the check is not vacuous
    assert (ptx.stream.epoch, ptx.stream.index) == (0, 3)


def test_task_pairs_load(tiny_model_dir):
    from glassrl.rl.ptx import load_ptx_examples

    _, tokenizer = _setup(tiny_model_dir)
    examples = load_ptx_examples("task:add/test", tokenizer, 64)
    assert examples and all(response[-1] == tokenizer.eos_token_id for _, response in examples)
    with pytest.raises(GlassrlError, match=r"data.ptx = 'nope.jsonl': "):
        load_ptx_examples("nope.jsonl", tokenizer, 64)


@pytest.mark.slow
def test_a_ptx_run_trains_and_resumes_bit_identical(fast, tmp_path):
    from glassrl.rl.loop import Trainer

    pairs = _pairs(tmp_path / "pairs.jsonl")
    common = [
        *fast,
        "algo.ptx_coef=0.5",
        f"data.ptx={pairs}",
        "steps=3",
        "logging.checkpoint_every=1",
        "logging.keep_checkpoints=1",
        "logging.ledger_every=0",
    ]

    def trainer(out, **kwargs):
        cfg = load_config(TrainConfig, EXAMPLES / "grpo.yaml", [*common, f"output_dir={tmp_path / out}"])
        return Trainer(cfg, progress=False, **kwargs)

    def rows(out):
        return logged_metrics(tmp_path / out)

    straight = trainer("straight")
    straight.train()
    assert all(r["actor/ptx_loss"] > 0 for r in rows("straight")[1:])
    assert (straight.ptx.stream.epoch, straight.ptx.stream.index) == divmod(
        3 * 2 * 8, 9
    )  # steps × mini × pairs, 9 pairs an epoch

    first = trainer("resumed")
    first.sinks.sinks.append(KillAt(3))  # killed after logging step 3, before its checkpoint
    with pytest.raises(Killed):
        first.train()
    again = trainer("resumed", resume=True)
    assert again.counters.step == 2
    assert (again.ptx.stream.epoch, again.ptx.stream.index) == divmod(2 * 2 * 8, 9)  # 2 steps drawn
    again.train()
    assert_same_weights(straight.workers.actor.model, again.workers.actor.model)
    assert rows("straight") == rows("resumed")
