"""The default model's build recipe (the model itself: :mod:`glassrl.models.default_model`).

``ensure_default_model()`` installs the shipped weights (glassrl.builtin.shipped) on first use into
``default_model_dir()``, or builds them there (``rebuild``, another seed or spec):

1. a byte-level BPE tokenizer trained on the tasks' train text (:mod:`glassrl.models.default_tokenizer`);
2. a ``LlamaForCausalLM`` of ``DefaultModelSpec``'s size, initialised from the seed;
3. SFT (:func:`glassrl.supervised.sft.train_sft`) on arith-verify and add train splits, with a
   Chinese-heavy mix (below), written to ``sft_data.jsonl`` next to the weights;
4. greedy answers to the arith-verify test split (and to 500 train prompts), scored three ways
   (:func:`glassrl.data.tasks.arith_verify.evaluate`);
5. ``save_pretrained`` (safetensors) + tokenizer + ``glassrl.json`` (build parameters, seed,
   SFT steps and loss, held-out accuracies), into a temporary directory that is then renamed
   into place: a half-built model is never seen.

The size and step count are chosen so that the build takes a few minutes on 2 CPU cores, the
answer format is always right, and the arithmetic only partly. Same seed on the same machine
-> bit-identical weights.

Why a Chinese-heavy SFT mix (``DefaultModelSpec.english_answered_in_chinese``): the demo has
to show, in minutes on a CPU, something RL does and SFT did not. Its arithmetic is not that:
the model misjudges near misses ("请问3+4=8？" → "是的"), and in runs of a few hundred GRPO
steps that barely moved (measured on default-v1: held-out accuracy within ±5 points of its
start). What RL fixes quickly is a behaviour the model already has with some probability and
a reward that tells it apart. So the SFT data answers a seeded 60 % of the English questions
in Chinese, as a Chinese-heavy instruction mix does; the model then answers most English
questions in Chinese (greedy), while sampling still gives English answers often enough for
GRPO to compare. arith-verify's verifier requires the question's language (DeepSeek-R1's
language consistency, Guo et al. 2025, §2.3.3), so the demo's held-out accuracy shows it.
The mix is written to ``sft_data.jsonl``: what the model was trained on can be read.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from rich.console import Console
from transformers import LlamaForCausalLM

from glassrl.builtin import shipped
from glassrl.data import tasks
from glassrl.data.collate import collate
from glassrl.data.formatting import format_prompts
from glassrl.data.records import PromptRecord
from glassrl.data.tasks import arith_verify
from glassrl.errors import GlassrlError
from glassrl.files import exclusive
from glassrl.models.default_model import (
    DEFAULT_SPEC,
    MARKER,
    VERSION,
    AgentModelSpec,
    DefaultModelSpec,
    ResearchModelSpec,
    default_model_dir,
    is_built,
    llama_config,
    spec_json,
)
from glassrl.models.default_tokenizer import build_tokenizer
from glassrl.optim import OptimConfig, seed_everything
from glassrl.supervised.sft import SFTConfig, train_sft


def ensure_default_model(
    *, out_dir: str | Path | None = None, seed: int = 0, rebuild: bool = False, console: Console | None = None
) -> Path:
    """The default model's directory (``default_model_dir()`` unless ``out_dir``), built if it is
    missing, was built from another seed or spec, or ``rebuild`` (:func:`ensure_built`)."""
    console = console or Console()
    out = Path(out_dir) if out_dir is not None else default_model_dir()
    return ensure_built(
        out,
        seed,
        DEFAULT_SPEC,
        VERSION,
        lambda tmp: build_default_model(tmp, seed=seed, console=console),
        rebuild,
        console,
    )


def ensure_built(
    out: Path,
    seed: int,
    spec: DefaultModelSpec | AgentModelSpec | ResearchModelSpec,
    version: str,
    build: Callable[[Path], dict],
    rebuild: bool,
    console: Console,
) -> Path:
    """``out``, built by ``build(tmp)`` unless it holds a model of ``seed`` and ``spec`` already
    (and not ``rebuild``); without ``rebuild``, the package's shipped weights are copied instead
    when they are that model (:mod:`glassrl.builtin.shipped`: seed 0, the current spec, every file's
    sha256 checked). The build or copy goes to a temporary sibling directory renamed into place. A
    directory that is neither empty nor a glassrl embedded model is never replaced. Two processes
    that start at once (two first runs, or parallel tests) take turns on a lock file beside ``out``:
    the second finds the first one's model instead of moving it away while it is read."""
    if not rebuild and is_built(out, seed, spec):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(out.parent / f".{out.name}.build-lock"):  # not sibling_lock_path: init-model holds that
        if not rebuild and is_built(out, seed, spec):  # built by the process that held the lock before us
            return out
        if out.exists() and not (out / MARKER).is_file() and any(out.iterdir()):
            raise GlassrlError(f"{out} exists and is not a glassrl default model; refusing to replace it")
        tmp = out.parent / f".{out.name}.building-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        source = None if rebuild else shipped.shipped_dir(version, seed, spec)
        if source is not None:
            console.print(f"[bold]glassrl[/bold]: the shipped model {version} (sha256 checked) -> {out}")
            build = functools.partial(shipped.install, version, source)
        else:
            console.print(f"[bold]glassrl[/bold]: building the model {version} (seed {seed}) -> {out}")
            took = (shipped.shipped_info(version) or {}).get("build_time_s")
            if took:  # the research model's SFT alone takes ~20 minutes: say so before it starts
                console.print(
                    f"  the shipped build took {took / 60:.0f} min on one thread of a 2-core machine; expect about as "
                    "long (the SFT's progress bar shows the time left)",
                    markup=False,
                    soft_wrap=True,
                )
        try:
            build(tmp)
            if out.exists():
                old = out.parent / f".{out.name}.old-{os.getpid()}"
                os.replace(out, old)
                shutil.rmtree(old)
            os.replace(tmp, out)
        except OSError:
            if not is_built(out, seed, spec):
                raise
            # Another process finished the same build first; its copy is as good as ours.
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return out


def build_default_model(
    out_dir: str | Path, *, seed: int = 0, spec: DefaultModelSpec = DEFAULT_SPEC, console: Console | None = None
) -> dict:
    """Build, train, evaluate and save the default model into ``out_dir``; returns glassrl.json's content."""
    return one_thread(lambda: _build(Path(out_dir), seed, spec, console or Console()))


def one_thread(build: Callable[[], dict]) -> dict:
    """``build()`` on one torch thread, the thread count restored after. One thread: the weights
    then do not depend on the core count (it changes a matmul's reduction order), and matrices
    this small gain little from more threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return build()
    finally:
        torch.set_num_threads(threads)


def _build(out_dir: Path, seed: int, spec: DefaultModelSpec, console: Console) -> dict:
    start = time.perf_counter()
    seed_everything(seed)
    # The tokenizer learns every bundled task's text, so fine-tuning on any of them later
    # (e.g. examples/sft.yaml on task:add) meets no unseen merges.
    texts = [p + a for task in tasks.TASKS for p, a in tasks.sft_pairs(task, "train")]
    tokenizer = build_tokenizer(texts, vocab_size=spec.vocab_size, model_max_length=spec.max_position_embeddings)
    config = llama_config(spec, tokenizer)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    n_params = sum(p.numel() for p in model.parameters())
    console.print(f"default model: {n_params:,} parameters, vocabulary {len(tokenizer)}")

    sft_data = write_sft_data(out_dir / "sft_data.jsonl", spec, seed)
    sft = SFTConfig(
        model=f"fresh LlamaForCausalLM ({VERSION}, seed {seed})",
        data=str(sft_data),
        eval_data=[str(tasks.TaskRef(t, "test")) for t in spec.tasks],
        seed=seed,
        steps=spec.sft_steps,
        batch_size=spec.batch_size,
        max_length=spec.max_position_embeddings,
        optim=OptimConfig(
            lr=spec.lr, warmup_steps=spec.warmup_steps, decay="cosine", weight_decay=spec.weight_decay, grad_clip=1.0
        ),
        output_dir=str(out_dir),
        log_every=50,
        device="cpu",  # bit-identical builds: the same kernels on every machine that runs this
        threads=1,  # the build's one thread (build_default_model), not the free cores
    )
    metrics = train_sft(sft, model=model, tokenizer=tokenizer, console=console)
    accuracy = heldout_accuracy(model, tokenizer, tasks.load_task(arith_verify.NAME, "test"))
    # The same scores on train prompts: RL trains on these, so they show its headroom.
    train_accuracy = heldout_accuracy(model, tokenizer, tasks.load_task(arith_verify.NAME, "train", size=500))
    info = {
        "version": VERSION,
        "seed": seed,
        "spec": spec_json(spec),
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        "sft_steps": spec.sft_steps,
        "train_loss": metrics["train/loss"],
        "eval_loss": metrics.get("eval/loss"),
        "heldout_arith_verify": accuracy,
        "train_arith_verify": train_accuracy,
        "build_time_s": round(time.perf_counter() - start, 1),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    (out_dir / MARKER).write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return info


def sft_rows(spec: DefaultModelSpec, seed: int) -> list[dict]:
    """The SFT examples of the default model: the train splits of ``spec.tasks``, where a seeded
    ``spec.english_answered_in_chinese`` of the English arith-verify questions get the Chinese
    answer ("Is 3+4=7?" → "是的，等于7！"); ``seed`` draws which. Rows: {"prompt", "response"}."""
    rng = random.Random(f"glassrl-sft-mix/{seed}")
    rows = []
    for task in spec.tasks:
        for r in tasks.load_task(task, "train"):  # the same records as "task:NAME" in any config
            response = str(r.answer)
            if r.metadata.get("lang") == "en" and rng.random() < spec.english_answered_in_chinese:
                response = arith_verify.reference_answer(r.metadata["is_true"], r.metadata["sum"], "zh")
            rows.append({"prompt": r.prompt, "response": response})
    return rows


def write_sft_data(path: Path, spec: DefaultModelSpec, seed: int) -> Path:
    """``sft_rows`` as JSON lines at ``path`` (the form ``glassrl sft`` reads)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in sft_rows(spec, seed)), encoding="utf-8"
    )
    return path


def heldout_accuracy(model, tokenizer, records: list[PromptRecord], batch_size: int = 250) -> dict[str, float]:
    """Greedy answers to arith-verify records, scored by :func:`glassrl.data.tasks.arith_verify.evaluate`
    (exact, verdict, format: fractions of the records)."""
    answers = greedy_answers(model, tokenizer, [r.prompt for r in records], batch_size=batch_size)
    return arith_verify.evaluate(records, answers)


def greedy_answers(
    model, tokenizer, prompts: list, *, batch_size: int = 250, max_new_tokens: int = 16
) -> list[tuple[str, bool]]:
    """(decoded response without special tokens, whether it ended with EOS) for each prompt."""
    model.eval()
    results = []
    for start in range(0, len(prompts), batch_size):
        batch = collate(
            [(ids, []) for ids in format_prompts(tokenizer, prompts[start : start + batch_size])],
            tokenizer.pad_token_id,
        )
        with torch.no_grad():
            out = model.generate(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"].long(),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        for row in out[:, batch["input_ids"].shape[1] :].tolist():
            ended = tokenizer.eos_token_id in row
            row = row[: row.index(tokenizer.eos_token_id)] if ended else row
            results.append((tokenizer.decode(row, skip_special_tokens=True), ended))
    return results
