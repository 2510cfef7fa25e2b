"""Plain helpers the test directories share: ``from helpers import …`` (pyproject puts tests/ on
pytest's pythonpath). Fixtures live in the conftest.py files; this module holds what they and
the tests call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from transformers import LlamaConfig

from glassrl.rewards import RewardRequest, RewardResult

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def flat_ledger_rows(text: str) -> list[dict]:
    """The token rows of a ledger file's text, each with its response's row merged in: the flat
    rows (``Ledger.rows``) of the file that holds each response's fields once."""
    flat, head = [], {}
    for row in map(json.loads, text.splitlines()):
        if row["kind"] == "response":
            head = row
        else:
            flat.append({**head, **row})
    return flat


def tiny_llama_config(vocab_size: int, **overrides) -> LlamaConfig:
    """A Llama of a few thousand parameters: hidden 32, one layer, 2 heads; ``overrides`` set any
    other LlamaConfig field."""
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaConfig(**(fields | overrides))


def tiny_run_overrides(model: Path, prompt_files: tuple[Path, Path], out: Path) -> list[str]:
    """Overrides that make any TrainConfig a seconds-long run of ``model`` on the (train, test)
    prompt files, writing to ``out``: 2 steps of 4 prompts × 4 responses, a ledger every step."""
    train, test = prompt_files
    return [
        f"model.actor={model}",
        f"data.train={train}",
        f"data.test={test}",
        "data.eval_size=8",
        f"output_dir={out}",
        "steps=2",
        "rollout.n=4",
        "rollout.max_new_tokens=16",
        "batch.prompts_per_step=4",
        "batch.mini_batch_prompts=2",
        "batch.micro_batch_responses=4",
        "logging.ledger_every=1",
        "logging.checkpoint_every=0",
    ]


def preset_trainer(preset: str, overrides: Sequence[str], **trainer_kwargs):
    """A Trainer for examples/<preset>.yaml with ``overrides``, its progress bar off."""
    # imported here: the tests that import this module for a model config or a stub source
    # do not load the trainer
    from glassrl.config import load_config
    from glassrl.rl.config import TrainConfig
    from glassrl.rl.loop import Trainer

    return Trainer(
        load_config(TrainConfig, EXAMPLES / f"{preset}.yaml", list(overrides)), progress=False, **trainer_kwargs
    )


class FixedResults:
    """A reward source that answers each response with the result given for it (a stand-in for a
    verifier, judge or reward model whose outcome a test chooses)."""

    def __init__(self, by_response: dict[str, RewardResult], name: str = "stub") -> None:
        self.by_response = by_response
        self.name = name

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        return [self.by_response[r.response] for r in requests]


# Qwen2.5-Instruct's template without the tools branch: a default system message when none is given.
QWEN_LIKE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def chatml_tokenizer(texts: Sequence[str], vocab_size: int = 400):
    """A tiny byte-level BPE trained on ``texts`` with Qwen's <|im_start|>/<|im_end|>, the
    template QWEN_LIKE, and EOS <|endoftext|>: not <|im_end|>, as in Qwen2.5's base tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=specials[1:],
        chat_template=QWEN_LIKE,
        padding_side="left",
    )
