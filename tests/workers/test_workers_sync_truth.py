"""The sync truth check (glassrl.workers.sync_truth) on the real weight sync (glassrl.workers.weight_sync).

Sender and receiver run in two threads of this process over a gloo group of their own (the
protocol is the one the Ray ranks run). The actor is the tiny default-format model (LoRA: the same
with adapters); the rollout copy starts from another draw of the adapters, or from the same
checkpoint. Sync 0 is clean; then the actor takes a simulated update (every trained weight moves),
and sync 1 runs with one fault injected between the wire and the sampler's model. Each fault class
of issue 41 must be caught at that sync (within one step), and the breach must name the tensor:

- a tensor dropped (the sink never loads it), adapters not applied (none sent: verl #7495; or
  loaded but disabled), a level-2 sleep (the sampler's weights zeroed, or reset to their initial
  values, after loading: TRL #5312), a merged-LoRA leak (the adapters folded into the base weights
  the sampler holds, which then applies them again: miles #1087), a stale bucket (one bucket of the
  previous version), a permuted layout (rows of a tensor permuted; a square tensor transposed).

And no false alarm: clean syncs pass, the probe within tolerance (full fine-tuning and LoRA).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from glassrl.workers.data_parallel import free_port
from glassrl.workers.sync_truth import (
    Checker,
    adapters_not_applied,
    exact_mismatch,
    fingerprints,
    layer_of,
)
from glassrl.workers.weight_sync import ModuleSink, WeightReceiver, WeightSender, lerp_into

UP = "model.layers.0.mlp.up_proj.weight"  # a tensor in a layer of the tiny model
Q = "model.layers.1.self_attn.q_proj.weight"  # square: hidden × hidden


def _model(model_dir: Path, lora: bool, seed: int):
    from glassrl.models.loading import load_causal_lm

    torch.manual_seed(seed)  # LoRA's A is drawn: another seed, other adapters (the first sync sends them)
    model = load_causal_lm(model_dir, dtype="float32", device="cpu")
    if lora:
        from glassrl.models.lora import LoraSettings, apply_lora

        model = apply_lora(model, LoraSettings(r=2, target_modules="all-linear"), Path(model_dir))
    return model


@torch.no_grad()
def _update(model, seed: int) -> None:
    """A simulated optimiser step: every trained weight moves a little."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.requires_grad:
            p.add_(1e-3 * torch.randn(p.shape, generator=g))


class Faulty(WeightReceiver):
    """A rollout rank's receiver whose sync 1 goes wrong: ``fault(self, index, weights) -> weights`` on each
    bucket between the wire and the model (``index``: the bucket's place in the sync; ``previous``: what
    the previous sync brought in each place), ``after_load(model)`` once the buckets are in."""

    def __init__(self, model, fault=None, after_load=None) -> None:
        super().__init__(self._load, Checker(model, "rollout rank 0"))
        self.model, self.fault, self.after_load = model, fault, after_load
        self.sink, self.sync, self.index, self.previous = ModuleSink(model), 0, 0, {}

    def _load(self, weights):
        if self.sync == 1 and self.fault is not None:
            weights = self.fault(self, self.index, weights)
        self.previous[self.index] = [(n, t.clone()) for n, t in weights]
        self.index += 1
        self.sink(weights)

    def receive(self) -> int:
        self.index = 0
        version = super().receive()
        if self.sync == 1 and self.after_load is not None:
            self.after_load(self.model)
        self.sync += 1
        return version


def _run(model_dir, lora=False, fault=None, after_load=None, probe=(True, True)):
    """Two syncs, an update between them, sync 1 faulty: the receiver's two verdicts."""
    actor, sampler = _model(model_dir, lora, 0), _model(model_dir, lora, 1)
    port = free_port()
    sender = WeightSender(actor, is_main=True, bucket_bytes=4096, check=True)
    receiver = Faulty(sampler, fault, after_load)
    verdicts, errors = [], []

    def receive() -> None:
        try:
            receiver.join("127.0.0.1", port, 1, 2)
            for _ in range(2):
                verdicts.append(receiver.receive_checked())
        except BaseException as err:  # noqa: BLE001 - re-raised by the test's thread
            errors.append(err)

    thread = threading.Thread(target=receive)
    thread.start()
    sender.join("127.0.0.1", port, 2)
    sender.send(0, probe=probe[0])
    _update(actor, 1)
    sender.send(1, probe=probe[1])
    thread.join(120)
    assert not errors, errors
    return verdicts


def _without(name):
    return lambda rx, i, weights: [(n, t) for n, t in weights if n != name]


def _stale(rx, i, weights):
    return rx.previous[i] if any(n == UP for n, _ in weights) else weights


def _permuted(name, how):
    def fault(rx, i, weights):
        return [(n, how(t) if n == name else t) for n, t in weights]

    return fault


@torch.no_grad()
def _zeroed(model):
    for p in model.parameters():
        p.zero_()


@torch.no_grad()
def _merged(model):
    """What a merged export sent as base weights does: each base weight += its adapters' BA·α/r."""
    for module in model.modules():
        if hasattr(module, "lora_A") and len(module.lora_A):
            module.base_layer.weight += module.get_delta_weight("default")


def _disabled(model):
    model.base_model.disable_adapter_layers()


FAULTS = {  # name: (lora, fault, after_load, the tensor the breach must name)
    "dropped": (False, _without(UP), None, UP),
    "level-2 sleep (zeroed)": (False, None, _zeroed, "model.embed_tokens.weight"),
    "stale bucket": (False, _stale, None, UP),
    "permuted rows": (False, _permuted(UP, lambda t: t.flip(0)), None, UP),
    "transposed": (False, _permuted(Q, lambda t: t.t().contiguous()), None, Q),
    "no adapters sent": (True, lambda rx, i, w: [(n, t) for n, t in w if "lora_" not in n], None, "lora_A"),
    "adapters disabled": (True, None, _disabled, "layers.0.self_attn.q_proj"),
    "merged LoRA leak": (True, None, _merged, "base_layer.weight"),
}


@pytest.mark.parametrize("case", list(FAULTS))
def test_each_fault_is_caught_at_the_sync_naming_the_tensor(case, tiny_model_dir):
    lora, fault, after_load, tensor = FAULTS[case]
    clean, faulty = _run(tiny_model_dir, lora, fault, after_load)
    assert clean.breach is None and clean.probe_diff is not None and clean.probe_diff <= 1e-3
    assert faulty.breach is not None, case
    assert tensor in faulty.tensor and faulty.tensor in faulty.breach, faulty.breach
    assert faulty.breach.startswith("rollout rank 0, weights of version 1: ")
    assert ("layer" in faulty.breach) and faulty.version == 1


def test_a_level_2_sleep_that_resets_to_init_is_caught(tiny_model_dir):
    init = {n: p.detach().clone() for n, p in _model(tiny_model_dir, False, 1).named_parameters()}

    @torch.no_grad()
    def reset(model):
        for n, p in model.named_parameters():
            p.copy_(init[n])

    _, faulty = _run(tiny_model_dir, after_load=reset)
    assert faulty.breach is not None and "trainer Σx" in faulty.breach


def test_clean_syncs_pass_with_and_without_the_probe(tiny_model_dir):
    for lora in (False, True):
        first, second = _run(tiny_model_dir, lora, probe=(True, False))
        assert first.breach is None and second.breach is None
        assert first.probe_diff is not None and second.probe_diff is None
        assert first.tensors == second.tensors == len(dict(_model(tiny_model_dir, lora, 0).named_parameters()))


def test_the_probe_names_the_first_token_that_moved(tiny_model_dir):
    """Weights equal by every checksum but a function that differs: only the probe can see it. Here the
    sampler's final norm is scaled after the checksums were taken (a kernel that reads a layout wrongly)."""
    actor, sampler = _model(tiny_model_dir, False, 0), _model(tiny_model_dir, False, 0)
    checker = Checker(sampler, "rollout rank 0")
    names = [n for n, _ in actor.named_parameters()]
    from glassrl.workers.sync_truth import probe_rows, probe_scores, vocab_size

    rows = probe_rows(vocab_size(actor))
    trainer = probe_scores(actor, rows)
    sampler.model.norm.register_forward_hook(lambda m, i, out: out * 3)
    verdict = checker.verdict(4, names, fingerprints(actor.named_parameters()), trainer, 0.0)
    assert verdict.tensor == "the probe batch"
    assert f"probe row 0, token 1 (id {rows[0][1]}): trainer log-prob" in verdict.breach
    assert verdict.probe_diff > 1e-3


def test_fingerprints_are_exact_and_see_order():
    x = torch.randn(7, 5)
    same, flipped = fingerprints([("x", x.clone())]), fingerprints([("x", x.flip(0))])
    assert exact_mismatch(["x"], fingerprints([("x", x)]), same) is None
    name, how = exact_mismatch(["x"], fingerprints([("x", x)]), flipped)
    assert name == "x" and "another order" in how
    bumped = x.clone()
    bumped[3, 2] = torch.nextafter(bumped[3, 2], torch.tensor(9.0))  # one ulp of one element
    assert exact_mismatch(["x"], same, fingerprints([("x", bumped)])) is not None
    half = x.to(torch.bfloat16)
    assert exact_mismatch(["h"], fingerprints([("h", half)]), fingerprints([("h", half.clone())])) is None


def test_the_mixed_reference_is_checked_exactly():
    """Checker.observe before the sink, verdict after: a mix done right passes; one skipped, or done with
    another α, or fed a tensor other than the trainer's, is named."""
    theta = {"w": torch.randn(50, 8), "b": torch.randn(8)}
    sent = fingerprints(theta.items())
    names = list(theta)

    def check(mix, alpha=0.6, feed=theta):
        ref = torch.nn.ParameterDict({n: torch.nn.Parameter(torch.randn_like(t)) for n, t in theta.items()})
        checker = Checker(ref, "reference", alpha=0.6)
        checker.ahead()
        checker.observe(feed.items())
        mix(ref, feed, alpha)
        return checker.verdict(1, names, sent, None, 0.0)

    def lerp(ref, feed, alpha, skip=None):
        lerp_into(dict(ref.named_parameters()), [(n, t) for n, t in feed.items() if n != skip], alpha)

    assert check(lerp).breach is None
    skipped = check(lambda r, f, a: lerp(r, f, a, skip="w"))
    assert skipped.tensor == "w" and "not mixed in as α·θ + (1 − α)·θ_ref (α = 0.6)" in skipped.breach
    assert check(lerp, alpha=0.5).tensor == "w"  # every tensor off: the first in order named
    stale = check(lerp, feed={"w": theta["w"] + 1e-3, "b": theta["b"]})
    assert stale.tensor == "w" and "arrived other than the trainer sent it" in stale.breach


def test_layer_names_and_adapters_state(tiny_model_dir):
    assert layer_of("model.layers.12.mlp.up_proj.weight") == "layer 12"
    assert layer_of("transformer.h.3.attn.c_attn.weight") == "layer 3"
    assert layer_of("model.embed_tokens.weight") == "no layer"
    model = _model(tiny_model_dir, True, 0)
    assert adapters_not_applied(model) == []
    model.base_model.disable_adapter_layers()
    assert adapters_not_applied(model) and all("proj" in n for n in adapters_not_applied(model))


def test_the_sync_log_sums_a_step_and_counts_a_vllm_engines_own_checks():
    from types import SimpleNamespace

    from glassrl.rollout.vllm_sync import SyncCheck, Tolerance
    from glassrl.workers.sync_truth import SyncLog, Verdict

    log = SyncLog()
    engine = SimpleNamespace(syncs=0, last_sync=None)  # glassrl.rollout.vllm.VLLMRolloutEngine's two fields
    log.follow(engine)
    assert log.drain() == ({}, [])
    log.add([Verdict("rollout rank 0", 3, 40, probe_diff=2e-6, seconds=0.5), None])
    log.add(
        [Verdict("rollout rank 1", 3, 40, "rollout rank 1, weights of version 3: x (no layer): …", "x", seconds=0.7)]
    )
    engine.syncs, engine.last_sync = 2, SyncCheck(max_diff=4e-6, tolerance=Tolerance(1e-3), moved=0.1)
    metrics, breaches = log.drain()
    assert metrics == {
        "sync/checks": 3.0,
        "sync/tensors": 80.0,
        "sync/breaches": 1.0,
        "perf/sync_check_s": 0.7,
        "sync/probe_max_diff": 4e-6,
    }
    assert breaches == ["rollout rank 1, weights of version 3: x (no layer): …"]
    assert log.drain() == ({}, [])  # drained; the engine's syncs already counted
