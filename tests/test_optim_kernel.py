"""AdamW's kernel (``OptimConfig.kernel``): auto keeps the one-tensor kernel, and so the bundled
models' figures, below FUSED_ON_CPU_FROM and fuses above it; fused and single as asked; fused
refused where it cannot run; the start-up line says which runs and why; a fused optimiser's state
resumes bit-identically (glassrl.optim.choose_kernel)."""

from __future__ import annotations

import io

import pytest
import torch

import glassrl.optim as optim_module
from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.optim import OptimConfig, make_optimizer, optimizer_path
from glassrl.supervised.sft import SFTConfig


class Tagged(torch.nn.Parameter):
    """A parameter that is not a plain ``nn.Parameter`` (as an FSDP2 DTensor shard is not)."""


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def _tagged_model() -> torch.nn.Module:
    model = _model()
    model[0].weight = Tagged(model[0].weight.detach().clone())
    return model


def _built(kernel: str, model: torch.nn.Module | None = None):
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1, kernel=kernel)
    optimizer, scheduler = make_optimizer(model or _model(), cfg, 10, "actor_optim")
    return optimizer, scheduler, optimizer_path(optimizer, cfg, "actor_optim")


def _steps(model, optimizer, n: int, seed: int = 1) -> None:
    data = torch.Generator().manual_seed(seed)
    for _ in range(n):
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(5, 8, generator=data)).square().mean().backward()
        optimizer.step()


def test_auto_on_a_small_cpu_model_keeps_one_tensor_at_a_time():
    optimizer, _, path = _built("auto")
    assert not optimizer.defaults["fused"]
    assert path == (
        "AdamW, one tensor at a time (torch's default on CPU: 976 bytes of trainable parameters < 256 MiB, "
        "from which actor_optim.kernel auto fuses)"
    )


def test_auto_fuses_on_cpu_from_the_size_constant(monkeypatch):
    monkeypatch.setattr(optim_module, "FUSED_ON_CPU_FROM", 976)
    optimizer, _, path = _built("auto")
    assert optimizer.defaults["fused"]
    assert path == "AdamW, fused kernel (CPU: 976 bytes of trainable parameters >= 976 bytes)"
    monkeypatch.setattr(optim_module, "FUSED_ON_CPU_FROM", 977)  # one byte above the model's 976
    assert not _built("auto")[0].defaults["fused"]


def test_auto_above_the_constant_says_why_a_parameter_keeps_it_unfused(monkeypatch):
    monkeypatch.setattr(optim_module, "FUSED_ON_CPU_FROM", 1)
    model = _tagged_model()
    optimizer, _, path = _built("auto", model)
    assert not optimizer.defaults["fused"]
    assert path == (
        "AdamW, one tensor at a time (torch's default on CPU); the fused kernel needs plain floating-point "
        "parameters on CPU or CUDA, these are also Tagged (torch.float32, cpu)"
    )


def test_single_is_one_tensor_at_a_time_even_above_the_constant(monkeypatch):
    monkeypatch.setattr(optim_module, "FUSED_ON_CPU_FROM", 1)
    optimizer, _, path = _built("single")
    assert not optimizer.defaults["fused"] and optimizer.defaults["foreach"] is False
    assert path == "AdamW, one tensor at a time (actor_optim.kernel single)"


def test_fused_on_a_small_model_steps_as_the_single_kernel_does_to_rounding():
    fused_model, single_model = _model(), _model()
    fused, _, path = _built("fused", fused_model)
    single, _, _ = _built("single", single_model)
    assert fused.defaults["fused"] and path == "AdamW, fused kernel (actor_optim.kernel fused)"
    for _ in range(4):
        _steps(fused_model, fused, 1)
        _steps(single_model, single, 1)
        for (name, a), b in zip(fused_model.named_parameters(), single_model.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert any(not torch.equal(a, b) for a, b in zip(fused_model.parameters(), _model().parameters()))  # it moved


def test_fused_is_refused_where_it_cannot_run_naming_the_key():
    model = _tagged_model()
    with pytest.raises(GlassrlError) as err:
        _built("fused", model)
    assert str(err.value) == (
        "actor_optim.kernel = 'fused': the fused kernel needs plain floating-point parameters on CPU or CUDA, "
        "these are also Tagged (torch.float32, cpu); use auto or single"
    )
    _built("single", model)  # the control: the same model takes the other kernels
    _built("auto", model)


def test_a_fused_optimizer_state_resumes_bit_identically():
    """Saved and loaded (torch.save, weights_only read, as a checkpoint's state is plain tensors and
    data), the fused optimiser continues exactly as the one that never stopped."""
    straight_model, resumed_model = _model(), _model()
    straight, _, _ = _built("fused", straight_model)
    _steps(straight_model, straight, 3)
    buffer = io.BytesIO()
    torch.save({"model": straight_model.state_dict(), "optim": straight.state_dict()}, buffer)
    _steps(straight_model, straight, 3, seed=2)

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed_model.load_state_dict(saved["model"])
    resumed, _, _ = _built("fused", resumed_model)
    resumed.load_state_dict(saved["optim"])
    _steps(resumed_model, resumed, 3, seed=2)
    for a, b in zip(straight_model.parameters(), resumed_model.parameters()):
        assert torch.equal(a, b)


def test_the_kernel_key_is_checked_and_shown():
    with pytest.raises(GlassrlError, match=r"^optim.kernel = 'foreach': must be one of auto, fused, single$"):
        OptimConfig(kernel="foreach").check("optim")  # type: ignore[arg-type]
    cfg = load_config(SFTConfig, None, ["optim.kernel=fused"])
    assert cfg.optim.kernel == "fused"
    assert ("actor AdamW kernel", "fused", "torch's fused kernel") in cfg.optim.rows("actor ")
