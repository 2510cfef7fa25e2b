"""The CUDA group (issue 11): what runs on CPU in the rest of the suite, run on a GPU.

Skipped where no CUDA device is visible (here, and in CI); run with the `device` tool:
``pytest -m gpu tests/gpu``. Each test states what it checks and against what; the
tolerances are float32 on a GPU (TF32 off, PyTorch's default for matmuls) unless a test
says bf16. Figures measured on an H100 are in BENCHMARKS.md ("GPU").

- decoding into the preallocated cache gives ``model.generate``'s tokens on CUDA;
- the log-probs the rollout engine keeps equal one forward pass over the batch;
- padding-free (packed) and shared-prefix passes equal padded ones;
- fp32 master weights with bf16 autocast keep a small update that bf16 weights lose;
- GRPO and PPO runs on CUDA (fp32 and bf16 autocast), resumed from a checkpoint;
- LoRA on a model of real size (Qwen2-0.5B's shape, randomly initialised: 494 M parameters):
  only adapters train, the reference is the base with adapters off, the merged export
  computes the adapted model's log-probs.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from helpers import preset_trainer, tiny_run_overrides
from run_helpers import KillAt, Killed, logged_metrics  # tests/run_helpers.py

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = "cuda"


def _prompts(engine) -> list[list[int]]:
    from glassrl.data.formatting import format_prompt

    return [format_prompt(engine.tokenizer, p) for p in ["请问1+1=2？", "Is 12+34=47?", "请问30+5=35？", "Is 7+8=15?"]]


@pytest.mark.parametrize("greedy", [True, False])
def test_decode_gives_generates_tokens_on_cuda(engine, greedy):
    """Preallocated-cache decoding (glassrl.rollout.hf.decode) against model.generate, same CUDA
    generator: the same tokens, and the generator left in the same state."""
    from glassrl.rollout.base import SamplingParams
    from glassrl.rollout.hf import decode, generate_with_hf, left_pad

    params = SamplingParams(max_new_tokens=24, greedy=greedy)
    ids, mask = left_pad(_prompts(engine), engine.pad_id)
    ids, mask = ids.repeat_interleave(8, 0).to(CUDA), mask.repeat_interleave(8, 0).to(CUDA)
    out = []
    for sample in (decode, generate_with_hf):
        g = torch.Generator(CUDA).manual_seed(3)
        tokens = sample(engine.model, ids, mask, params, stops=engine.stops, pad_id=engine.pad_id, generator=g)
        out.append((tokens, g.get_state()))
    (fast, g_fast), (ref, g_ref) = out
    assert fast.shape == ref.shape and torch.equal(fast, ref)
    assert torch.equal(g_fast, g_ref)


@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_kept_logprobs_equal_one_forward_pass_on_cuda(engine, compute_dtype):
    """The log-probs recorded while sampling (rollout_logprobs) against one forward pass over the
    finished batch (glassrl.models.logprobs.response_logprobs): float32 agrees to 1e-4 nats; under
    bf16 autocast the two passes round differently (the mismatch algo.rollout_is corrects), and
    the test states the size seen."""
    from glassrl.models.logprobs import response_logprobs
    from glassrl.models.precision import compute_precision
    from glassrl.rollout.base import SamplingParams
    from glassrl.rollout.hf import HFRolloutEngine

    keeping = HFRolloutEngine(engine.model, engine.tokenizer, sampling_logprobs=True)
    params = SamplingParams(max_new_tokens=24, temperature=1.0)
    with compute_precision(CUDA, getattr(torch, compute_dtype)):
        batch = keeping.generate(_prompts(engine), n=8, params=params, generator=torch.Generator(CUDA).manual_seed(1))
        with torch.no_grad():
            forward, _ = response_logprobs(
                engine.model, batch.input_ids, batch.attention_mask, batch.response_ids.shape[1]
            )
    mask = batch.response_mask
    diff = (forward - batch.rollout_logprobs)[mask].abs()
    assert diff.numel() > 100
    assert diff.max() < (1e-4 if compute_dtype == "float32" else 0.25), diff.max()


@pytest.mark.parametrize("layout", ["packed", "shared_prefix"])
def test_packed_logprobs_and_gradients_equal_padded_on_cuda(tiny_model_dir, layout):
    """Padding-free passes (glassrl.models.packing) and the shared-prefix layout with its tree mask
    (glassrl.models.shared_prefix) on CUDA: log-probs, entropy and gradients equal the padded
    batch's (float32). Rows 0-1 and 2-3 share their prompts."""
    from glassrl.models import load_causal_lm
    from glassrl.models.logprobs import response_logprobs

    g = torch.Generator().manual_seed(0)
    lengths = [(3, 9), (3, 2), (7, 16), (7, 7), (14, 1), (5, 12)]  # (prompt, response) per row
    P, T = max(p for p, _ in lengths), max(r for _, r in lengths)
    ids = torch.randint(5, 200, (len(lengths), P + T), generator=g)
    ids[1, :P], ids[3, :P] = ids[0, :P], ids[2, :P]
    mask = torch.zeros(len(lengths), P + T, dtype=torch.bool)
    for b, (p, r) in enumerate(lengths):
        mask[b, P - p : P + r] = True
    ids, mask = ids.to(CUDA), mask.to(CUDA)
    response = mask[:, P:]
    out = []
    for on in (False, True):
        model = load_causal_lm(tiny_model_dir, dtype="float32", device=CUDA).train()
        lp, ent = response_logprobs(model, ids, mask, T, temperature=0.8, with_entropy=True, **{layout: on})
        torch.where(response, lp + 0.1 * ent, 0.0).sum().backward()
        out.append((lp.detach(), ent.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (lp, ent, grads), (plp, pent, pgrads) = out
    torch.testing.assert_close(plp[response], lp[response], rtol=0, atol=1e-5)
    torch.testing.assert_close(pent[response], ent[response], rtol=0, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(pgrads[name], grad, rtol=1e-4, atol=1e-4, msg=name)


def test_bf16_autocast_with_fp32_masters_keeps_small_updates_on_cuda(tiny_model_dir):
    """One AdamW step at lr 1e-6 (Kingma & Ba 2015, Alg. 1: Δ ≈ −lr·sign(g)): float32 masters under
    bf16 autocast change the weights fp32 changes; bf16 weights lose almost all of them (w + Δ
    rounds back to w). The CPU version: tests/models/test_models_precision.py."""
    from glassrl.models import load_causal_lm
    from glassrl.models.logprobs import response_logprobs
    from glassrl.models.precision import compute_precision

    base = load_causal_lm(tiny_model_dir, dtype="float32", device=CUDA)
    ids = torch.randint(3, base.config.vocab_size, (8, 24), generator=torch.Generator().manual_seed(1)).to(CUDA)
    mask = torch.ones_like(ids, dtype=torch.bool)

    def one_step(model, dtype):
        before = [p.detach().float().clone() for p in model.parameters()]
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.95), weight_decay=0.0)
        with compute_precision(CUDA, dtype):
            logprobs, _ = response_logprobs(model, ids, mask, 12)
        (-logprobs.mean()).backward()
        optimizer.step()
        return torch.cat([(p.detach().float() - b).flatten() for p, b in zip(model.parameters(), before)])

    fp32 = one_step(copy.deepcopy(base), torch.float32)
    mixed = one_step(copy.deepcopy(base), torch.bfloat16)
    naive = one_step(copy.deepcopy(base).to(torch.bfloat16), torch.float32)
    changed = fp32 != 0
    assert changed.float().mean() > 0.5
    assert ((mixed != 0) == changed).float().mean() > 0.99
    assert torch.nn.functional.cosine_similarity(mixed, fp32, dim=0) > 0.9
    assert (naive != 0).float().mean() < 0.05 * changed.float().mean()


def _gpu_trainer(preset: str, model: Path, prompt_files, out: Path, extra: list[str], **kwargs):
    overrides = [
        *tiny_run_overrides(model, prompt_files, out),
        "model.device=cuda",
        "steps=3",
        "logging.checkpoint_every=1",
        "logging.report=false",
        *extra,
    ]
    return preset_trainer(preset, overrides, **kwargs)


@pytest.mark.parametrize(
    ("preset", "extra"),
    [
        ("grpo", []),
        ("ppo", []),
        ("grpo", ["model.compute_dtype=bfloat16", "algo.rollout_is={cap: 2.0}"]),
        ("ppo", ["model.shared_prefix=true"]),  # off by default on CUDA (auto); the layout on a GPU
    ],
    ids=["grpo-fp32", "ppo-fp32", "grpo-bf16-tis", "ppo-shared-prefix"],
)
def test_training_runs_on_cuda_and_resumes(tiny_model_dir, prompt_files, tmp_path, preset, extra):
    """A 3-step run on CUDA: every logged number finite, the weights trained and on the GPU; a run
    killed after step 2 and resumed logs step 3 as the uninterrupted run did (to 1e-5: cuBLAS may
    pick other kernels in a new run; bit-identity is the CPU guarantee, tests/rl/test_rl_resume.py)."""
    from glassrl.models import load_causal_lm

    straight = _gpu_trainer(preset, tiny_model_dir, prompt_files, tmp_path / "straight", extra)
    straight.train()
    model = straight.workers.actor.model
    assert {p.device.type for p in model.parameters()} == {"cuda"}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    initial = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu").state_dict()
    assert any(not torch.equal(w.cpu(), initial[k]) for k, w in model.state_dict().items())
    whole = logged_metrics(tmp_path / "straight")
    assert [row["step"] for row in whole][-3:] == [1, 2, 3]
    for row in whole:
        bad = {k: v for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, bad

    victim = _gpu_trainer(preset, tiny_model_dir, prompt_files, tmp_path / "resumed", extra)
    victim.sinks.sinks.append(KillAt(3))
    with pytest.raises(Killed):
        victim.train()
    resumed = _gpu_trainer(preset, tiny_model_dir, prompt_files, tmp_path / "resumed", extra, resume=True)
    assert resumed.counters.step == 2
    resumed.train()
    last = logged_metrics(tmp_path / "resumed")[-1]
    assert last["step"] == 3
    for key, value in whole[-1].items():
        if isinstance(value, float) and key.startswith(("reward/", "actor/", "advantage/", "kl/", "critic/")):
            assert last[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


@pytest.fixture(scope="module")
def real_size_model(tmp_path_factory):
    """Qwen2-0.5B's shape (24 layers, hidden 896, 14 heads / 2 KV heads, MLP 4864, vocabulary
    151,936), randomly initialised and saved in float32: nothing is downloaded."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=151_936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen2-0.5b-shape")
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def test_lora_on_a_real_size_model(real_size_model, tmp_path):
    """LoRA (glassrl.models.lora, peft) on 494 M parameters on CUDA, bf16 autocast over fp32 adapters:
    the reference (adapters off, glassrl.workers.lora.LoraReference) equals the base model's
    log-probs; two AdamW steps move only adapter weights; the merged export loads with
    from_pretrained and computes the adapted model's log-probs."""
    from glassrl.models import load_causal_lm
    from glassrl.models.logprobs import response_logprobs
    from glassrl.models.lora import LoraSettings, apply_lora, export_merged
    from glassrl.models.precision import compute_precision
    from glassrl.workers.local import Passes
    from glassrl.workers.lora import LoraReference

    torch.cuda.reset_peak_memory_stats()
    base = load_causal_lm(real_size_model, dtype="float32", device=CUDA)
    n_params = sum(p.numel() for p in base.parameters())
    assert 4.9e8 < n_params < 5.0e8
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(10, 151_000, (8, 96), generator=g).to(CUDA)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, :20] = False  # a left-padded prompt
    batch = {"input_ids": ids, "attention_mask": mask, "response_mask": mask[:, 64:]}
    with torch.no_grad():
        expected, _ = response_logprobs(base, ids, mask, 32)
    frozen = {n: p.detach().clone() for n, p in base.named_parameters()}

    actor = apply_lora(base, LoraSettings(r=16, alpha=32.0), real_size_model)
    trainable = {n for n, p in actor.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    optimizer = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=1e-3)
    for _ in range(2):
        with compute_precision(CUDA, torch.bfloat16):
            logprobs, _ = response_logprobs(actor, ids, mask, 32)
        (-torch.where(batch["response_mask"], logprobs, 0.0).sum() / batch["response_mask"].sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    for name, p in actor.named_parameters():
        if "lora_" not in name:
            key = name.replace("base_model.model.", "").replace(".base_layer", "")
            assert torch.equal(p, frozen[key]), name  # the base never moves

    ref = LoraReference(actor, Passes(micro_batch=4)).compute_logprobs(batch)
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-4)
    with torch.no_grad():
        adapted, _ = response_logprobs(actor, ids, mask, 32)
    assert (adapted - expected)[batch["response_mask"]].abs().max() > 1e-2  # the adapters learned something
    peak_gib = torch.cuda.max_memory_allocated() / 2**30

    actor.save_pretrained(tmp_path / "adapters")
    merged_dir = export_merged(tmp_path / "adapters", tmp_path / "merged")
    merged = load_causal_lm(merged_dir, dtype="float32", device=CUDA)
    with torch.no_grad():
        merged_lp, _ = response_logprobs(merged, ids, mask, 32)
    torch.testing.assert_close(merged_lp, adapted, rtol=0, atol=2e-3)
    print(json.dumps({"lora_real_size": {"parameters": n_params, "trainable": len(trainable), "peak_gib": peak_gib}}))
