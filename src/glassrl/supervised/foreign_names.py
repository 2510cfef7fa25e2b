"""TRL's names for the supervised commands' keys (docs/trl-verl.md, "Supervised: SFT, reward model,
DPO family"): the hint an unknown key gets (:func:`foreign_hints`), so that ``glassrl dpo
learning_rate=1e-6`` answers "did you mean optim.lr?". :func:`foreign_hints` turns a table into
the hints, for these tables and glassrl.rl.foreign_names' (TRL's and verl's RL names).

TRL's DPOConfig, KTOConfig, CPOConfig, ORPOConfig and BCOConfig map to PreferenceConfig, its
SFTConfig to SFTConfig, its RewardConfig to RMConfig. A TRL name that glassrl spells the same
(``beta``, ``label_smoothing``, ``rpo_alpha``, ``max_length``, ``max_prompt_length``, ...) needs no hint.
"""

from __future__ import annotations

TABLE = "docs/trl-verl.md"


def foreign_hints(table: dict[str, str], doc: str) -> dict[str, str]:
    """A config class's ``FOREIGN_NAMES`` from a table {another library's key: "KEY (how it
    differs)" or "no such key ...: why"}: each entry as the parenthesis of an unknown-key error,
    ending with ``doc``, the page that has the table ("did you mean KEY? how it differs; DOC")."""
    hints = {}
    for name, text in table.items():
        if text.startswith("no such key"):
            hints[name] = f"{text}; {doc}"
            continue
        key, _, note = text.partition(" (")
        hints[name] = f"did you mean {key}? {note[:-1] + '; ' if note else ''}{doc}"
    return hints


# TrainingArguments, shared by every TRL trainer config
COMMON = {
    "learning_rate": "optim.lr",
    "lr_scheduler_type": "optim.decay (linear, cosine or constant)",
    "warmup_ratio": "optim.warmup_ratio",
    "warmup_steps": "optim.warmup_steps",
    "weight_decay": "optim.weight_decay",
    "max_grad_norm": "optim.grad_clip",
    "max_steps": "steps",
    "logging_steps": "log_every",
    "eval_steps": "eval_every",
    "model_name_or_path": "model",
    "dataset_name": "data",
    "train_dataset": "data",
    "eval_dataset": "eval_data",
    "per_device_eval_batch_size": "batch_size (held-out examples are scored batch_size at a time)",
    "report_to": "no such key: metrics.jsonl, and glassrl report for the curves",
    "gradient_checkpointing": "no such key yet: the whole batch's activations are kept",
}

PREFERENCE = COMMON | {
    "per_device_train_batch_size": (
        "micro_batch_size (pairs per forward/backward pass; glassrl's batch_size is the optimiser's: "
        "per_device_train_batch_size × gradient_accumulation_steps × devices)"
    ),
    "gradient_accumulation_steps": "micro_batch_size (passes per optimiser step = batch_size / micro_batch_size)",
    "num_train_epochs": "epochs",
    "save_steps": "checkpoint_every",
    "save_total_limit": "keep_checkpoints",
    "loss_type": (
        "loss (sigmoid: dpo, ipo: ipo on sums of log-probs, bco_pair: bco; CPOTrainer's simpo: simpo; "
        "ORPOTrainer, CPOTrainer, KTOTrainer: orpo, cpo, kto)"
    ),
    "ref_model": "reference",
    "model_adapter_name": "lora",
    "peft_config": "lora",
    "bf16": "compute_dtype=bfloat16",
    "fp16": "compute_dtype=bfloat16 (float16 autocast is not offered)",
    "desirable_weight": "kto_desirable_weight",
    "undesirable_weight": "kto_undesirable_weight",
    "precompute_ref_log_probs": "no such key: π_ref's log-probs are always computed once, before the first step",
    "sync_ref_model": "no such key yet in glassrl dpo: glassrl train's algo.kl.ref_sync_every is TR-DPO's update",
    "reference_free": "loss (simpo, cpo and orpo read no reference)",
    "use_weighting": "no such key yet: WPO's weights",
    "ld_alpha": "no such key yet: LD-DPO",
}

SFT = COMMON | {
    "per_device_train_batch_size": (
        "batch_size (one forward/backward pass per optimiser step: "
        "batch_size = per_device_train_batch_size × gradient_accumulation_steps × devices)"
    ),
    "gradient_accumulation_steps": "batch_size (= per_device_train_batch_size × gradient_accumulation_steps)",
    "num_train_epochs": "epochs (with steps: null)",
    "max_seq_length": "max_length (a longer example is an error naming it)",
    "dataset_text_field": "no such key: data rows are prompt/response (or messages)",
    "completion_only_loss": "no such key: the loss is always on the response tokens only",
    "packing": "no such key yet: examples are padded, not packed",
    "bf16": "no such key yet in glassrl sft: it trains in float32",
}

REWARD = COMMON | {
    "per_device_train_batch_size": (
        "batch_size (pairs per optimiser step, one pass: "
        "batch_size = per_device_train_batch_size × gradient_accumulation_steps × devices)"
    ),
    "gradient_accumulation_steps": "batch_size (= per_device_train_batch_size × gradient_accumulation_steps)",
    "num_train_epochs": "steps (epochs × pairs / batch_size)",
    "center_rewards_coefficient": "no such key yet: the rewards are not centred",
    "max_prompt_length": "max_length (prompt + response; a longer pair is an error naming it)",
    "bf16": "no such key yet in glassrl rm: it trains in float32",
}

PREFERENCE_NAMES = foreign_hints(PREFERENCE, TABLE)
SFT_NAMES = foreign_hints(SFT, TABLE)
REWARD_NAMES = foreign_hints(REWARD, TABLE)
