"""TRL's and verl's config names, and the glassrl key each one is (docs/trl-verl.md has the table
with the differences in meaning): the hint a config error gives for an unknown key
(glassrl.config: ``TrainConfig.FOREIGN_NAMES``), so that ``num_generations=8`` answers
"did you mean rollout.n?".

Keys are as the loader reports them: a top-level name, or ``section.name`` under a section that
glassrl also has (``data.``, ``trainer.``); a verl section glassrl lacks (``actor_rollout_ref``,
``algorithm``) is reported by its own name.
"""

from __future__ import annotations

from glassrl.supervised.foreign_names import foreign_hints

TABLE = "docs/trl-verl.md"

TRL = {
    "num_generations": "rollout.n (TRL's completions per prompt)",
    "per_device_train_batch_size": (
        "batch.prompts_per_step (glassrl counts prompts; TRL counts completions: "
        "prompts_per_step = per_device_train_batch_size × devices × gradient_accumulation_steps / num_generations)"
    ),
    "gradient_accumulation_steps": (
        "batch.mini_batch_prompts and batch.micro_batch_responses (one optimiser step per mini-batch)"
    ),
    "num_iterations": "batch.epochs (TRL's μ: passes over a step's responses)",
    "beta": "algo.kl.coef (TRL puts β·KL in the loss, k3: algo.kl.placement=loss, algo.kl.kind=k3)",
    "epsilon": "algo.clip_low",
    "epsilon_high": "algo.clip_high",
    "loss_type": "algo.loss_agg (grpo: seq-mean-token-mean, bnpo/dapo: token-mean, dr_grpo: seq-mean-token-sum-norm)",
    "scale_rewards": "algo.advantage (true/group: grpo, scaled by the group's std; false/none: dr_grpo, not scaled)",
    "importance_sampling_level": "algo.policy_loss (token: ppo_clip, sequence: gspo)",
    "mask_truncated_completions": "algo.mask_truncated",
    "max_prompt_length": (
        "data.max_prompt_tokens (with data.overlong_prompts=truncate_left to cut from the left as TRL does)"
    ),
    "max_completion_length": "rollout.max_new_tokens",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "top_k": "rollout.top_k",
    "min_p": "rollout.min_p",
    "repetition_penalty": "rollout.repetition_penalty",
    "use_vllm": "rollout.engine=vllm",
    "sync_ref_model": "algo.kl.ref_sync_every (the steps between updates of π_ref; 0 = off)",
    "ref_model_sync_steps": "algo.kl.ref_sync_every",
    "ref_model_mixup_alpha": "algo.kl.ref_sync_alpha",
    "learning_rate": "actor_optim.lr",
    "lr_scheduler_type": "actor_optim.decay (linear, cosine or constant)",
    "warmup_ratio": "actor_optim.warmup_ratio",
    "warmup_steps": "actor_optim.warmup_steps",
    "weight_decay": "actor_optim.weight_decay",
    "max_grad_norm": "actor_optim.grad_clip",
    "max_steps": "steps",
    "num_train_epochs": "steps (training steps: epochs × prompts / batch.prompts_per_step)",
    "reward_funcs": "reward.sources ([{name: user_function, spec: rewards.py:fn, style: trl}])",
    "reward_weights": "reward.sources.N.weight",
    "logging_steps": "logging.log_every",
    "save_steps": "logging.checkpoint_every",
    "eval_steps": "logging.eval_every",
    "report_to": "logging.wandb / logging.tensorboard / logging.mlflow",
    "bf16": "model.compute_dtype=bfloat16",
    "model_name_or_path": "model.actor",
    "dataset_name": "data.train",
}

VERL = {
    "actor_rollout_ref": "model.actor, rollout.*, actor_optim.*, batch.* (verl's actor_rollout_ref.*)",
    "algorithm": "algo (adv_estimator: algo.advantage, gamma: algo.gamma, lam: algo.lam, kl_ctrl: algo.kl)",
    "critic": "model.critic and critic_optim",
    "reward_model": "reward.sources ([{name: reward_model, path: DIR}])",
    "custom_reward_function": "reward.sources ([{name: user_function, spec: file.py:compute_score, style: verl}])",
    "data.train_files": "data.train",
    "data.val_files": "data.test",
    "data.train_batch_size": "batch.prompts_per_step (verl counts prompts too)",
    "data.max_prompt_length": "data.max_prompt_tokens",
    "data.max_response_length": "rollout.max_new_tokens",
    "data.truncation": "data.overlong_prompts (error, drop or truncate_left)",
    "trainer.total_training_steps": "steps",
    "trainer.total_epochs": "steps (training steps: epochs × prompts / batch.prompts_per_step)",
    "trainer.save_freq": "logging.checkpoint_every",
    "trainer.test_freq": "logging.eval_every",
    "trainer.default_local_dir": "output_dir",
    "trainer.n_gpus_per_node": "ray.actor.world_size with ray.actor.resources={GPU: 1}",
    "trainer.project_name": "logging.wandb.project",
    "trainer.experiment_name": "logging.wandb.name",
    "trainer.logger": "logging.wandb / logging.tensorboard / logging.mlflow",
}


# the loader's key -> the text in parentheses after "unknown key NAME"
FOREIGN_NAMES = foreign_hints({**TRL, **VERL}, TABLE)
