"""What ``glassrl train CONFIG`` reads: nested typed dataclasses.

    cfg = load_config(TrainConfig, "examples/grpo.yaml", ["algo.clip_high=0.28"])  # checked
    resolved = resolve(cfg)  # glassrl.rl.resolve: made concrete, every size derived
    print_resolved(resolved, console)

Sizes have units (DESIGN §3: one way to say a batch size; glassrl.rl.resolve derives them):
``batch.prompts_per_step`` prompts per training step (global), each sampled ``rollout.n`` times;
``batch.mini_batch_prompts`` prompts per optimiser step; ``batch.micro_batch_responses`` responses
per forward/backward pass (per worker). Optimiser settings count optimiser steps.

Checks (:meth:`TrainConfig.validate` calls glassrl.rl.checks; the loader runs them, and ``resolve``
again; they change nothing): ranges, registry names, consistency, and knobs the chosen algorithm
ignores (``algo.lam`` under GRPO, ``algo.cispo_*`` without CISPO, ``critic_optim.*`` without a
critic, ...), each one GlassrlError line naming the key and why. The optimiser section (:class:`OptimConfig`) and the
top-level ``threads`` (:func:`check_threads`) are shared with the SFT and reward-model configs
(glassrl.supervised.sft, glassrl.supervised.rm).

Each field gives its help with its default (glassrl.config.option): the text of ``glassrl config show``
and docs/config.md. The scale-out sections (trainer, ray) are glassrl.rl.config_ray's, the rollout section
glassrl.rl.config_rollout's, logging glassrl.rl.config_logging's, check glassrl.rl.config_check's.
docs/algorithms/*.md name these keys.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from glassrl import config_paths
from glassrl.algos.advantages import ADVANTAGE_ESTIMATORS
from glassrl.config import option
from glassrl.data.tasks import AGENTIC_TASKS, parse_task
from glassrl.models.lora import LoraConfig
from glassrl.optim import OptimConfig
from glassrl.rl.checks import check_train_config
from glassrl.rl.config_check import CheckConfig
from glassrl.rl.config_logging import LoggingConfig
from glassrl.rl.config_ray import RayConfig, TrainerConfig
from glassrl.rl.config_rollout import AgentConfig, RolloutConfig
from glassrl.rl.foreign_names import FOREIGN_NAMES


@dataclass
class ModelConfig:
    actor: str = option(
        "default",
        help=(
            "policy: checkpoint dir or hub id in the local HF cache, or a run / RUN/checkpoints/step_N (its policy: a "
            "warm start); \"default\" = the built-in model, \"default-agent\" = its tool-using variant"
        ),
    )
    reference: str | None = option(
        None,
        help=(
            "reference policy π_ref (dir, cached hub id, or a run / checkpoint: its policy); null = a frozen initial "
            "actor"
        ),
    )
    critic: str | None = option(
        None,
        help=(
            "critic checkpoint, or a run / checkpoint (its critic); null = the actor + fresh head; reward_model = the "
            "reward model"
        ),
    )
    critic_head: str = option(
        "value-head", help="scalar head of a critic built from a causal LM: value-head | token-classification"
    )
    dtype: str = option(
        "auto", help="weights: auto (float32: the optimiser's master copy) | float32 | bfloat16 | float16"
    )
    device: str = option("auto", help="auto (CUDA when visible) | cpu | cuda | cuda:N")
    compute_dtype: Literal["auto", "float32", "bfloat16"] = option(
        "auto",
        help=(
            "matrix products: auto (bfloat16 on CUDA over float32 weights, else float32) | float32 | bfloat16 "
            "(autocast over float32 master weights)"
        ),
    )
    lora: LoraConfig | None = option(
        None,
        help="LoRA adapters on the actor and the critic (π_ref = the base, adapters off); null = train every weight",
    )
    gradient_checkpointing: bool = option(
        False,
        help=(
            "recompute the decoder layers' activations in backward instead of keeping them (transformers' "
            "gradient_checkpointing_enable, non-reentrant): less memory in the update, about one more forward; "
            "same gradients"
        ),
    )
    padding_free: bool = option(
        False,
        help=(
            "log-prob, value and training passes on the real tokens only, packed side by side "
            "(glassrl.models.packing); same numbers, less work on padding"
        ),
    )
    shared_prefix: bool | Literal["auto"] = option(
        "auto",
        help=(
            "every forward pass (actor, π_ref, critic) packs each micro-batch without padding and computes each "
            "distinct prompt once per chunk, its responses attending it through a tree mask "
            "(glassrl.models.shared_prefix); same numbers to float rounding; auto = on for the local backend on CPU "
            "without padding_free when every model has full attention in every layer (not yet measured on a GPU)"
        ),
    )


@dataclass
class DataConfig:
    train: str | list[dict[str, Any]] = option(
        "task:arith-verify", help="\"task:NAME\", a jsonl/parquet/datasets path, or a mixture [{path, weight}, ...]"
    )
    test: str | None = option(
        None, help="evaluation prompts, same forms; null = the test split of a task:NAME train set, else none"
    )
    prompt_key: str = option(
        "prompt", help="field of the prompt (text or chat messages); a dotted path reaches nested fields"
    )
    answer_key: str = option(
        "answer", help="field of the reference answer, optional per row (verl: reward_model.ground_truth)"
    )
    metadata_keys: list[str] | None = option(
        None, help="fields kept for the rewards (dotted paths); null = every other field"
    )
    chat_template: Literal["auto", "none"] = option(
        "auto", help="auto: text prompts use the tokenizer's template (docs/data.md)"
    )
    system_prompt: str | None = option(None, help="system message put first in every prompt the chat template renders")
    max_prompt_tokens: int | Literal["auto"] = option(
        "auto", help="longest prompt in tokens; auto = positions − max_new_tokens"
    )
    overlong_prompts: Literal["error", "drop", "truncate_left"] = option(
        "error", help="a longer prompt: stop, drop it, or cut it"
    )
    eval_size: int = option(200, help="evaluation prompts used (the first ones of the test set)")
    ptx: str | None = option(
        None, help="PPO-ptx supervised pairs: \"task:NAME\" or a jsonl of prompt/response; used when algo.ptx_coef > 0"
    )


@dataclass
class RewardConfig:
    sources: list[dict[str, Any]] = option(
        factory=lambda: [{"name": "arith_verify", "weight": 1.0}],
        help=(
            "[{name, weight, label, ...arguments}] summed with weights (rewards.build_combined); label: the metrics "
            "name (reward/<label>/mean), default the name"
        ),
    )
    max_failure_rate: float = option(
        0.1, help="a step whose fraction of failed (timeout/error) scores exceeds this stops the run"
    )
    gold: dict[str, Any] | None = option(
        None, help="{name, ...}: scored on the same responses for reward/gold, never trained on"
    )
    control: Literal["none", "random", "shuffled"] = option(
        "none",
        help=(
            "train on a meaningless reward to see what it gives (glassrl.rewards.control; Shao et al. 2025, "
            "arXiv:2506.10947): random = 1 with probability control_p, shuffled = the step's real scores "
            "permuted; held-out eval/… stays scored by the sources"
        ),
    )
    control_p: float = option(0.5, help="reward.control random: the probability of a reward of 1 (the paper's γ)")
    base_dir: str | None = option(
        None,
        help=(
            "where relative file paths in the sources (rewards.py:fn) are read from; null = the config file's "
            "directory (a relative one is joined to it); saved as an absolute path"
        ),
    )


@dataclass
class KLConfig:
    placement: Literal["reward", "loss", "none"] = option(
        "loss", help="where β·KL acts: in the token rewards (PPO), in the loss (GRPO), nowhere"
    )
    kind: str = option("k3", help="per-token estimator: k1 | abs | k2 | k3 (glassrl.algos.kl)")
    coef: float = option(0.001, help="β, the KL coefficient (initial value for the adaptive controller)")
    target: float | None = option(
        None, help="adaptive controller's target KL per token; null = fixed β (placement reward only)"
    )
    horizon: int = option(10000, help="adaptive controller's horizon in responses (Ziegler et al. 2019, §2.2)")
    ref_sync_every: int = option(
        0,
        help=(
            "every N steps π_ref ← α·π_θ + (1 − α)·π_ref, after the update (TR-DPO, Gorbatovski et al. 2024, "
            "arXiv:2404.09656: its soft update, α = 1 its hard update; TRL's sync_ref_model / ref_model_sync_steps); "
            "0 = π_ref stays fixed"
        ),
    )
    ref_sync_alpha: float = option(
        0.6, help="α of ref_sync_every, in (0, 1]: 1 copies π_θ (TR-DPO's hard update); TRL's ref_model_mixup_alpha"
    )


@dataclass
class RolloutISConfig:
    """Truncated importance sampling (TIS) of the train/rollout mismatch: algo.off_policy with
    correction token_tis (glassrl.algos.off_policy)."""

    cap: float = option(2.0, help="C: the per-token weight π_old/π_rollout is cut at C (Yao et al. 2025 use 2)")


@dataclass
class OffPolicyConfig:
    """Weights or masks on the policy loss of tokens another policy μ sampled: an older version (stale,
    rollout.max_staleness) or another engine (glassrl.algos.off_policy, docs/scale-out.md). The clip
    then anchors at π_old, phase 3's pass with the current weights, and ρ_i = π_old(a_i|s_i)/μ(a_i|s_i)."""

    correction: str = option(
        "token_tis",
        help=(
            "token_tis: loss × min(ρ_i, cap) | seq_tis: a response's tokens × min(Π ρ_i, cap) | token_mis: × ρ_i, a "
            "token with ρ_i > cap dropped | seq_mis: × Π ρ_i, a response above cap dropped | icepop: × ρ_i, a token "
            "outside [low, high] dropped | geo_mask: a response whose geometric-mean ρ is outside [low, high] dropped "
            "| decoupled: × ρ_i uncut (AReaL)"
        ),
    )
    cap: float | None = option(None, help="token_tis, seq_tis, token_mis, seq_mis: the cap C on ρ; null = 2")
    low: float | None = option(
        None, help="icepop, geo_mask: the lower bound on ρ; null = 0.5 (icepop), 0.999 (geo_mask)"
    )
    high: float | None = option(
        None, help="icepop, geo_mask: the upper bound on ρ; null = 5 (icepop), 1.001 (geo_mask)"
    )


@dataclass
class OverlongConfig:
    max_length: int = option(16, help="L_max of DAPO's soft overlong punishment, in tokens")
    cache_length: int = option(
        4, help="L_cache: the penalty ramps from 0 to −1 over the last L_cache tokens before L_max"
    )


@dataclass
class AlgoConfig:
    advantage: str = option(
        "grpo", help="advantage estimator (ADVANTAGE_ESTIMATORS): gae, grpo, dr_grpo, rloo, remax, ..."
    )
    policy_loss: str = option(
        "ppo_clip", help="policy loss (POLICY_LOSSES): ppo_clip, dual_clip, gspo, cispo, aspo, clip_cov, reinforce"
    )
    loss_agg: str = option(
        "token-mean",
        help=(
            "aggregation of per-token losses: token-mean | seq-mean-token-mean | seq-mean-token-sum | "
            "seq-mean-token-sum-norm"
        ),
    )
    norm_length: int | None = option(None, help="L of seq-mean-token-sum-norm; null = rollout.max_new_tokens")
    gamma: float = option(1.0, help="discount γ in [0, 1]")
    lam: float = option(1.0, help="GAE λ in [0, 1] (policy advantages)")
    critic_lam: float | None = option(None, help="VAPO decoupled λ for the critic's returns; null = lam")
    length_alpha: float | None = option(None, help="VAPO length-adaptive policy λ = 1 − 1/(α·length); null = lam")
    whiten_advantages: bool = option(
        False, help="whiten advantages over the step's valid tokens before the policy loss (PPO)"
    )
    clip_low: float = option(0.2, help="ε_low: lower clip 1 − ε_low of the ratio")
    clip_high: float = option(0.2, help="ε_high: upper clip 1 + ε_high (DAPO clip-higher when > clip_low)")
    dual_clip_c: float = option(3.0, help="dual-clip c > 1: bound −c·|A| for negative advantages")
    cispo_eps_is_low: float = option(1.0, help="CISPO ε^IS_low of the clipped IS weight")
    cispo_eps_is_high: float = option(0.28, help="CISPO ε^IS_high of the clipped IS weight")
    clip_cov_r: float = option(2e-4, help="Clip-Cov: fraction of tokens whose gradient is detached")
    clip_cov_omega_low: float = option(1.0, help="Clip-Cov: lower bound of the covariance band")
    clip_cov_omega_high: float = option(5.0, help="Clip-Cov: upper bound of the covariance band")
    value_clip: float | None = option(0.2, help="ε_v of the clipped value loss; null = plain squared error")
    entropy_coef: float = option(0.0, help="c₂ of the entropy bonus (loss −= c₂·entropy)")
    kl: KLConfig = option(factory=KLConfig, help="KL penalty against the reference policy")
    ptx_coef: float = option(0.0, help="PPO-ptx: weight of the supervised loss on data.ptx mixed into the actor loss")
    positive_nll_coef: float = option(0.0, help="VAPO μ: weight of the NLL of responses with a positive score")
    overlong: OverlongConfig | None = option(None, help="DAPO soft overlong punishment added to the score; null = off")
    dynamic_sampling: bool = option(False, help="DAPO: resample until the step is full of groups whose scores differ")
    dynamic_sampling_max_rounds: int = option(
        4, help="generation rounds per step before dynamic sampling gives up (error)"
    )
    value_warmup_steps: int = option(0, help="VAPO value pre-training: first steps update the critic only")
    reward_norm: bool = option(False, help="normalise scores with running mean/std of all scores seen")
    reward_init_norm: bool = option(
        False, help="normalise scores by a mean/std fixed on the first step's (initial policy's)"
    )
    no_eos_score: float | None = option(
        None, help="replaces the score of a response without EOS (finish reason length); null = off"
    )
    mask_truncated: bool = option(
        False,
        help=(
            "a response cut at rollout.max_new_tokens leaves the loss (TRL's mask_truncated_completions); its score "
            "still counts in its group's statistics"
        ),
    )
    rollout_is: RolloutISConfig | None = option(
        None,
        help=(
            "truncated importance sampling of the rollout engine's mismatch: policy loss × min(π_old/π_rollout, cap); "
            "null = off; the same as algo.off_policy {correction: token_tis, cap}"
        ),
    )
    off_policy: OffPolicyConfig | None = option(
        None,
        help=(
            "weights or masks for tokens another policy sampled (stale or another engine); null = none: a stale "
            "batch's clip anchors at the policy that sampled it (as rollout.overlap)"
        ),
    )
    score_clip: float | None = option(
        None, help="clip scores (after normalisation) to [−score_clip, score_clip]; null = off"
    )

    def uses_critic(self) -> bool:
        """Whether the advantage estimator reads values V(s_i), i.e. the run trains a critic."""
        return ADVANTAGE_ESTIMATORS[self.advantage].critic


@dataclass
class BatchConfig:
    prompts_per_step: int = option(8, help="prompts per training step (global); responses = prompts × rollout.n")
    mini_batch_prompts: int = option(8, help="prompts per optimiser step; must divide prompts_per_step")
    micro_batch_responses: int = option(
        8, help="responses per forward/backward pass (per worker); must divide a mini-batch's responses"
    )
    max_tokens_per_micro_batch: int | None = option(
        None,
        help=(
            "a token budget per forward pass instead of a count: rows (at most micro_batch_responses), longest "
            "first, while their real tokens (prompt + response) stay within it; a longer row runs alone; the "
            "gradient is the same; null = the count only"
        ),
    )
    epochs: int = option(1, help="passes over the step's responses (PPO epochs)")


@dataclass
class TrainConfig:
    seed: int = option(0, help="seeds every RNG (python, numpy, torch, data order, sampling)")
    steps: int = option(100, help="training steps (each: generate, score, advantages, update)")
    output_dir: str = option("runs/train", help="run directory: config.yaml, metrics.jsonl, ledgers/, checkpoints/")
    threads: int | Literal["auto"] = option(
        "auto",
        help=(
            "intra-op CPU threads of this process: N, or auto = the cores free now (glassrl.models.threads); recorded "
            "in the checkpoints, and a resumed run under auto reuses the recorded count"
        ),
    )
    model: ModelConfig = option(factory=ModelConfig, help="actor, reference, critic")
    data: DataConfig = option(factory=DataConfig, help="prompts")
    rollout: RolloutConfig = option(factory=RolloutConfig, help="sampling")
    reward: RewardConfig = option(factory=RewardConfig, help="reward sources")
    algo: AlgoConfig = option(factory=AlgoConfig, help="estimator, losses, KL, shaping")
    batch: BatchConfig = option(factory=BatchConfig, help="step, mini- and micro-batch sizes")
    actor_optim: OptimConfig = option(factory=OptimConfig, help="actor optimiser and schedule")
    critic_optim: OptimConfig = option(factory=lambda: OptimConfig(lr=1e-4), help="critic optimiser and schedule")
    logging: LoggingConfig = option(factory=LoggingConfig, help="metrics, ledgers, evaluation, checkpoints")
    on_nonfinite: Literal["stop", "skip"] = option(
        "stop", help="a NaN/inf loss or gradient norm: stop the run (exit 2) or skip that optimiser step"
    )
    trainer: TrainerConfig = option(factory=TrainerConfig, help="where the role workers run")
    ray: RayConfig = option(factory=RayConfig, help="the Ray backend's cluster and groups")
    check: CheckConfig = option(factory=CheckConfig, help="the run's checks of itself: the sync truth check")

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
        if agent is not None and agent.endpoint is not None and from_file("rollout.agent.endpoint.agent"):
            agent.endpoint.agent = config_paths.file_spec(agent.endpoint.agent, config_dir)
        if config_paths.given("reward.sources", command_line):  # base_dir is the file's: these are the shell's
            self.reward.sources = [
                {**s, "spec": config_paths.file_spec(s["spec"], cwd)} if isinstance(s, dict) and "spec" in s else s
                for s in self.reward.sources
            ]

    def validate(self, written: Set[str] | None = None) -> None:
        """Every check of the config (ranges, registry names, consistency, knobs the chosen algorithm
        ignores: glassrl.rl.checks); GlassrlError naming the key. ``written``: the dotted keys the user
        wrote (the loader passes them), None to judge a knob by its value against the default. It
        changes nothing: glassrl.rl.resolve makes the config concrete."""
        check_train_config(self, written)

    # What settings mean together, read by the checks (which import no config class) and by
    # glassrl.rl.resolve, which records them once in Resolved.

    def max_staleness(self) -> int:
        """Policy versions a sampled token may lag: rollout.max_staleness, rollout.overlap (its older
        form) read as 1."""
        return 1 if self.rollout.overlap else self.rollout.max_staleness

    def rollout_placement(self) -> str:
        """Where π_θ samples on Ray: ray.rollout.placement, whose default (with_actor) becomes apart when
        sampling ahead (rollout.max_staleness >= 1): that is done by rollout ranks of their own. A
        with_actor the user wrote beside sampling ahead is refused (glassrl.rl.checks), so on a
        checked config this is where it samples."""
        ahead = self.trainer.backend == "ray" and self.rollout.max_staleness > 0
        return "apart" if ahead else self.ray.rollout.placement

    def agentic_tasks(self) -> list[str]:
        """The bundled agentic tasks (glassrl.data.tasks.AGENTIC_TASKS) among data.train's sources, in order."""
        train = self.data.train
        paths = [train] if isinstance(train, str) else [s.get("path", "") for s in train]
        refs = [parse_task(p) for p in paths if isinstance(p, str)]
        return list(dict.fromkeys(r.name for r in refs if r is not None and r.name in AGENTIC_TASKS))


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
    return AgentConfig() if cfg.agentic_tasks() else None
