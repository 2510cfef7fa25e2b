"""``glassrl explain --mismatch RUN [--step N]``: where the gap between the sampler's and the
trainer's log-probs of a step comes from (glassrl.diagnose.mismatch, which defines the split).

    glassrl explain --mismatch runs/grpo --step 4
    glassrl explain --mismatch runs/grpo --format jsonl     # every number as one JSON object

It reads the step's ledger (RUN/ledgers/step_N.jsonl: log μ as ``rollout_logprobs``, kept when
``rollout.sampling_logprobs`` is true, by vLLM, asynchronous training or an off-policy
correction; log π_old as ``logprobs``) and the weights the run holds (RUN/checkpoints/step_K for
version K, the run's ``model.actor`` for version 0; a LoRA run's checkpoints hold adapters, applied
unmerged to the base as its trainer applied them), and recomputes the ledger's tokens with each
factor set as the sampler had it or as the trainer has it. Step N's π_old is the policy after
N − 1 updates, so ``--step N`` needs the checkpoint of step N − 1 (``logging.checkpoint_every:
1`` and a ``logging.keep_checkpoints`` that holds the steps to explain); without ``--step``, the
latest step it can explain. The prompt's ids are its ``prompt_as_seen`` encoded again (its ids
came from encoding text, so this gives them back; the "trainer not reproduced" row would show
otherwise).

The sides, as a glassrl run has them: the HF engine samples with the actor's own model (same
precision as the trainer), the whole batch decoded a token at a time through a KV cache; the
trainer scores the sampled ids (no re-rendering) in one forward pass over its micro-batches,
padded, packed (``model.padding_free``) or with shared prompts (``model.shared_prefix``), with
the weights of step N − 1 (the local backend's overlap: the sampling version's own, as its
π_old is). A run that sampled with vLLM (``rollout.engine: vllm``): the sampler's precision is the
weights' (``model.dtype``: vLLM runs in it, without autocast), and the engine factor is recomputed
in vLLM where it is installed (glassrl.diagnose.mismatch_vllm: the ids scored by vLLM's
``prompt_logprobs`` at the run's temperature, in float32 or bfloat16; without vllm, or in float16,
its part stays in "not reproduced"; a LoRA run's engine holds the base and each version's adapter
through a LoRARequest of its own, as the run's engine sampled). Only the responses of the ledger
sample are recomputed (``logging.ledger_samples``); the sampling batch held more, which the
"decode" layout cannot bring back.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from glassrl.errors import GlassrlError


def run(args: argparse.Namespace) -> str:
    """The table (or one JSON line with ``--format jsonl``) of ``--mismatch RUN [--step N]``."""
    import torch

    from glassrl.config import load_saved_config
    from glassrl.diagnose.mismatch import Recompute, Side, attribute, byte_lengths, render_attribution, text_render
    from glassrl.ledger import read_jsonl
    from glassrl.models import load_tokenizer
    from glassrl.report.run_dir import ledger_paths
    from glassrl.rl.config import TrainConfig
    from glassrl.run.checkpoint import step_dir_name

    if args.format not in ("table", "jsonl"):
        raise GlassrlError(f"--format {args.format}: --mismatch prints a table or one JSON object (jsonl)")
    torch.manual_seed(0)
    root = Path(args.mismatch)
    if not (root / "config.yaml").is_file():
        raise GlassrlError(f"--mismatch {root}: not a run directory (no config.yaml)")
    cfg = load_saved_config(TrainConfig, root / "config.yaml")
    held = {0: Path(cfg.model.actor)} | _checkpoints(root, step_dir_name)
    ledgers = ledger_paths(root)
    can = [s for s in ledgers if s - 1 in held]
    if args.step is not None:
        step = _integer(args.step, "--step", "a step number", least=1)
        if step not in ledgers:
            raise GlassrlError(f"--step {step}: {root} has no ledger of that step (ledgers: {_list(ledgers)})")
        if step - 1 not in held:
            raise GlassrlError(
                f"--step {step}: its π_old is the policy after step {step - 1}, and {root} holds no checkpoint of "
                f"it (checkpoints: {_list(held)}; explainable steps: {_list(can)}); set logging.checkpoint_every=1"
            )
    elif not can:
        raise GlassrlError(
            f"--mismatch {root}: no step it can explain: a step N needs its ledger and the checkpoint of step N − 1 "
            f"(ledgers: {_list(ledgers)}, checkpoints: {_list(held)}); set logging.checkpoint_every=1"
        )
    else:
        step = can[-1]
    ledger = read_jsonl(ledgers[step])
    tokenizer = load_tokenizer(_actor(held, 0))
    samples = _samples(ledger, tokenizer, ledgers[step])
    versions = {v for s in samples for v in (s.versions or ())}
    overlap = cfg.trainer.backend == "local" and (cfg.rollout.overlap or cfg.rollout.max_staleness >= 1)
    # the run's arithmetic on CPU (glassrl.rl.resolve: auto is float32 there), both sides: the HF engine
    # samples with the actor's own model under the same autocast as the trainer's passes
    # (weights kept in bfloat16, model.dtype: the trainer computes in them)
    weights_dtype = {"auto": "float32"}.get(cfg.model.dtype, cfg.model.dtype)  # also what vLLM computes in
    dtype = (
        weights_dtype
        if weights_dtype != "float32"
        else {"auto": "float32", "float32": "float32"}.get(
            cfg.model.compute_dtype, f"autocast-{cfg.model.compute_dtype}"
        )
    )
    layout = "shared_prefix" if cfg.model.shared_prefix is True else "packed" if cfg.model.padding_free else "padded"
    trainer = Side(dtype=dtype, layout=layout, version=None if overlap and versions else step - 1)
    sampler = Side(
        dtype=dtype if cfg.rollout.engine == "hf" else weights_dtype,
        layout="decode",
        version=None if versions else step - 1,
        engine=cfg.rollout.engine,
    )
    absent = {}
    if missing := sorted(v for v in versions if v not in held):
        if trainer.version is None:  # the trainer's own π_old is of those versions
            raise GlassrlError(
                f"--step {step}: its tokens were sampled (and scored) by versions {_list(missing)}, of which {root} "
                f"holds no checkpoint (checkpoints: {_list(held)}); set logging.checkpoint_every=1"
            )
        absent["staleness"] = f"no checkpoint of version {_list(missing)} (held: {_list(held)})"
    loaded: dict[int, torch.nn.Module] = {}

    policy = _policy(cfg, held)

    def weights(version: int) -> torch.nn.Module:
        if version not in loaded:
            loaded[version] = policy(version, "float32")
        return loaded[version]

    recompute = Recompute(
        weights=weights,
        temperature=cfg.rollout.temperature,
        micro_batch=cfg.batch.micro_batch_responses,
        render=text_render(tokenizer),
        token_bytes=byte_lengths(tokenizer),
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        # a model.dtype run's weights as its trainer loads them (the 16-bit side of the other runs: the cast)
        load=lambda v, d: policy(v, d) if d == weights_dtype else None,
    )
    if cfg.rollout.engine != "hf":
        scorer, why = _engine_scorer(cfg, sampler, trainer, weights, held)
        if scorer is None:
            absent["engine"] = f"{why}; its part stays in 'not reproduced'"
        else:
            recompute.engines[cfg.rollout.engine] = scorer
    top = 5 if args.top is None else _integer(args.top, "--top", "a number of tokens", least=0)
    try:
        result = attribute(samples, sampler, trainer, recompute, absent=absent, what_if=True, top=top)
    finally:
        for scorer in recompute.engines.values():
            scorer.close()  # its engines' KV caches
    if args.format == "jsonl":
        return json.dumps({"step": step, "ledger": str(ledgers[step]), **result.to_dict()}, ensure_ascii=False) + "\n"
    tokens = [[row.token for row in r.tokens] for r in ledger.responses]
    lines = [f"{ledgers[step]}: step {step}, {len(samples)} responses", *render_attribution(result, tokens)]
    return "".join(f"{line}\n" for line in lines)


def _engine_scorer(cfg, sampler, trainer, weights, held: dict[int, Path]):
    """(the scorer of the run's sampling engine, None) or (None, why it cannot be recomputed here)."""
    if cfg.rollout.engine != "vllm":
        return None, f"no recompute in {cfg.rollout.engine}"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return None, "vllm is not installed here (make test-vllm's .venv-vllm, docs/vllm.md)"
    from glassrl.diagnose.mismatch_vllm import VLLM_DTYPES, VLLMScorer

    if unsupported := sorted({d for d in (sampler.dtype, trainer.dtype) if d not in VLLM_DTYPES}):
        return None, f"vLLM here computes in {', '.join(VLLM_DTYPES)}, not {', '.join(unsupported)}"
    truncated = cfg.rollout.top_p < 1.0 or cfg.rollout.top_k > 0
    # LoRA: the engine holds the base and applies each version's adapter through a LoRARequest, as the
    # run's engine did (glassrl.rollout.vllm); version 0's adapter (B = 0) adds nothing: the base alone
    lora = dict(adapter=lambda v: _actor(held, v) if v else None, rank=cfg.model.lora.r) if cfg.model.lora else {}
    scorer = VLLMScorer(
        lambda v: _actor(held, 0 if lora else v),
        weights,
        temperature=cfg.rollout.temperature,
        seed=cfg.seed,
        truncated=truncated,
        **lora,
    )
    return scorer, ""


def _policy(cfg, held: dict[int, Path]):
    """``policy(version, dtype)``: the policy of that version as the run computed it, in eval mode. A LoRA
    run (``model.lora``): its checkpoints hold the adapters alone, applied unmerged to the base, as the
    trainer and the HF engine applied them (merging would round W + BA·α/r: a gap of its own); version 0
    is the base itself (adapters start with B = 0, so they add exactly nothing)."""
    from glassrl.models import load_causal_lm
    from glassrl.models.lora import load_lora_model

    def load(version: int, dtype: str):
        path = _actor(held, version)
        if cfg.model.lora is None or version == 0:
            return load_causal_lm(path, dtype=dtype, device="cpu").eval()
        base = lambda at: load_causal_lm(at, dtype=dtype, device="cpu")  # noqa: E731
        return load_lora_model(path, cfg.model.lora.settings(), base).eval()

    return load


def _actor(held: dict[int, Path], version: int) -> Path:
    """The policy's model directory of ``version``: the run's model.actor for 0, else its checkpoint's
    actor part, files verified against the manifest (glassrl.run.open)."""
    from glassrl.run.open import open_checkpoint

    if version == 0:
        return held[0]
    return open_checkpoint(held[version]).actor


def _checkpoints(root: Path, name) -> dict[int, Path]:
    """{step: RUN/checkpoints/step_XXXXXXXX} of the complete checkpoints (a manifest)."""
    out = {}
    directory = root / "checkpoints"
    if directory.is_dir():
        for path in directory.iterdir():
            if path.name.startswith("step_") and (path / "manifest.json").is_file() and path.name[5:].isdigit():
                step = int(path.name[5:])
                if path.name == name(step):
                    out[step] = path
    return dict(sorted(out.items()))


def _samples(ledger, tokenizer, path: Path) -> list:
    from glassrl.diagnose.mismatch import Sample

    samples = []
    for b, r in enumerate(ledger.responses):
        if r.prompt_as_seen is None:
            raise GlassrlError(f"{path}: response {b} has no prompt_as_seen (a ledger from before it)")
        kept = [t.rollout_logprobs is not None and t.logprobs is not None for t in r.tokens if t.response_mask]
        if not any(kept):
            raise GlassrlError(
                f"{path}: response {b} has no log μ (rollout_logprobs): the run kept no sampler log-probs; "
                "set rollout.sampling_logprobs=true"
            )
        mask = tuple(t.response_mask and t.rollout_logprobs is not None and t.logprobs is not None for t in r.tokens)
        versions = [t.policy_version for t in r.tokens]
        samples.append(
            Sample(
                prompt_ids=tuple(tokenizer.encode(r.prompt_as_seen, add_special_tokens=False)),
                response_ids=tuple(int(t.token_id) for t in r.tokens),
                mask=mask,
                sampler=tuple(t.rollout_logprobs if m else 0.0 for t, m in zip(r.tokens, mask)),
                trainer=tuple(t.logprobs if m else 0.0 for t, m in zip(r.tokens, mask)),
                versions=None if all(v is None for v in versions) else tuple(-1 if v is None else v for v in versions),
            )
        )
    return samples


def _integer(text: str, flag: str, what: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise GlassrlError(f"{flag}: expected {what}, got {text!r}") from None
    if value < least:
        raise GlassrlError(f"{flag}: expected {what} >= {least}, got {value}")
    return value


def _list(steps) -> str:
    steps = list(steps)
    return ", ".join(map(str, steps)) if steps else "none"
