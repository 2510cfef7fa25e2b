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


# The tiny default-format model of the tiny_model_dir fixture (tests/conftest.py)
TINY_SPEC = dict(
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
    sft_steps=150,
    batch_size=32,
    lr=1e-2,
    warmup_steps=10,
)

# One actor rank and one rollout rank placed apart on the tests' 2-CPU Ray cluster (the vLLM tests).
RAY_ROLLOUT_APART = [
    "trainer.backend=ray",
    "ray.actor.world_size=1",
    "ray.actor.resources={CPU: 0.25}",
    "ray.reference.resources={CPU: 0.25}",
    "ray.rollout.placement=apart",
    "ray.rollout.world_size=1",
    "ray.rollout.resources={CPU: 0.25}",
]


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


def write_pairs(path: Path, split: str, size: int) -> Path:
    """The first ``size`` bundled preference pairs of ``split`` as JSON lines (prompt, chosen, rejected)."""
    from glassrl.data.preferences import preference_pairs

    rows = [
        {"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in preference_pairs(split, size=size)
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


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


class HfPolicy:
    """What the actor's "hf" checkpoint part saves: the (peft) model and its tokenizer."""

    def __init__(self, model, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer

    def save_pretrained(self, path) -> None:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)


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


# Qwen2.5-Instruct's chat template, as published in its tokenizer_config.json: the hermes call format.
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def byte_level_bpe(texts: Sequence[str], specials: Sequence[str], vocab_size: int):
    """A ``tokenizers`` byte-level BPE trained on ``texts``, ``specials`` its first ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def chatml_tokenizer(texts: Sequence[str], vocab_size: int = 400):
    """A tiny byte-level BPE trained on ``texts`` with Qwen's <|im_start|>/<|im_end|>, the
    template QWEN_LIKE, and EOS <|endoftext|>: not <|im_end|>, as in Qwen2.5's base tokenizer."""
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = byte_level_bpe(texts, specials, vocab_size)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=specials[1:],
        chat_template=QWEN_LIKE,
        padding_side="left",
    )


def tiny_qwen2_dir(
    directory: Path, texts: Sequence[str], tokenizer_config: dict, positions: int = 256, hidden_size: int = 16
) -> Path:
    """A Qwen2 model with random weights and a byte-level BPE with <|im_start|>/<|im_end|> trained
    on ``texts``, saved as a Hugging Face directory (nothing downloaded): the tokenizer's files are
    ``tokenizer.json`` and ``tokenizer_config.json`` = ``tokenizer_config`` (its class, its special
    tokens), the model's vocab_size the BPE's own, so a token transformers adds lies outside it.
    2 query heads, 1 key/value head (grouped), attention biases: heads of ``hidden_size`` / 2."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = byte_level_bpe(texts, ["<|im_start|>", "<|im_end|>"], 320)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": QWEN_LIKE, **tokenizer_config}))
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=positions,
    )
    Qwen2ForCausalLM(config).save_pretrained(directory)
    return directory


def adam_weights_close(a: dict, b: dict, *, tight: float, lr: float) -> str | None:
    """Why two float32 weight sets after a few AdamW steps are not "the same update summed in another order",
    or None. Adam's g/√v turns the rounding of a near-zero gradient (another summation order: ranks, packed
    rows, another CPU's kernels) into up to ±lr per step on that element, so a few elements may part by more
    than rounding: every element must agree within 2.5 % of one step (``lr``; a step taken or skipped wrongly
    moves weights by ~lr), and all but 0.1 % of them within ``tight``."""
    worst, beyond, total = 0.0, 0, 0
    for key, w in a.items():
        d = (w.detach().cpu().float() - b[key].detach().cpu().float()).abs()
        worst = max(worst, d.max().item())
        beyond += int((d > tight).sum())
        total += d.numel()
    if worst > 0.025 * lr:
        return f"max |Δw| = {worst:.3g} > 2.5 % of one step ({0.025 * lr:.3g})"
    if beyond > 1e-3 * total:
        return f"{beyond} of {total} weights differ by more than {tight:g}"
    return None


def gradients_before_each_step(model, optimizer) -> list:
    """Wraps ``optimizer.step`` (after any LR scheduler has wrapped it) so that each call first keeps the model's
    gradient, every parameter's flattened and concatenated: glassrl.optim.guarded_step frees the gradients right
    after the step, so a test reads them here."""
    import torch

    seen, step = [], optimizer.step

    def recording(*args, **kwargs):
        seen.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        return step(*args, **kwargs)

    optimizer.step = recording
    return seen
