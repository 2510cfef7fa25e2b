"""Plain helpers the test directories share: ``from helpers import …`` (pyproject puts tests/ on
pytest's pythonpath). Fixtures live in the conftest.py files; this module holds what they and
the tests call.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from transformers import LlamaConfig

from glassrl.rewards import RewardRequest, RewardResult

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


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
    from glassrl.trainer.config import TrainConfig
    from glassrl.trainer.loop import Trainer

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
