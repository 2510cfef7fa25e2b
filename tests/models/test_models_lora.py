"""LoRA adapters (glassrl.models.lora) and the reference with adapters off (glassrl.workers.lora)."""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path

import pytest
import torch

from glassrl.errors import GlassrlError
from glassrl.models.loading import load_causal_lm, load_scalar_model
from glassrl.models.logprobs import response_logprobs
from glassrl.models.lora import LoraSettings, apply_lora, base_path, load_adapters, load_lora_model
from glassrl.workers.local import Passes
from glassrl.workers.lora import LoraReference

SETTINGS = LoraSettings(r=4, alpha=8.0)


def perturb_adapters(model: torch.nn.Module, seed: int = 0) -> None:
    """B = 0 at initialisation (the adapted model equals the base); give B values as training would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))


@pytest.fixture
def actor(tiny_model_dir):
    model = apply_lora(load_causal_lm(tiny_model_dir, dtype="float32", device="cpu"), SETTINGS, tiny_model_dir)
    perturb_adapters(model)
    return model


@pytest.fixture
def batch(tiny_model_dir):
    vocab = load_causal_lm(tiny_model_dir, device="cpu").config.vocab_size
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, vocab, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[0, :2] = False  # a left-padded prompt
    return {"input_ids": ids, "attention_mask": mask, "response_mask": mask[:, 4:]}


def test_only_adapters_train(actor, tiny_model_dir):
    trainable = [n for n, p in actor.named_parameters() if p.requires_grad]
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    # "all-linear": every projection of every layer, never the output layer.
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    }  # fmt: skip
    assert Path(actor.peft_config["default"].base_model_name_or_path) == tiny_model_dir.resolve()


def test_reference_is_the_base_with_adapters_off(actor, tiny_model_dir, batch):
    base = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu")
    expected, _ = response_logprobs(base, batch["input_ids"], batch["attention_mask"], 5, temperature=0.7)
    actor.train()
    ref = LoraReference(actor, Passes(micro_batch=2, temperature=0.7)).compute_logprobs(batch)
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-6)
    assert actor.training  # the actor's mode is left as it was
    with torch.no_grad():
        adapted, _ = response_logprobs(actor, batch["input_ids"], batch["attention_mask"], 5, temperature=0.7)
    assert (adapted - expected).abs().max() > 1e-2  # the adapters are back on


def test_adapters_round_trip(actor, tiny_model_dir, tmp_path):
    actor.save_pretrained(tmp_path / "actor")
    assert base_path(tmp_path / "actor") == tiny_model_dir.resolve()
    fresh = load_lora_model(tmp_path / "actor", SETTINGS, partial(load_causal_lm, dtype="float32", device="cpu"))
    for (name, p), q in zip(actor.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("head", ["value-head", "token-classification"])
def test_critic_adapters_and_head_train(tiny_model_dir, tmp_path, head):
    torch.manual_seed(0)
    critic = apply_lora(
        load_scalar_model(tiny_model_dir, head=head, dtype="float32", device="cpu"), SETTINGS, tiny_model_dir
    )
    trainable = [n for n, p in critic.named_parameters() if p.requires_grad]
    heads = [n for n in trainable if "lora_" not in n]
    assert heads and all(("v_head" if head == "value-head" else "score") in n for n in heads)
    assert any("lora_" in n for n in trainable)
    if head == "value-head":  # its save writes the adapters and the head side by side
        perturb_adapters(critic)
        critic.save_pretrained(tmp_path / "critic")
        torch.manual_seed(1)  # another fresh head, replaced by the saved one
        fresh = apply_lora(
            load_scalar_model(tiny_model_dir, head=head, dtype="float32", device="cpu"), SETTINGS, tiny_model_dir
        )
        load_adapters(fresh, tmp_path / "critic")
        for (name, p), q in zip(critic.state_dict().items(), fresh.state_dict().values()):
            assert torch.equal(p, q), name


def test_settings_errors_name_the_key(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu")
    with pytest.raises(GlassrlError, match="lora.target_modules = \\('nope',\\)"):
        apply_lora(copy.deepcopy(model), LoraSettings(target_modules=("nope",)), tiny_model_dir)
    with pytest.raises(GlassrlError, match="need r ≥ 1"):
        apply_lora(copy.deepcopy(model), LoraSettings(r=0), tiny_model_dir)
    with pytest.raises(GlassrlError, match="not a LoRA adapter directory"):
        base_path(tiny_model_dir)
