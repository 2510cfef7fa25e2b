"""The checks of a TrainConfig (glassrl.rl.config): ranges, registry names, consistency, knobs the
chosen algorithm ignores, multi-turn settings and scale-out; each failure one GlassrlError line
naming the key and why. :meth:`TrainConfig.validate` runs :func:`check_train_config`.

The checks read a config, ``cfg`` below (a glassrl.rl.config.TrainConfig), by its fields and by what
its settings mean together (``cfg.max_staleness()``, ``cfg.rollout_placement()``,
``cfg.agentic_tasks()``, ``cfg.algo.uses_critic()``); they change nothing, and they import no config
class: glassrl.rl.config imports this module, so the import points one way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Set

from glassrl.algos.advantages import ADVANTAGE_ESTIMATORS, GROUP_ESTIMATORS
from glassrl.algos.losses import POLICY_LOSSES
from glassrl.config import at_least, check_seed, check_threads, fail, get_dotted, knob_set
from glassrl.data.sources import Source, parse_sources
from glassrl.errors import GlassrlError
from glassrl.optim import OptimConfig


def check_train_config(cfg, written: Set[str] | None = None) -> None:
    """Every check (module docstring); ``written``: the dotted keys the user wrote, None to judge a
    knob by its value against the default."""
    _check_ranges(cfg)
    _check_names(cfg)
    _check_consistency(cfg)
    _check_ignored(cfg, written)
    _check_agent(cfg, written)
    _check_scale_out(cfg, written)


def _divides(part: int, part_key: str, whole: int, whole_key: str, unit: str) -> None:
    if whole % part:
        raise GlassrlError(
            f"{part_key} = {part} does not divide {whole_key} = {whole} {unit}: "
            f"{whole} / {part} = {whole / part:g}; pick a divisor of {whole}"
        )


def _check_ranges(cfg) -> None:
    a, r, b = cfg.algo, cfg.rollout, cfg.batch
    at_least(
        1,
        {
            "steps": cfg.steps,
            "rollout.n": r.n,
            "rollout.max_new_tokens": r.max_new_tokens,
            "batch.prompts_per_step": b.prompts_per_step,
            "batch.mini_batch_prompts": b.mini_batch_prompts,
            "batch.micro_batch_responses": b.micro_batch_responses,
            "batch.max_tokens_per_micro_batch": b.max_tokens_per_micro_batch,
            "batch.epochs": b.epochs,
            "data.max_prompt_tokens": None if cfg.data.max_prompt_tokens == "auto" else cfg.data.max_prompt_tokens,
            "logging.eval_k": cfg.logging.eval_k,
            "algo.kl.horizon": a.kl.horizon,
            "algo.dynamic_sampling_max_rounds": a.dynamic_sampling_max_rounds,
            "logging.log_every": cfg.logging.log_every,
            "logging.keep_checkpoints": cfg.logging.keep_checkpoints,
        },
    )
    at_least(
        0,
        {
            "rollout.top_k": r.top_k,
            "data.eval_size": cfg.data.eval_size,
            "algo.entropy_coef": a.entropy_coef,
            "algo.kl.coef": a.kl.coef,
            "algo.kl.ref_sync_every": a.kl.ref_sync_every,
            "algo.ptx_coef": a.ptx_coef,
            "algo.positive_nll_coef": a.positive_nll_coef,
            "algo.value_warmup_steps": a.value_warmup_steps,
            "logging.ledger_every": cfg.logging.ledger_every,
            "logging.ledger_samples": cfg.logging.ledger_samples,
            "logging.eval_every": cfg.logging.eval_every,
            "logging.checkpoint_every": cfg.logging.checkpoint_every,
            "logging.report_every": cfg.logging.report_every,
            "logging.watch_window": cfg.logging.watch_window,
            "check.sync_probe_every": cfg.check.sync_probe_every,
        },
    )
    if cfg.check.sync_probe_tolerance is not None and not cfg.check.sync_probe_tolerance > 0:
        fail("check.sync_probe_tolerance", cfg.check.sync_probe_tolerance, "must be > 0 (or null: by dtype)")
    if 0 < cfg.logging.watch_window < 3:  # a slope and a jump need two earlier values
        fail("logging.watch_window", cfg.logging.watch_window, "must be 0 (off) or at least 3")
    if not cfg.logging.watch_threshold > 0:
        fail("logging.watch_threshold", cfg.logging.watch_threshold, "must be > 0")
    for key in ("gamma", "lam", "critic_lam"):
        value = getattr(a, key)
        if value is not None and not 0.0 <= value <= 1.0:
            fail(f"algo.{key}", value, "must lie in [0, 1]")
    if not 0.0 <= cfg.reward.max_failure_rate <= 1.0:
        fail("reward.max_failure_rate", cfg.reward.max_failure_rate, "must lie in [0, 1]")
    if not 0.0 <= cfg.reward.control_p <= 1.0:
        fail("reward.control_p", cfg.reward.control_p, "must lie in [0, 1] (a probability)")
    if cfg.reward.control != "none":
        # what a control replaces is the outcome score (and the environment's turn rewards); these pay elsewhere
        if cfg.algo.advantage == "remax":
            fail(
                "reward.control",
                cfg.reward.control,
                "not with algo.advantage remax: its greedy baseline is scored by the real reward",
            )
        if any(s.get("name") == "teacher" for s in cfg.reward.sources):
            fail("reward.control", cfg.reward.control, "not with a teacher source: its per-token rewards are real")
    if not r.temperature > 0:
        fail("rollout.temperature", r.temperature, "must be > 0")
    if not 0.0 < r.top_p <= 1.0:
        fail("rollout.top_p", r.top_p, "must lie in (0, 1]")
    if not 0.0 <= r.min_p < 1.0:
        fail("rollout.min_p", r.min_p, "must lie in [0, 1)")
    if not r.repetition_penalty > 0:
        fail("rollout.repetition_penalty", r.repetition_penalty, "must be > 0 (1 = off)")
    for i, text in enumerate(r.stop):
        if not text:
            fail(f"rollout.stop.{i}", text, "an empty stop string would end every response at its first token")
    for key, value in (
        ("algo.length_alpha", a.length_alpha),
        ("algo.value_clip", a.value_clip),
        ("algo.kl.target", a.kl.target),
        ("algo.norm_length", a.norm_length),
        ("algo.score_clip", a.score_clip),
    ):
        if value is not None and not value > 0:
            fail(key, value, "must be > 0 (or null)")
    if a.overlong is not None and not 0 < a.overlong.cache_length <= a.overlong.max_length:
        fail(
            "algo.overlong.cache_length",
            a.overlong.cache_length,
            f"must satisfy 0 < cache_length <= algo.overlong.max_length ({a.overlong.max_length})",
        )
    check_threads(cfg.threads)
    check_seed(cfg.seed)
    cfg.actor_optim.check("actor_optim")
    cfg.critic_optim.check("critic_optim")
    loss_params(a)


def loss_params(algo):
    """The policy-loss parameters (glassrl.algos.losses.PolicyLossParams) named in ``algo``."""
    from glassrl.algos.losses import PolicyLossParams

    names = [f.name for f in dataclasses.fields(PolicyLossParams)]
    try:
        return PolicyLossParams(**{name: getattr(algo, name) for name in names})
    except (ValueError, GlassrlError) as err:  # "PolicyLossParams.clip_low = ..." -> "algo.clip_low = ..."
        raise GlassrlError(str(err).replace("PolicyLossParams.", "algo.")) from None


def _check_names(cfg) -> None:
    from glassrl.algos.aggregation import AGGREGATIONS
    from glassrl.algos.kl import KL_ESTIMATORS
    from glassrl.rewards import REWARD_SOURCES

    registries = [
        ("algo.advantage", cfg.algo.advantage, ADVANTAGE_ESTIMATORS),
        ("algo.policy_loss", cfg.algo.policy_loss, POLICY_LOSSES),
        ("algo.loss_agg", cfg.algo.loss_agg, AGGREGATIONS),
        ("algo.kl.kind", cfg.algo.kl.kind, KL_ESTIMATORS),
        ("model.critic_head", cfg.model.critic_head, ("value-head", "token-classification")),
    ]
    for key, value, registry in registries:
        if value not in registry:
            fail(key, value, f"unknown; valid: {', '.join(registry)}")
    if not cfg.reward.sources:
        fail("reward.sources", cfg.reward.sources, "needs at least one source {name, weight, ...}")
    for i, source in enumerate(cfg.reward.sources):
        if source.get("name") not in REWARD_SOURCES:
            fail(f"reward.sources[{i}].name", source.get("name"), f"unknown; valid: {', '.join(REWARD_SOURCES)}")
    if cfg.reward.gold is not None and cfg.reward.gold.get("name") not in REWARD_SOURCES:
        fail("reward.gold.name", cfg.reward.gold.get("name"), f"unknown; valid: {', '.join(REWARD_SOURCES)}")


def _check_consistency(cfg) -> None:
    a, b, n = cfg.algo, cfg.batch, cfg.rollout.n
    parse_sources(cfg.data.train, "data.train", Source(""))  # a mixture's entries: paths, weights > 0, keys
    _divides(b.mini_batch_prompts, "batch.mini_batch_prompts", b.prompts_per_step, "batch.prompts_per_step", "prompts")
    _divides(
        b.micro_batch_responses,
        "batch.micro_batch_responses",
        b.mini_batch_prompts * n,
        f"a mini-batch (batch.mini_batch_prompts × rollout.n = {b.mini_batch_prompts} × {n})",
        "responses",
    )
    if a.advantage in GROUP_ESTIMATORS and n < 2:
        fail("rollout.n", n, f"algo.advantage = {a.advantage} compares responses within a group: needs n >= 2")
    if a.dynamic_sampling and a.advantage not in GROUP_ESTIMATORS:
        fail(
            "algo.dynamic_sampling",
            True,
            f"keeps groups whose scores differ; algo.advantage = {a.advantage} is not a group estimator "
            f"(valid: {', '.join(sorted(GROUP_ESTIMATORS))})",
        )
    if a.value_warmup_steps >= cfg.steps:
        fail(
            "algo.value_warmup_steps", a.value_warmup_steps, f"must be < steps ({cfg.steps}) or the actor never trains"
        )
    if a.kl.placement == "loss" and a.kl.kind == "k1":
        fail(
            "algo.kl.kind",
            "k1",
            "as a loss term k1 = log π − log π_ref has gradient ∇log π, zero in "
            "expectation: it does not pull towards π_ref; use k3 (GRPO) or k2 with algo.kl.placement = loss",
        )
    if a.kl.target is not None and a.kl.placement != "reward":
        fail(
            "algo.kl.target",
            a.kl.target,
            "the adaptive controller tunes β of a KL in the reward; "
            f"algo.kl.placement = {a.kl.placement} (set target to null)",
        )
    _check_ref_sync(cfg)
    if a.reward_norm and a.reward_init_norm:
        fail("algo.reward_init_norm", True, "algo.reward_norm is on too: choose one normalisation of the scores")
    _check_reward_model_critic(cfg)
    if a.ptx_coef > 0 and cfg.data.ptx is None:
        fail("algo.ptx_coef", a.ptx_coef, "needs data.ptx (the supervised pairs)")
    if a.overlong is not None and a.overlong.max_length > cfg.rollout.max_new_tokens:
        fail(
            "algo.overlong.max_length",
            a.overlong.max_length,
            f"must be <= rollout.max_new_tokens ({cfg.rollout.max_new_tokens})",
        )


def _check_reward_model_critic(cfg) -> None:
    """model.critic = reward_model needs a reward_model source, loaded with the critic's head."""
    if cfg.model.critic != "reward_model":
        return
    source = next((s for s in cfg.reward.sources if s.get("name") == "reward_model"), None)
    if source is None:
        fail("model.critic", "reward_model", "needs a reward_model source in reward.sources (its path and head)")
    head = source.get("head", "token-classification")  # RewardModelSource's default head
    if cfg.model.critic_head != head:
        fail("model.critic_head", cfg.model.critic_head, f"model.critic = reward_model needs the reward model's {head}")


# The algo.* knobs each advantage estimator and each policy loss reads: their registry entries'.
ESTIMATOR_KNOBS: dict[str, tuple[str, ...]] = {name: e.knobs for name, e in ADVANTAGE_ESTIMATORS.items()}
POLICY_LOSS_KNOBS: dict[str, tuple[str, ...]] = {name: e.knobs for name, e in POLICY_LOSSES.items()}


# Read only when the estimator reads values, i.e. the run trains a critic (checked before the
# estimator's knobs, so that a critic-free run hears why algo.critic_lam is ignored).
CRITIC_KNOBS = (
    "model.critic",
    "model.critic_head",
    "algo.critic_lam",
    "algo.length_alpha",
    "algo.value_clip",
    "algo.value_warmup_steps",
    *(f"critic_optim.{f.name}" for f in dataclasses.fields(OptimConfig)),
)


def _check_ignored(cfg, written: Set[str] | None) -> None:
    """A knob the user set (:func:`glassrl.config.knob_set`) that the chosen algorithm never reads
    is an error saying what ignores it."""
    a, kl = cfg.algo, cfg.algo.kl

    def ignored(key: str, why: str) -> None:
        if knob_set(cfg, key, written):
            fail(key, get_dotted(cfg, key), f"ignored: {why}; remove it")

    def unread(key: str, chosen: str, table: dict[str, tuple[str, ...]]) -> None:
        """Each knob of ``table`` (registry name -> knobs) that the ``chosen`` entry does not read."""
        for knob in dict.fromkeys(k for knobs in table.values() for k in knobs):
            if knob not in table[chosen]:
                readers = ", ".join(name for name, knobs in table.items() if knob in knobs)
                ignored(f"algo.{knob}", f"{key} = {chosen} does not read it (only {readers})")

    if not a.uses_critic():
        for key in CRITIC_KNOBS:
            ignored(key, f"only a critic uses it, and algo.advantage = {a.advantage} has none")
    unread("algo.advantage", a.advantage, ESTIMATOR_KNOBS)
    if a.critic_lam is not None and a.length_alpha is not None:
        ignored("algo.lam", "algo.length_alpha sets the policy's λ and algo.critic_lam the critic's")
    unread("algo.policy_loss", a.policy_loss, POLICY_LOSS_KNOBS)
    if a.loss_agg != "seq-mean-token-sum-norm":
        ignored("algo.norm_length", f"the L of loss_agg seq-mean-token-sum-norm; algo.loss_agg = {a.loss_agg}")
    if kl.ref_sync_every == 0:
        ignored("algo.kl.ref_sync_alpha", "the soft update's α; algo.kl.ref_sync_every = 0 keeps π_ref fixed")
    if kl.placement == "none":
        for key in ("algo.kl.kind", "algo.kl.coef", "algo.kl.horizon", "algo.kl.ref_sync_every", "model.reference"):
            ignored(key, "algo.kl.placement = none: there is no KL term and no reference policy")
    elif kl.target is None:
        ignored("algo.kl.horizon", "the adaptive KL controller's horizon; algo.kl.target is null (fixed β)")
    if not a.dynamic_sampling:
        ignored("algo.dynamic_sampling_max_rounds", "algo.dynamic_sampling is off")
    if a.ptx_coef == 0:
        ignored("data.ptx", "PPO-ptx's supervised pairs; algo.ptx_coef = 0 turns PPO-ptx off")
    if not cfg.logging.report:
        ignored("logging.report_every", "logging.report is false: no report.html is written")


# The AgentConfig knobs that only a ToolEnvironment built from rollout.agent.tools reads.
TOOL_KNOBS = ("valid_call_reward", "call_timeout_s", "max_calls", "max_result_chars")


def _check_agent(cfg, written: Set[str] | None) -> None:
    """Ranges of rollout.agent, and where its episodes' environment comes from: exactly one of
    rollout.agent.environment, rollout.agent.tools, an agentic data.train task."""
    agent, tasks = cfg.rollout.agent, cfg.agentic_tasks()
    if len(tasks) > 1 and (agent is None or agent.environment is None and not agent.tools):
        fail("data.train", cfg.data.train, f"mixes agentic tasks ({', '.join(tasks)}): set rollout.agent.environment")
    if agent is None:
        return
    at_least(1, {"rollout.agent.max_turns": agent.max_turns, "rollout.agent.tool_workers": agent.tool_workers})
    at_least(1, {"rollout.agent.max_calls": agent.max_calls, "rollout.agent.max_result_chars": agent.max_result_chars})
    if not agent.call_timeout_s > 0:
        fail("rollout.agent.call_timeout_s", agent.call_timeout_s, "must be > 0")
    if agent.environment is not None and agent.tools:
        fail("rollout.agent.tools", agent.tools, "rollout.agent.environment is set too: it brings its own tools")
    if agent.endpoint is not None:
        _check_endpoint(agent.endpoint)
    if agent.environment is None and not agent.tools and not tasks and agent.endpoint is None:
        raise GlassrlError(
            "rollout.agent: no environment for the episodes: set rollout.agent.environment or "
            "rollout.agent.tools, or train on an agentic task (data.train = task:tool-add, task:research)"
        )
    if agent.environment is not None and ":" not in agent.environment:
        from glassrl.agents.tasks import TASK_ENVIRONMENTS

        if agent.environment not in TASK_ENVIRONMENTS:
            valid = ", ".join(TASK_ENVIRONMENTS)
            fail("rollout.agent.environment", agent.environment, f"unknown; valid: {valid}, or module:function")
    if not agent.tools:
        for knob in TOOL_KNOBS:
            key = f"rollout.agent.{knob}"
            default = getattr(type(agent)(), knob)
            if written is not None and key in written or written is None and getattr(agent, knob) != default:
                fail(f"rollout.agent.{knob}", getattr(agent, knob), "ignored: it sets up rollout.agent.tools, empty")


def _check_endpoint(endpoint) -> None:
    """rollout.agent.endpoint: exactly one of its agent and its command."""
    if (endpoint.agent is None) == (not endpoint.command):
        fail("rollout.agent.endpoint.agent", endpoint.agent, "set exactly one of it and rollout.agent.endpoint.command")
    if not endpoint.timeout_s > 0:
        fail("rollout.agent.endpoint.timeout_s", endpoint.timeout_s, "must be > 0")


def _check_scale_out(cfg, written: Set[str] | None) -> None:
    """model.compute_dtype, model.lora, model.shared_prefix, rollout.engine, algo.rollout_is, trainer.backend
    and ray.*."""
    m, r, a = cfg.model, cfg.rollout, cfg.algo
    if m.compute_dtype == "bfloat16" and m.dtype in ("bfloat16", "float16"):
        fail(
            "model.dtype",
            m.dtype,
            "model.compute_dtype = bfloat16 needs float32 master weights (AdamW on half-precision weights "
            "loses small updates: docs/scale-out.md); set model.dtype: float32",
        )
    if m.lora is not None:
        at_least(1, {"model.lora.r": m.lora.r})
        if not m.lora.alpha > 0:
            fail("model.lora.alpha", m.lora.alpha, "must be > 0")
        if not 0 <= m.lora.dropout < 1:
            fail("model.lora.dropout", m.lora.dropout, "must lie in [0, 1)")
        if not m.lora.target_modules:
            fail("model.lora.target_modules", m.lora.target_modules, "needs module names, or all-linear")
    if m.shared_prefix is True and m.padding_free:
        fail(
            "model.shared_prefix",
            True,
            "with model.padding_free: shared_prefix packs without padding already; drop padding_free",
        )
    if a.rollout_is is not None and not a.rollout_is.cap > 0:
        fail("algo.rollout_is.cap", a.rollout_is.cap, "must be > 0")
    _check_off_policy(cfg, written)
    if not 0 < r.vllm.gpu_memory_utilization < 1:
        fail("rollout.vllm.gpu_memory_utilization", r.vllm.gpu_memory_utilization, "must lie in (0, 1)")
    if r.engine == "vllm" and m.lora is not None and m.lora.r > 512:
        fail("model.lora.r", m.lora.r, "rollout.engine = vllm takes adapters of rank up to 512 (vLLM's max_lora_rank)")
    if r.engine != "vllm" and knob_set(cfg, "rollout.vllm", written):
        raise GlassrlError(f"rollout.vllm: ignored: rollout.engine = {r.engine}; remove it or set rollout.engine: vllm")
    _check_staleness(cfg, written)
    if cfg.trainer.backend == "local":
        if knob_set(cfg, "ray", written):
            raise GlassrlError("ray: ignored: trainer.backend = local; remove the section or set trainer.backend: ray")
        if cfg.max_staleness() > 1:
            fail(
                "rollout.max_staleness",
                cfg.rollout.max_staleness,
                "trainer.backend = local samples at most one step ahead (1, rollout.overlap); use trainer.backend: ray",
            )
        if cfg.max_staleness() == 1:
            _check_overlap(cfg)
        return
    _check_ray(cfg, written)


def _staleness_key(cfg) -> tuple[str, object]:
    """The key (and its value) that asked for sampling ahead: rollout.overlap or rollout.max_staleness."""
    return ("rollout.overlap", True) if cfg.rollout.overlap else ("rollout.max_staleness", cfg.rollout.max_staleness)


def _check_staleness(cfg, written: Set[str] | None) -> None:
    """rollout.max_staleness (and rollout.overlap, its older form): what sampling ahead cannot serve."""
    a, r = cfg.algo, cfg.rollout
    at_least(0, {"rollout.max_staleness": r.max_staleness})
    if r.overlap and r.max_staleness:
        fail(
            "rollout.overlap",
            True,
            f"is rollout.max_staleness: 1, and rollout.max_staleness = {r.max_staleness}; keep one",
        )
    key, value = _staleness_key(cfg)
    if cfg.max_staleness() == 0:
        if knob_set(cfg, "rollout.partial_rollouts", written):
            fail(
                "rollout.partial_rollouts",
                r.partial_rollouts,
                "ignored: rollout.max_staleness = 0 samples nothing ahead",
            )
        return
    if "baseline_rewards" in ADVANTAGE_ESTIMATORS[a.advantage].inputs:
        fail(key, value, f"algo.advantage = {a.advantage} samples greedy baselines within a step; choose one")


def _check_overlap(cfg) -> None:
    """Sampling one step ahead on the local backend (rollout.overlap, rollout.max_staleness: 1): rounds
    in a thread with a copy of the policy while a step trains (glassrl.workers.overlap)."""
    if cfg.rollout.partial_rollouts:
        fail("rollout.partial_rollouts", True, "trainer.backend = local samples ahead whole batches (rollout.overlap)")


def _check_off_policy(cfg, written: Set[str] | None) -> None:
    """algo.off_policy: a correction of OFF_POLICY, the knobs it reads, in range; not beside algo.rollout_is."""
    from glassrl.algos.off_policy import OFF_POLICY

    o = cfg.algo.off_policy
    if o is None:
        return
    if cfg.algo.rollout_is is not None:
        fail("algo.off_policy", o.correction, "algo.rollout_is is set too (it is token_tis); keep one")
    if o.correction not in OFF_POLICY:
        fail("algo.off_policy.correction", o.correction, f"unknown; valid: {', '.join(OFF_POLICY)}")
    knobs = OFF_POLICY[o.correction].knobs
    for knob in ("cap", "low", "high"):
        value = getattr(o, knob)
        if value is None:
            continue
        if knob not in knobs:
            readers = ", ".join(name for name, entry in OFF_POLICY.items() if knob in entry.knobs)
            fail(
                f"algo.off_policy.{knob}",
                value,
                f"ignored: {o.correction} does not read it (only {readers}); remove it",
            )
        if not value > 0:
            fail(f"algo.off_policy.{knob}", value, "must be > 0")
    if "low" in knobs:
        low, high = o.low or knobs["low"], o.high or knobs["high"]
        if not low <= high:
            fail("algo.off_policy.low", low, f"must be <= algo.off_policy.high ({high})")


def _check_ref_sync(cfg) -> None:
    """algo.kl.ref_sync_every: a π_ref of its own weights."""
    kl = cfg.algo.kl
    if kl.ref_sync_every == 0:
        return
    if not 0 < kl.ref_sync_alpha <= 1:
        fail("algo.kl.ref_sync_alpha", kl.ref_sync_alpha, "must lie in (0, 1]")
    if cfg.model.lora is not None and cfg.model.reference is None:
        fail(
            "algo.kl.ref_sync_every",
            kl.ref_sync_every,
            "under LoRA π_ref is the actor with its adapters off, which has no weights of its own to update; "
            "name a model.reference",
        )


_COLOCATED_NODES = "ignored: ray.placement = colocate places every role by ray.actor.nodes; set ray.placement: separate"


def _check_ray(cfg, written: Set[str] | None) -> None:
    """What trainer.backend = ray needs: groups that can be placed, a mini-batch per rank, wired features."""
    ray, a = cfg.ray, cfg.algo
    placement = cfg.rollout_placement()
    if knob_set(cfg, "ray.rollout.placement", written):  # what the user wrote is kept, and checked
        placement = ray.rollout.placement
    apart = placement == "apart"
    roles = {"actor": ray.actor, "critic": ray.critic, "reference": ray.reference, "reward": ray.reward}
    if apart:
        roles["rollout"] = ray.rollout
        if not ray.rollout.sync_bucket_mb > 0:
            fail("ray.rollout.sync_bucket_mb", ray.rollout.sync_bucket_mb, "must be > 0")
        if ray.rollout_ranks is not None:
            fail(
                "ray.rollout_ranks",
                ray.rollout_ranks,
                "ignored: with ray.rollout.placement = apart the ranks "
                "that sample are ray.rollout.world_size; remove it",
            )
    else:
        for knob in ("world_size", "resources", "sync_bucket_mb"):
            if knob_set(cfg, f"ray.rollout.{knob}", written):
                fail(
                    f"ray.rollout.{knob}",
                    get_dotted(cfg, f"ray.rollout.{knob}"),
                    "ignored: ray.rollout.placement = with_actor samples on the actor's ranks (ray.rollout_ranks)",
                )
    for name, role in roles.items():
        if role is None:
            continue
        at_least(1, {f"ray.{name}.world_size": role.world_size})
        values = role.resources.values()
        if not all(isinstance(v, (int, float)) and v >= 0 for v in values) or not any(v > 0 for v in values):
            fail(f"ray.{name}.resources", role.resources, "needs amounts >= 0, one of them > 0 (e.g. {CPU: 1})")
    placed = sorted(name for name, role in roles.items() if name != "actor" and role is not None)
    for name in placed if ray.placement == "colocate" else ():
        if knob_set(cfg, f"ray.{name}.nodes", written):  # one placement group: the actor's strategy places it
            fail(f"ray.{name}.nodes", get_dotted(cfg, f"ray.{name}.nodes"), _COLOCATED_NODES)
    if ray.rollout_ranks is not None and not 1 <= ray.rollout_ranks <= ray.actor.world_size:
        fail("ray.rollout_ranks", ray.rollout_ranks, f"must lie in [1, ray.actor.world_size = {ray.actor.world_size}]")
    mini = cfg.batch.mini_batch_prompts * cfg.rollout.n
    trained = [("actor", ray.actor)] + ([("critic", ray.critic)] if a.uses_critic() else [])
    for name, role in trained:
        if role.world_size > mini:
            fail(
                f"ray.{name}.world_size",
                role.world_size,
                f"more ranks than the {mini} responses of a mini-batch (batch.mini_batch_prompts × rollout.n): "
                "a rank would have nothing to train on",
            )
    if ray.fsdp and not apart:
        fail(
            "ray.fsdp",
            True,
            "sampling from FSDP2 shards is not built; sample on ranks of their own (ray.rollout.placement: apart), "
            "which the actor's gathered weights keep in sync (docs/scale-out.md)",
        )
    if cfg.model.padding_free:
        fail("model.padding_free", True, "not wired into trainer.backend = ray; use trainer.backend: local")
    if cfg.rollout.overlap:
        fail(
            "rollout.overlap",
            True,
            "not wired into trainer.backend = ray, whose asynchronous mode is rollout.max_staleness "
            "(with ray.rollout.placement: apart)",
        )
    if cfg.max_staleness() and not apart:
        fail(
            "rollout.max_staleness",
            cfg.rollout.max_staleness,
            "samples ahead on rollout ranks of their own, kept in sync with the actor: "
            "set ray.rollout.placement: apart",
        )
    teachers = [i for i, s in enumerate(cfg.reward.sources) if s.get("name") == "teacher"]
    if teachers:
        fail(
            f"reward.sources[{teachers[0]}].name",
            "teacher",
            "on-policy distillation is not wired into trainer.backend = ray; use trainer.backend: local",
        )
