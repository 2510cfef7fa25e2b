"""The reasoning-gym model's build recipe: a small model made for one task nobody here wrote.

reasoning-gym's ``chain_sum`` (reasoning_gym/arithmetic/chain_sum.py): "State the final answer to
the following arithmetic problem: 7 - 8 + 5 =" → "4", entries drawn from a seed. glassrl's bundled
models know only glassrl's own tasks, so ``ensure_reasoning_gym_model()`` builds (or installs the
shipped weights of, glassrl.builtin.shipped) a model for it, as the agent model is built
(:func:`glassrl.builtin.agent_model.train_on_transcripts`, same cache rules, ``model.actor:
default-rg``):

1. ``spec.sft_examples`` entries of the spec's dataset and config from the **training seed**
   (``train_seed``), answered with the reference answer (``sft_data.jsonl``);
2. a byte-level BPE tokenizer trained on that text (:mod:`glassrl.models.default_tokenizer`, one
   piece per digit), so every character reasoning-gym writes here is covered;
3. a 4-layer ``LlamaForCausalLM``, SFT for ``spec.sft_steps``: stopped half-way, on purpose, so the
   arithmetic is only partly right, its errors near-misses of uncertain answers, and GRPO has groups
   whose answers differ;
4. greedy held-out accuracy on ``spec.eval_size`` entries of the **evaluation seed** (``eval_seed``),
   scored by the dataset's own ``score_answer`` (glassrl.agents.hubs.reasoning_gym.score), and
   :func:`headroom` there (sampled pass@k, p(right | greedy wrong));
5. ``glassrl.json`` written last; the directory renamed into place.

It needs the reasoning-gym extra (``pip install 'glassrl[reasoning-gym]'``) only to be built; the
shipped weights install without it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from rich.console import Console

from glassrl.agents.hubs import reasoning_gym as rg
from glassrl.builtin.agent_model import Episode, train_on_transcripts
from glassrl.builtin.default_model import ensure_built, greedy_answers, one_thread
from glassrl.data.collate import collate, encode_responses
from glassrl.data.formatting import format_prompts
from glassrl.data.records import PromptRecord
from glassrl.models.default_model import MARKER, default_model_dir
from glassrl.models.default_tokenizer import build_tokenizer
from glassrl.models.loading import load_causal_lm, load_tokenizer
from glassrl.optim import seed_everything
from glassrl.supervised.reference import sequence_logprobs

RG_MODEL = "default-rg"  # its name for model.actor
RG_VERSION = "default-rg-v2"


@dataclass(frozen=True)
class ReasoningGymModelSpec:
    """Build parameters of the reasoning-gym model (all recorded in glassrl.json; module docstring)."""

    # v2: 4.3 M parameters, 4 layers; v1 was 2 layers of 128 (564 k), which SFT left systematically
    # wrong (docs/agentic.md, "A task nobody here wrote": what GRPO can and cannot turn into accuracy)
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 8
    intermediate_size: int = 1024
    max_position_embeddings: int = 64  # the question ~20 tokens, the answer ≤ 4
    vocab_size: int = 384  # upper bound
    dataset: str = "chain_sum"
    min_terms: int = 2
    max_terms: int = 3
    min_digits: int = 1
    max_digits: int = 1  # one-digit terms, 2 or 3 of them: 4,200 questions, some never in the SFT data
    train_seed: int = 1  # entries SFT and training see
    eval_seed: int = 1_000_000  # entry i of seed s is entry i+1 of seed s-1 (Random(seed + idx)): seeds far apart
    sft_examples: int = 4000
    sft_steps: int = 400  # stopped half-way: 60.5 % greedy held-out, pass@8 84 % (800 steps: 89.5 %, pass@8 98 %)
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 30
    weight_decay: float = 0.1
    eval_size: int = 200

    def config(self) -> dict:
        """The dataset's config fields (reasoning-gym's ChainSumConfig)."""
        keys = ("min_terms", "max_terms", "min_digits", "max_digits")
        return {k: getattr(self, k) for k in keys}


RG_SPEC = ReasoningGymModelSpec()


def ensure_reasoning_gym_model(
    *, out_dir: str | Path | None = None, seed: int = 0, rebuild: bool = False, console: Console | None = None
) -> Path:
    """The model's directory (``default_model_dir(RG_VERSION)`` unless ``out_dir``), built if missing."""
    console = console or Console()
    out = Path(out_dir) if out_dir is not None else default_model_dir(RG_VERSION)
    build = lambda tmp: build_reasoning_gym_model(tmp, seed=seed, console=console)  # noqa: E731
    return ensure_built(out, seed, RG_SPEC, RG_VERSION, build, rebuild, console)


def build_reasoning_gym_model(
    out_dir: str | Path, *, seed: int = 0, spec: ReasoningGymModelSpec = RG_SPEC, console: Console | None = None
) -> dict:
    """Build, train, evaluate and save the model into ``out_dir``; returns glassrl.json's content."""
    return one_thread(lambda: _build(Path(out_dir), seed, spec, console or Console()))


def _build(out_dir: Path, seed: int, spec: ReasoningGymModelSpec, console: Console) -> dict:
    start = time.perf_counter()
    seed_everything(seed)
    train = rg.records(spec.dataset, seed=spec.train_seed, size=spec.sft_examples, config=spec.config())
    episodes = [Episode(r, "answer", (str(r.answer),), ()) for r in train]
    texts = [str(r.prompt) for r in train] + [str(r.answer) for r in train]
    tokenizer = build_tokenizer(texts, vocab_size=spec.vocab_size, model_max_length=spec.max_position_embeddings)
    model, info = train_on_transcripts(
        out_dir, seed, spec, RG_VERSION, "reasoning-gym model", episodes, ("answer",), tokenizer, console
    )
    held_out = rg.records(spec.dataset, seed=spec.eval_seed, size=spec.eval_size, config=spec.config())
    unseen = [r for r in held_out if r.prompt not in {t.prompt for t in train}]
    info = {
        **info,
        "heldout_reasoning_gym": {
            "n": len(held_out),
            "accuracy": accuracy(model, tokenizer, held_out),
            "unseen": len(unseen) / len(held_out),  # the questions no SFT example asked
            "accuracy_unseen": accuracy(model, tokenizer, unseen),
        },
        "train_reasoning_gym": {"n": spec.eval_size, "accuracy": accuracy(model, tokenizer, train[: spec.eval_size])},
        "heldout_headroom": _seeded_headroom(model, tokenizer, held_out, seed),
        "build_time_s": round(time.perf_counter() - start, 1),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    (out_dir / MARKER).write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return info


def _seeded_headroom(model, tokenizer, records: list[PromptRecord], seed: int) -> dict:
    torch.manual_seed(seed)
    return headroom(model, tokenizer, records)


def accuracy(model, tokenizer, records: list[PromptRecord]) -> float:
    """Mean of the dataset's ``score_answer`` over greedy answers to ``records``."""
    answers = greedy_answers(model, tokenizer, [r.prompt for r in records], max_new_tokens=8)
    return sum(rg.score("", text, r.answer, r.metadata) for (text, _), r in zip(answers, records)) / len(records)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of ``c`` right answers among ``n`` samples: 1 - C(n-c, k) / C(n, k)
    (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1)."""
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


@torch.no_grad()
def headroom(
    model, tokenizer, records: list[PromptRecord], *, n: int = 16, ks: tuple[int, ...] = (8, 16), temperature: float = 1
) -> dict:
    """What GRPO can turn into greedy accuracy, measured before training: greedy accuracy; ``n``
    samples per record at ``temperature`` (plain softmax sampling, as the rollout engine's; seeded
    by the caller), their mean accuracy and pass@k for each of ``ks``; and the probability of the
    reference answer (its tokens and EOS, teacher-forced) where greedy is wrong. GRPO only
    reweights answers its groups sample: it moves pass@1 toward pass@k where pass@k ≫ greedy, and
    a right answer of probability p appears in a group of G with probability 1 - (1 - p)^G."""
    model.eval()
    greedy = [t for t, _ in greedy_answers(model, tokenizer, [r.prompt for r in records], max_new_tokens=8)]
    right = [rg.score("", t, r.answer, r.metadata) == 1.0 for t, r in zip(greedy, records)]
    prompts = format_prompts(tokenizer, [r.prompt for r in records])
    counts = []
    for start in range(0, len(records), 50):
        chunk = collate([(ids, []) for ids in prompts[start : start + 50]], tokenizer.pad_token_id)
        out = model.generate(
            input_ids=chunk["input_ids"],
            attention_mask=chunk["attention_mask"].long(),
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            num_return_sequences=n,
            max_new_tokens=8,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )[:, chunk["input_ids"].shape[1] :]
        texts = tokenizer.batch_decode(out, skip_special_tokens=True)
        for i, r in enumerate(records[start : start + 50]):
            counts.append(sum(rg.score("", t, r.answer, r.metadata) == 1.0 for t in texts[i * n : (i + 1) * n]))
    wrong = [i for i, ok in enumerate(right) if not ok]
    answers = encode_responses(tokenizer, [str(records[i].answer) for i in wrong])
    logprobs = sequence_logprobs(
        model,
        [(prompts[i], a) for i, a in zip(wrong, answers)],
        batch_size=100,
        pad_id=tokenizer.pad_token_id,
        dtype=torch.float32,
    )
    p_right = [float(lp.sum().exp()) for lp in logprobs]
    m = len(records)
    return {
        "n": m,
        "greedy": sum(right) / m,
        f"sampled_mean@{n}": sum(counts) / (n * m),
        **{f"pass@{k}": sum(pass_at_k(n, c, k) for c in counts) / m for k in ks},
        "greedy_wrong": len(wrong),
        "p_right_if_greedy_wrong": sum(p_right) / len(p_right) if p_right else None,
        "share_p_right_over_0.25": sum(p > 0.25 for p in p_right) / len(p_right) if p_right else None,
        "temperature": temperature,
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m glassrl.builtin.reasoning_gym_model [MODEL]``: :func:`headroom` of a model (the
    built default-rg, a GRPO run's output directory, any checkpoint) on the spec's held-out entries."""
    parser = argparse.ArgumentParser(prog="python -m glassrl.builtin.reasoning_gym_model", description=main.__doc__)
    parser.add_argument("model", nargs="?", default=None, help="checkpoint directory (default: the built default-rg)")
    parser.add_argument("--seed", type=int, default=RG_SPEC.eval_seed, help="reasoning-gym seed of the entries")
    parser.add_argument("--size", type=int, default=RG_SPEC.eval_size, help="number of entries")
    parser.add_argument("-n", type=int, default=16, help="samples per entry")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--sample-seed", type=int, default=0, help="torch seed of the sampling")
    args = parser.parse_args(argv)
    path = Path(args.model) if args.model else ensure_reasoning_gym_model()
    model, tokenizer = load_causal_lm(path, device="cpu"), load_tokenizer(path)
    records = rg.records(RG_SPEC.dataset, seed=args.seed, size=args.size, config=RG_SPEC.config())
    torch.manual_seed(args.sample_seed)
    ks = tuple(k for k in (1, 4, 8, 16) if k <= args.n)
    report = one_thread(lambda: headroom(model, tokenizer, records, n=args.n, ks=ks, temperature=args.temperature))
    print(json.dumps({"model": str(path), "seed": args.seed, **report}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
