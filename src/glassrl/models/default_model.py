"""The embedded default model: a small Llama trained from scratch on the bundled task.

No model is downloaded, ever. ``ensure_default_model()`` builds one on first use and caches it
in ``default_model_dir()`` = ``$GLASSRL_HOME/models/default-v2`` (GLASSRL_HOME defaults to
``~/.cache/glassrl``):

1. a byte-level BPE tokenizer trained on the tasks' train text (:mod:`.default_tokenizer`);
2. a ``LlamaForCausalLM`` of ``DefaultModelSpec``'s size, initialised from the seed;
3. SFT (:func:`glassrl.trainer.sft.train_sft`) on arith-verify and add train splits, with a
   Chinese-heavy mix (below), written to ``sft_data.jsonl`` next to the weights;
4. greedy answers to the arith-verify test split (and to 500 train prompts), scored three ways
   (see :func:`heldout_accuracy`);
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

import json
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console

from glassrl.data.records import Messages, PromptRecord
from glassrl.errors import GlassrlError

VERSION = "default-v2"
MARKER = "glassrl.json"  # written last: its presence means the build is complete


def format_prompt(tokenizer, prompt: str | Messages | Sequence[dict]) -> list[int]:
    """Token ids the model sees before its response. One rule for every tokenizer:

    - plain text: the tokenizer's own encoding with its special tokens (for the default model
      and Llama-style tokenizers: BOS + text), no chat template; the response follows directly;
    - chat messages: the tokenizer's chat template with the generation prompt appended
      (default model: ``<|bos|><|user|>…<|assistant|>``); a tokenizer without one is an error.
      The default model is trained on plain-text prompts only: it has the template, but has
      not learnt to answer in it.

    The response is then its text's tokens and EOS (:func:`glassrl.trainer.common.encode_responses`).
    """
    return format_prompts(tokenizer, [prompt])[0]


def format_prompts(tokenizer, prompts: Sequence[str | Messages | Sequence[dict]]) -> list[list[int]]:
    """:func:`format_prompt` of each prompt; plain-text prompts are encoded in one batched call."""
    texts = [i for i, p in enumerate(prompts) if isinstance(p, str)]
    out: list[list[int]] = [[] for _ in prompts]
    if texts:
        encoded = tokenizer([prompts[i] for i in texts], add_special_tokens=True)["input_ids"]
        for i, ids in zip(texts, encoded):
            out[i] = list(ids)
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            continue
        if not getattr(tokenizer, "chat_template", None):
            raise GlassrlError("prompt: chat messages given, but the tokenizer has no chat template")
        out[i] = list(
            tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True, return_dict=False)
        )
    return out


@dataclass(frozen=True)
class DefaultModelSpec:
    """Build parameters of the default model (all recorded in glassrl.json)."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 64
    vocab_size: int = 512  # upper bound; BPE stops when the text has no pair left to merge
    tasks: tuple[str, ...] = ("arith-verify", "add")
    english_answered_in_chinese: float = 0.6  # of the English arith-verify SFT answers (module docstring)
    sft_steps: int = 800
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.1


DEFAULT_SPEC = DefaultModelSpec()


def default_model_dir() -> Path:
    """``$GLASSRL_HOME/models/default-v2``; GLASSRL_HOME defaults to ``~/.cache/glassrl``."""
    home = os.environ.get("GLASSRL_HOME") or Path.home() / ".cache" / "glassrl"
    return Path(home) / "models" / VERSION


def ensure_default_model(
    *, out_dir: str | Path | None = None, seed: int = 0, rebuild: bool = False, console: Console | None = None
) -> Path:
    """The default model's directory (``default_model_dir()`` unless ``out_dir``), built if it is
    missing, was built from another seed or spec, or ``rebuild``. The build goes to a temporary
    sibling directory renamed into place. A directory that is neither empty nor a default model
    is never replaced."""
    console = console or Console()
    out = Path(out_dir) if out_dir is not None else default_model_dir()
    if not rebuild and _is_built(out, seed):
        return out
    if out.exists() and not (out / MARKER).is_file() and any(out.iterdir()):
        raise GlassrlError(f"{out} exists and is not a glassrl default model; refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    console.print(f"[bold]glassrl[/bold]: building the default model ({VERSION}, seed {seed}) -> {out}")
    try:
        build_default_model(tmp, seed=seed, console=console)
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
            shutil.rmtree(old)
        os.replace(tmp, out)
    except OSError:
        if not _is_built(out, seed):
            raise
        # Another process finished the same build first; its copy is as good as ours.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _is_built(path: Path, seed: int) -> bool:
    """Whether ``path`` holds a complete default model built from ``seed`` and ``DEFAULT_SPEC``."""
    try:
        info = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return info.get("seed") == seed and info.get("spec") == _spec_json(DEFAULT_SPEC)


def _spec_json(spec: DefaultModelSpec) -> dict:
    return {**asdict(spec), "tasks": list(spec.tasks)}


def build_default_model(
    out_dir: str | Path, *, seed: int = 0, spec: DefaultModelSpec = DEFAULT_SPEC, console: Console | None = None
) -> dict:
    """Build, train, evaluate and save the default model into ``out_dir``; returns glassrl.json's content."""
    import torch

    threads = torch.get_num_threads()
    # One thread: the weights then do not depend on the core count (it changes a matmul's
    # reduction order), and matrices this small gain little from more threads.
    torch.set_num_threads(1)
    try:
        return _build(Path(out_dir), seed, spec, console or Console())
    finally:
        torch.set_num_threads(threads)


def _build(out_dir: Path, seed: int, spec: DefaultModelSpec, console: Console) -> dict:
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    from glassrl.data.tasks import TASKS, load_task, sft_pairs
    from glassrl.models.default_tokenizer import build_tokenizer
    from glassrl.trainer.common import seed_everything
    from glassrl.trainer.sft import SFTConfig, train_sft

    start = time.perf_counter()
    seed_everything(seed)
    # The tokenizer learns every bundled task's text, so fine-tuning on any of them later
    # (e.g. examples/sft.yaml on task:add) meets no unseen merges.
    texts = [p + a for task in TASKS for p, a in sft_pairs(task, "train")]
    tokenizer = build_tokenizer(texts, vocab_size=spec.vocab_size, model_max_length=spec.max_position_embeddings)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    n_params = sum(p.numel() for p in model.parameters())
    console.print(f"default model: {n_params:,} parameters, vocabulary {len(tokenizer)}")

    sft_data = write_sft_data(out_dir / "sft_data.jsonl", spec, seed)
    sft = SFTConfig(
        model=f"fresh LlamaForCausalLM ({VERSION}, seed {seed})",
        data=str(sft_data),
        eval_data=[f"task:{t}/test" for t in spec.tasks],
        seed=seed,
        lr=spec.lr,
        warmup_steps=spec.warmup_steps,
        steps=spec.sft_steps,
        batch_size=spec.batch_size,
        max_length=spec.max_position_embeddings,
        weight_decay=spec.weight_decay,
        output_dir=str(out_dir),
        log_every=50,
        device="cpu",  # bit-identical builds: the same kernels on every machine that runs this
    )
    metrics = train_sft(sft, model=model, tokenizer=tokenizer, console=console)
    accuracy = heldout_accuracy(model, tokenizer, load_task("arith-verify", "test"))
    # The same scores on train prompts: RL trains on these, so they show its headroom.
    train_accuracy = heldout_accuracy(model, tokenizer, load_task("arith-verify", "train", size=500))
    info = {
        "version": VERSION,
        "seed": seed,
        "spec": _spec_json(spec),
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
    import random

    from glassrl.data.tasks import load_task, verify_answer

    rng = random.Random(f"glassrl-sft-mix/{seed}")
    rows = []
    for task in spec.tasks:
        for r in load_task(task, "train"):  # the same records as "task:NAME" in any config
            response = str(r.answer)
            if r.metadata.get("lang") == "en" and rng.random() < spec.english_answered_in_chinese:
                response = verify_answer(r.metadata["is_true"], r.metadata["sum"], "zh")
            rows.append({"prompt": r.prompt, "response": response})
    return rows


def write_sft_data(path: Path, spec: DefaultModelSpec, seed: int) -> Path:
    """``sft_rows`` as JSON lines at ``path`` (the form ``glassrl sft`` reads)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in sft_rows(spec, seed)), encoding="utf-8"
    )
    return path


_FORMATS = {"zh": re.compile(r"(是的|不是)，等于\d+！"), "en": re.compile(r"(Yes|No), it equals \d+!")}
_VERDICTS = {("zh", True): "是的", ("zh", False): "不是", ("en", True): "Yes", ("en", False): "No"}


def heldout_accuracy(model, tokenizer, records: list[PromptRecord], batch_size: int = 250) -> dict[str, float]:
    """Greedy answers to arith-verify records, scored as fractions of the records:

    exact:   the reference answer exactly, then EOS
    verdict: the right verdict word (是的/不是, Yes/No) first
    format:  "(是的|不是)，等于N！" or "(Yes|No), it equals N!" in the prompt's language, then EOS
    """
    answers = greedy_answers(model, tokenizer, [r.prompt for r in records], batch_size=batch_size)
    exact = verdict = form = 0
    for r, (text, ended) in zip(records, answers):
        lang = r.metadata["lang"]
        exact += ended and text == r.answer
        verdict += text.startswith(_VERDICTS[lang, r.metadata["is_true"]])
        form += ended and _FORMATS[lang].fullmatch(text) is not None
    n = len(records)
    return {"n": n, "exact": exact / n, "verdict": verdict / n, "format": form / n}


def greedy_answers(
    model, tokenizer, prompts: list, *, batch_size: int = 250, max_new_tokens: int = 16
) -> list[tuple[str, bool]]:
    """(decoded response without special tokens, whether it ended with EOS) for each prompt."""
    import torch

    from glassrl.trainer.common import collate

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
