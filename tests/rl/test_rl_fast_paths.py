"""No faster path turns off silently: a run's start-up lines name the rollout path, the forward
passes' layout, the optimiser's kernel and the allocator setting, and say why where a faster path
does not run. The default model (the tiny one is built by the same recipe) on the locked versions
takes every fast path that the README and docs claim for CPU: a new transformers release that
broke the decoding loop would fail here instead of slowing every run unseen (issue 24)."""

from __future__ import annotations

import io
import json
import sys

import pytest
from rich.console import Console

from helpers import preset_trainer


def _start(overrides, **kwargs):
    out = io.StringIO()
    trainer = preset_trainer("grpo", overrides, console=Console(file=out, width=200), **kwargs)
    return trainer, out.getvalue()


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt: Linux only")
def test_the_default_model_takes_every_cpu_fast_path(fast, tmp_path):
    trainer, printed = _start(fast)
    try:
        paths = trainer.paths
        assert paths["rollout"].startswith("glassrl's decoding loop (preallocated KV cache")
        assert paths["forward passes"].startswith("packed, each distinct prompt once per chunk")
        assert "auto: in-process on CPU, full attention in every model" in paths["forward passes"]
        assert paths["optimiser"].startswith("AdamW, one tensor at a time (torch's default on CPU: ")
        auto = " of trainable parameters < 256 MiB, from which actor_optim.kernel auto fuses)"
        assert paths["optimiser"].endswith(auto)
        assert paths["memory"].startswith("glibc keeps freed memory for reuse")
        for what, account in paths.items():
            assert f"{what}: {account}" in printed
    finally:
        trainer.close()


def test_the_start_up_lines_say_why_a_faster_path_is_off(fast, tmp_path, monkeypatch):
    monkeypatch.setenv("GLASSRL_MALLOC", "default")
    trainer, printed = _start([*fast, "model.padding_free=true"])
    try:
        assert "memory: malloc left as it is: GLASSRL_MALLOC=default" in printed
        assert "forward passes: packed without padding (model.padding_free)" in printed
    finally:
        trainer.close()
    trainer, printed = _start([*fast, "model.shared_prefix=false", f"output_dir={tmp_path / 'padded'}"])
    try:
        assert "forward passes: padded (model.shared_prefix set to false)" in printed
    finally:
        trainer.close()


def test_the_optimiser_line_names_each_models_kernel(fast, tmp_path):
    """actor_optim.kernel and critic_optim.kernel as set, each said on the start-up line."""
    out = io.StringIO()
    overrides = [*fast, "actor_optim.kernel=single", "critic_optim.kernel=fused"]
    trainer = preset_trainer("ppo", overrides, console=Console(file=out, width=400))
    try:
        line = (
            "optimiser: AdamW, one tensor at a time (actor_optim.kernel single); "
            "critic: AdamW, fused kernel (critic_optim.kernel fused)"
        )
        assert line in out.getvalue()
        assert trainer.workers.critic.optimizer.defaults["fused"]
    finally:
        trainer.close()


def test_a_model_the_decoding_loop_cannot_run_is_said_at_start(fast, tmp_path, monkeypatch):
    """A model whose forward the loop cannot drive (here: its cache argument hidden) samples with
    model.generate, and the first lines say so and why."""
    import glassrl.rollout.hf as hf

    monkeypatch.setattr(hf, "cache_argument", lambda model: None)
    trainer, printed = _start(fast)
    try:
        assert trainer.workers.rollout.engine.sample is hf.generate_with_hf
        assert "rollout: model.generate; the decoding loop cannot run this model: " in printed
        assert "forward takes no cache (or past_key_values)" in printed
    finally:
        trainer.close()


def test_environment_json_records_the_paths(fast, tmp_path):
    trainer, _ = _start([*fast, "steps=1"])
    trainer.train()
    environment = json.loads((tmp_path / "run" / "environment.json").read_text())
    assert environment["paths"] == trainer.paths
