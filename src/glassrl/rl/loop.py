"""The single-controller trainer (DESIGN §2): one step is seven phases, read top to bottom.

    trainer = Trainer(load_config(TrainConfig, "examples/grpo.yaml"))
    trainer.train()

Reading order: :meth:`Trainer.step` holds the seven phases in the order the data flows, each body
a call away (phase 1 :meth:`Trainer._sample`, 2–5 glassrl.rl.phases, 3 :meth:`Trainer._model_outputs`,
6 :meth:`Trainer._update` → the workers' ``update`` → glassrl.rl.update.run_updates, 7
:meth:`Trainer._metrics` and :meth:`Trainer._log_and_save`); one detail crosses phases: when a batch
makes a single optimiser step on what π_θ sampled, phase 3 leaves log π_old to phase 6, whose forward
computes it. ``Trainer.__init__`` is a list of named builds (glassrl.rl.build for the parts).

Asynchronous training (``rollout.max_staleness`` = k ≥ 1: Ray's rollout ranks, or at k = 1 the local
backend's copy of the policy in a thread, ``rollout.overlap``) is the same loop: phase 1 takes the
oldest of the rounds requested ahead (glassrl.rl.sampling.AsyncRounds, the one buffer: at most k
versions behind; at k = 0 each round is sampled when taken), phase 3 ends with what the sampling
policy was (glassrl.rl.phases.off_policy: each token's staleness, algo.off_policy's weights), and the
update's weight sync feeds the ranks.

The trainer owns the algorithm and talks to role workers (glassrl.workers.base);
it never touches a torch model. Phases 2–5 are the functions of glassrl.rl.phases,
which ``glassrl explain --model`` calls too. Algorithm variants plug in as small parts
chosen by config values, never by algorithm name: the estimator's REQUIRED_INPUTS decide
which inputs are computed (values → critic, baseline_rewards → greedy rollout), score
shapers (phases.SCORE_SHAPERS) by their keys, loss terms by their coefficients
(glassrl.rl.loss.actor_terms).

The run's life in its directory is glassrl.run.session (the lock, the thread count, fresh or
resumed, checkpoints when due, a stop between steps), as for the supervised loop; its files
(config.yaml, environment.json, metrics.jsonl, ledgers/, resumes.jsonl) are glassrl.rl.run_dir.

A resumed run is compared with the config saved inside its checkpoint (part "config"), so a
missing or hand-edited config.yaml changes nothing; only the keys of RESUME_MAY_CHANGE may
differ (recorded in resumes.jsonl). Nothing in a checkpoint names an absolute path that
matters, so a run directory copied or moved elsewhere resumes with ``output_dir=NEW``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from rich.console import Console

from glassrl.algos.masked import masked_mean
from glassrl.config import to_dict
from glassrl.diagnose.sync_check import SyncTruth
from glassrl.diagnose.training_watch import TrainingWatch, proxy_only_rows
from glassrl.files import DISK_FULL, disk_errors, replaced
from glassrl.ledger.compute import from_experience
from glassrl.models.loading import pad_id
from glassrl.models.threads import set_threads, startup_line
from glassrl.optim import NonFiniteError, seed_everything
from glassrl.report.html import write_run_report
from glassrl.report.sinks import (
    sample_rows,
)
from glassrl.rewards.control import control_line, control_results, real_mean, real_results
from glassrl.rl import phases, startup
from glassrl.rl.build import (
    actor_path,
    build_gold,
    build_local_workers,
    build_ptx,
    kl_controller,
    step_sampler,
    teacher,
)
from glassrl.rl.build_ray import build_ray_workers
from glassrl.rl.config import TrainConfig
from glassrl.rl.evaluation import correct, evaluate
from glassrl.rl.experience import Experience
from glassrl.rl.memory import check_step_fits
from glassrl.rl.metrics import PhaseTimer, accuracy, gold_metrics, response_metrics, reward_metrics, tensor_metrics
from glassrl.rl.phases import Sampled
from glassrl.rl.resolve import resolve, resolve_layout, saved_in_todays_terms
from glassrl.rl.run_dir import open_sinks, record_resume, write_run_files
from glassrl.rl.sampling import AsyncRounds
from glassrl.rl.update import actor_batch, critic_batch, minibatch_plan
from glassrl.rollout.base import SamplingParams
from glassrl.run import state, stop
from glassrl.run.session import RunCheckpoints, stop_requested, take_lock

# Config keys a resumed run may change (dotted prefixes): how long it runs, where it lives, what
# it logs, and an explicit thread count (under auto it keeps the one it recorded: glassrl.run.session).
# Anything else would make it another run (state.RunConfig).
RESUME_MAY_CHANGE = ("steps", "output_dir", "logging", "threads", "check")  # check: what is checked, not trained
REWARD_TRACEBACK = "reward_traceback.txt"  # the first failure's traceback, when failed rewards stop the run


class Trainer:
    """Builds the workers of ``cfg`` and runs its steps; ``resume`` continues from the latest checkpoint."""

    def __init__(
        self, cfg: TrainConfig, *, resume: bool = False, console: Console | None = None, progress: bool = True
    ) -> None:
        self.console = console or Console()
        self.resolved = resolve(cfg)  # checked, made concrete (warm start, precision, placement), sizes
        for line in self.resolved.warm_start:  # a model named by a run or checkpoint: that model's directory
            self.console.print(line, markup=False, soft_wrap=True)
        cfg = self.cfg = self.resolved.cfg
        self.out, lg = Path(cfg.output_dir), cfg.logging
        where = f"output_dir = {self.out}"
        # the run's life in its directory (glassrl.run.session): checkpoints, fresh or resumed, a stop
        self.run = RunCheckpoints(
            self.out / "checkpoints", keep=lg.keep_checkpoints, every=lg.checkpoint_every, resume=resume, what=where
        )
        self.counters = self.run.counters
        self.lock = take_lock(self.out / ".lock", where, self.console)  # released by train() / close()
        self.workers = self.sinks = None
        try:
            self.run.check_run_dir()
            self._build(resume, progress)
        except BaseException:
            self.close()
            raise

    def _build(self, resume: bool, progress: bool) -> None:
        """The run's parts, named builds in order (glassrl.rl.build), then a resume's checkpoint loaded
        into them (glassrl.run.session) and the metric sinks opened."""
        cfg, lg = self.cfg, self.cfg.logging
        recorded = self.run.recorded_threads()  # before any torch work: a resumed run's count
        self.threads = self.run.threads_part(*set_threads(cfg.threads, recorded.threads))
        self.console.print(startup_line(self.threads.count, self.threads.why), markup=False, soft_wrap=True)
        memory = startup.freed_memory_path(cfg)
        seed_everything(cfg.seed)
        path = actor_path(cfg, self.console)
        # model.shared_prefix "auto" made concrete (a resumed run goes on as it began)
        self.resolved = resolve_layout(self.resolved, path, self.out / "config.yaml" if resume else None)
        cfg = self.cfg = self.resolved.cfg
        self.tokenizer, self.data = startup.load_prompts(cfg, path, self.console)
        self.prompts, self.test_records = self.data.train, self.data.test  # a PromptStream or MixtureStream
        self.ptx = build_ptx(cfg, self.resolved, self.tokenizer, self.data.limit + cfg.rollout.max_new_tokens)
        check_step_fits(cfg, self.resolved, path, self.data.longest)  # before any model is loaded
        build_workers = build_ray_workers if cfg.trainer.backend == "ray" else build_local_workers
        self.workers = build_workers(cfg, self.resolved, path, self.tokenizer, self.ptx)
        self.paths = startup.say_paths(cfg, self.workers, self.resolved.layout, memory, self.console)
        self.gold = build_gold(cfg)  # reward.gold: scored for reward/gold, never trained on
        if cfg.reward.control != "none":
            startup.say(self.console, control_line(cfg.reward.control, cfg.reward.control_p))
        self.teacher = teacher(self.workers, self.tokenizer)  # on-policy distillation: (teacher, w) or None
        self.kl = kl_controller(cfg.algo.kl)
        self.shapers = phases.score_shapers(cfg.algo)
        self.sampler = step_sampler(cfg, pad_id(self.tokenizer))  # one round a step, or DAPO's dynamic sampling
        self.correction = self.resolved.correction  # algo.off_policy (or algo.rollout_is): (name, knobs)
        # the rounds, requested up to rollout.max_staleness ahead (glassrl.rl.sampling.AsyncRounds)
        self.rounds = AsyncRounds(
            self.workers.rollout, self.resolved.max_staleness, pad_id(self.tokenizer), self.workers.sync_log
        )
        self.round_seconds: dict[str, float] = {}  # the step's waits for them (perf/…)
        self.old_logprobs_from_update = startup.old_logprobs_from_update(cfg, self.resolved, self.workers, self.teacher)
        self.shuffle = torch.Generator().manual_seed(cfg.seed + 2)  # mini-batch order
        self.run_config = state.RunConfig(
            to_dict(self.cfg), RESUME_MAY_CHANGE, to_dict(type(cfg)()), upgrade=saved_in_todays_terms(self.cfg)
        )
        restored = self.run.start(self._components())  # a resume: the latest checkpoint loaded
        record_resume(self.out, self.run_config, restored, self.console)
        self.initial_eval: float | None = None  # eval/accuracy before the first step (set by train)
        self.last_metrics: dict[str, float] = {}  # of the last step train() ran
        self.timer = PhaseTimer()
        step = self.counters.step
        self.sinks = open_sinks(cfg, self.out, step, resume=resume, progress=progress, console=self.console)
        self.watch = (  # the reward-hacking watch (glassrl.diagnose.training_watch)
            TrainingWatch(
                lg.watch_window, lg.watch_threshold, self.out, self.console, self.counters.step if resume else None
            )
            if lg.watch_window
            else None
        )
        log = self.workers.sync_log  # the sync truth check, where weights move (glassrl.diagnose.sync_check)
        self.sync_truth = None if log is None else SyncTruth(log, cfg.check.on_sync_breach, self.out, self.console)
        if self.sync_truth is not None:  # the syncs of the start (and of a resume's load): judged now, not in step 1
            self.sync_truth.stop(self.sync_truth.update(step, {}))

    # ------------------------------------------------------------------ the step

    def step(self) -> dict[str, float]:
        """One training step (DESIGN §2): the seven phases in the order the data flows; returns its metrics."""
        step, start, a = self.counters.step + 1, time.perf_counter(), self.cfg.algo
        self.timer.reset()
        # 1. generate n responses per prompt, with their reward results (ok / timeout / error)
        sampled, sampling = self._sample(step)
        with self.timer.phase("score"):  # 2. shaped scores on tokens; failed (or baseline-less) rows masked
            exp = phases.score(
                sampled,
                self.tokenizer,
                estimator=a.advantage,
                shapers=self.shapers,
                rollout=self.workers.rollout,
                reward=self.workers.reward,
                max_new_tokens=self.cfg.rollout.max_new_tokens,
            )
        with self.timer.phase("logprobs"):  # 3. log π_old, H, log π_ref, KL, V (log π_old may come from 6.)
            self._model_outputs(exp, sampled, step)
        with self.timer.phase("rewards"):  # 4. token rewards r_i = score_i − β·kl_i (when the KL is in the reward)
            phases.token_rewards(exp, self.kl.value, a.kl.placement == "reward")
            self._adapt_kl(exp)
        with self.timer.phase("advantages"):  # 5. advantages and returns (whitened when on), TD errors
            phases.advantages(exp, a)
        with self.timer.phase("update"):  # 6. epochs × mini-batches × micro-batches: the critic, then the actor
            updated = self._update(exp, step)
            self._sync_reference(step)
        self.counters.step = step
        metrics = self._metrics(exp, {**sampling, **updated}, start)  # 7. log, ledger, evaluation, checkpoint
        self._log_and_save(step, exp, metrics)
        return metrics

    def train(self) -> dict[str, float]:
        """Run the remaining steps (evaluating before the first); returns the last metrics.

        The run directory is released at the end, whatever happens (:meth:`close`)."""
        try:
            # a full disk: one line; Ctrl-C or SIGTERM: the step ends, is checkpointed, one line (glassrl.run.session)
            with stop.handling(), stop.graceful(), disk_errors(f"output_dir = {self.out}", self.out, only=DISK_FULL):
                self._train_steps()
        except stop.Interrupted as signal:  # a second one: the step in progress is abandoned
            raise self._stopped(
                signal.signum, f"a second {stop.name(signal.signum)} abandoned the step in progress"
            ) from None
        finally:
            self.close()
        return self.last_metrics

    def _train_steps(self) -> None:
        write_run_files(self.out, self.cfg, self.threads, self.paths)
        if self.counters.step == 0 and self.test_records:
            initial = self.evaluate()
            self.initial_eval = initial["eval/accuracy"]
            self.sinks.log(0, initial)
        while self.counters.step < self.cfg.steps:
            if signum := stop_requested(self.run, self.counters.step):  # the steps taken are checkpointed
                raise self._stopped(signum)
            try:
                self.last_metrics = self.step()
            except NonFiniteError as err:
                last = self.run.manager.latest()
                raise NonFiniteError(
                    f"step {self.counters.step + 1}, {err}; "
                    + (
                        f"the last checkpoint, {last.name}, holds finite weights"
                        if last
                        else "no checkpoint was written"
                    )
                ) from None
        if self.cfg.logging.report and self.counters.step == self.cfg.steps:
            write_run_report([self.out], self.out / "report.html")

    def _stopped(self, signum: int, why: str | None = None) -> stop.Stopped:
        """The one line of a stopped run: the checkpoint to resume from (with the rounds requested
        ahead: AsyncRounds), and how."""
        return stop.Stopped(
            signum, stop.resume_line(self.run.manager.latest(), self.counters.step, self.out / "config.yaml", why)
        )

    def close(self) -> None:
        """Close the metric sinks, release the run directory and stop the workers (idempotent; train() calls it)."""
        if self.sinks is not None:
            self.sinks.close()
        self.lock.release()
        if self.workers is not None:
            self.workers.close()

    # ------------------------------------------------------------------ phases 1, 3, 4 and 6

    def _sample(self, step: int) -> tuple[Sampled, dict[str, float]]:
        """Phase 1: the step's responses and reward results. With DAPO dynamic sampling (Yu et al.
        2025, Algorithm 1) the sampler keeps only groups with mixed scores, and rounds go on until it
        holds the step's batch.prompts_per_step groups. Asynchronous (rollout.max_staleness ≥ 1), the
        rounds were requested ahead (:meth:`_generate_and_reward`), and groups kept from an earlier
        step that would lag too far are dropped first."""
        self.round_seconds = {}
        self.sampler.expire(self.rounds.oldest())
        while self.sampler.needs_more():
            self.sampler.add(self._generate_and_reward(step))
        sampled, sampling = self.sampler.take()
        return sampled, {**sampling, **self.round_seconds}

    def _model_outputs(self, exp: Experience, sampled: Sampled, step: int) -> None:
        """Phase 3. π_old is the policy that sampled: a batch sampled ahead on the local backend brings
        its log-probs (glassrl.workers.overlap); when the batch makes one optimiser step on what π_θ
        sampled, π_old = π_θ and the update's own forward gives log π_old, H and the KL (phase 6,
        :meth:`_update`), so no actor pass runs here (docs/metrics.md, actor/)."""
        a, rollout = self.cfg.algo, exp.rollout
        needs_old_logprobs = not self.old_logprobs_from_update or step <= a.value_warmup_steps
        actor = self.workers.actor if needs_old_logprobs and rollout.behaviour_logprobs is None else None
        phases.model_outputs(exp, actor, self.workers.reference, self.workers.critic, a.kl.kind)
        if rollout.behaviour_logprobs is not None:
            phases.policy_outputs(exp, rollout.behaviour_logprobs, rollout.behaviour_entropy, a.kl.kind)
        phases.off_policy(exp, self.rounds.version, self.correction)
        self.rounds.check(exp.staleness, step)  # the bound held
        if self.teacher is not None:  # log π_T of the sampled tokens, for its reward in phase 4
            phases.teacher_outputs(exp, *self.teacher)

    def _adapt_kl(self, exp: Experience) -> None:
        """Adaptive KL (Ziegler et al. 2019, §2.2): β follows the KL of the batch just sampled, per
        token (verl's apply_kl_penalty; TRL sums over the sequence instead); n = responses."""
        if exp.kl_in_reward and math.isfinite(kl := masked_mean(exp.kl, exp.response_mask).item()):
            self.kl.update(kl, self.resolved.responses_per_step)

    def _sync_reference(self, step: int) -> None:
        """algo.kl.ref_sync_every: every N steps π_ref moves towards the updated π_θ (TR-DPO)."""
        every = self.cfg.algo.kl.ref_sync_every
        if every and step % every == 0:
            self.workers.reference.follow_actor()  # glassrl.workers.base.SyncedReference

    def _update(self, exp: Experience, step: int) -> dict[str, float]:
        """Phase 6: the critic's update, then the actor's (not during VAPO's value pre-training, the
        critic alone until algo.value_warmup_steps). Where phase 3 left log π_old to this update, its
        forward fills it in (:meth:`_model_outputs`)."""
        a = self.cfg.algo
        plan = minibatch_plan(len(exp.rollout), self.resolved.mini_batch_responses, self.cfg.batch.epochs, self.shuffle)
        updated: dict[str, float] = {}
        if self.workers.critic is not None:
            updated |= self.workers.critic.update(critic_batch(exp), plan)
        if step > a.value_warmup_steps:
            if exp.logprobs is None:  # log π_old, H, kl: this forward's (3.)
                actor_metrics, logprobs, entropy = self.workers.actor.update_on_policy(actor_batch(exp), plan)
                phases.policy_outputs(exp, logprobs, entropy, a.kl.kind)
                updated |= actor_metrics
            else:
                updated |= self.workers.actor.update(actor_batch(exp), plan)
        return updated

    # ------------------------------------------------------------------ phase 1: a round

    def _sampling(self, greedy: bool = False) -> SamplingParams:
        return self.cfg.rollout.sampling(greedy)

    def _generate_and_reward(self, step: int) -> Sampled:
        """Phase 1, one round: n responses to each of the next ``batch.prompts_per_step`` prompts
        and their typed reward results (failures counted: too many stop the run). The round is the
        oldest of :attr:`rounds`: sampled now, or (rollout.max_staleness ≥ 1) requested during an
        earlier step, when the next ones are requested; nothing is requested ahead across a step that
        evaluates or checkpoints where that would share the sampling generator (the local backend)."""
        with self.timer.phase("generate"):
            quiet = self._evaluates(step) or self.run.due(step, self.cfg.steps)
            self.rounds.fill(self._next_prompts, self.cfg.rollout.n, self._sampling(), quiet=quiet)
            taken, seconds = self.rounds.take()
            prompts, prompt_ids, rollout = taken.prompts, taken.prompt_ids, taken.rollout
            for key, value in seconds.items():  # summed over the step's rounds
                self.round_seconds[key] = self.round_seconds.get(key, 0.0) + value
            self.timer.add_tokens("generate", int(rollout.response_mask.sum()))
        with self.timer.phase("score"):
            records = [prompts[g] for g in rollout.group_index.tolist()]  # the record each response answers
            results = self.workers.reward.score(phases.reward_requests(rollout, records, self.tokenizer))
            phases.check_failure_rate(results, step, self.cfg.reward.max_failure_rate, self.out / REWARD_TRACEBACK)
            rc = self.cfg.reward  # reward.control: what is paid, not what is evaluated (glassrl.rewards.control)
            if rc.control != "none":
                results = control_results(results, rc.control, rc.control_p, self.cfg.seed, step)
                rollout = phases.without_turn_rewards(rollout)
        return Sampled(rollout, prompts, prompt_ids, results)

    def _next_prompts(self) -> tuple[list, list[list[int]]]:
        """The next round's ``batch.prompts_per_step`` records of the prompt stream, and their token ids."""
        prompts = self.prompts.take(self.cfg.batch.prompts_per_step)
        return prompts, self.data.ids(prompts)

    # ------------------------------------------------------------------ phase 7

    def _metrics(self, exp: Experience, updated: dict[str, float], start: float) -> dict[str, float]:
        requests = phases.reward_requests(exp.rollout, exp.records, self.tokenizer)
        flags = correct(requests, real_results(exp.results), self.cfg.logging.eval_threshold)  # eval/accuracy's rule
        metrics = {**reward_metrics(exp.results), "task/accuracy": accuracy(flags), **response_metrics(exp)}
        if self.cfg.reward.control != "none":
            metrics["reward/control/real_mean"] = real_mean(exp.results)
        if self.gold is not None:
            metrics.update(gold_metrics(self.gold, requests, exp.results))
        metrics.update(tensor_metrics(exp))
        metrics.update(updated)
        metrics.update(self.data.metrics())
        tokens = int(exp.rollout.attention_mask.sum())  # processed by each forward pass over the step
        self.timer.add_tokens("logprobs", tokens)
        self.timer.add_tokens("update", tokens * self.cfg.batch.epochs * (2 if self.workers.critic is not None else 1))
        metrics.update(self.timer.metrics())
        metrics["perf/step_s"] = time.perf_counter() - start
        return metrics

    def _log_and_save(self, step: int, exp: Experience, metrics: dict[str, float]) -> None:
        lg = self.cfg.logging
        if self._evaluates(step):
            metrics.update(self.evaluate())
        alerts = self.watch.update(step, metrics) if self.watch is not None else []
        breaches = self.sync_truth.update(step, metrics) if self.sync_truth is not None else []
        if step % lg.log_every == 0 or step == self.cfg.steps or breaches:
            self.sinks.log(step, metrics)
        if breaches:
            self.sync_truth.stop(breaches)  # check.on_sync_breach: stop (the step is logged, not checkpointed)
        last = step == self.cfg.steps  # the last step's ledger: for the report; an alert's: the rows it points at
        if lg.ledger_every and (step % lg.ledger_every == 0 or last) or alerts:
            (self.out / "ledgers").mkdir(exist_ok=True)
            a = self.cfg.algo
            ledger = from_experience(  # the first logging.ledger_samples responses (whole groups first)
                exp,
                self.tokenizer,
                estimator=a.advantage,
                gamma=a.gamma,
                lam=a.lam,
                kl_kind=a.kl.kind,
                step=step,
                samples=lg.ledger_samples,
            )
            with replaced(self.out / "ledgers" / f"step_{step:06d}.jsonl") as f:  # a row at a time, then renamed
                ledger.write_jsonl(f)
            self.sinks.log_samples(step, sample_rows(ledger))  # W&B / MLflow tables, TensorBoard text
        if alerts:
            self.watch.record(alerts, self._proxy_only_rows(step, exp, metrics))
        if lg.report and lg.report_every and step % lg.report_every == 0 and step < self.cfg.steps:
            write_run_report([self.out], self.out / "report.html")  # train() writes the last one
        if self.run.due(step, self.cfg.steps):
            self.run.save(step)

    def _proxy_only_rows(self, step: int, exp: Experience, metrics: dict[str, float]) -> list[tuple[int, int]]:
        """The ledger sample's responses that an alert points at (glassrl.diagnose.training_watch.proxy_only_rows)."""
        k = min(self.cfg.logging.ledger_samples, len(exp.results))
        proxy = [r.score if r.is_ok else None for r in exp.results[:k]]
        gold = None
        if self.gold is not None:
            requests = phases.reward_requests(exp.rollout, exp.records, self.tokenizer)[:k]
            gold = [g.score if g.is_ok else None for g in self.gold.score(requests)]
        return proxy_only_rows(step, metrics, proxy, gold)

    def _evaluates(self, step: int) -> bool:
        lg = self.cfg.logging
        return bool((lg.eval_every and step % lg.eval_every == 0 or step == self.cfg.steps) and self.test_records)

    def evaluate(self) -> dict[str, float]:
        """eval/… on the test prompts (glassrl.rl.evaluation): ``logging.eval_k`` responses per
        prompt (greedy when 1) judged correct, scored by the run's reward; mean@k, pass@k, and
        eval/accuracy/<value> per value of the metadata field ``logging.eval_group_by``."""
        lg = self.cfg.logging
        return evaluate(
            self.test_records,
            self.data.ids,
            rollout=self.workers.rollout,
            reward=self.workers.reward,
            tokenizer=self.tokenizer,
            params=self._sampling(greedy=lg.eval_k == 1),
            k=lg.eval_k,
            threshold=lg.eval_threshold,
            group_by=lg.eval_group_by,
            chunk=self.resolved.responses_per_step,
        )

    # ------------------------------------------------------------------ what a checkpoint holds

    def _components(self) -> list:
        """Everything a checkpoint holds (glassrl.run.state), the run's config first (it is checked first)."""
        w = self.workers
        return [
            self.run_config,
            *[c for c in (w.actor, w.critic, w.rollout) if c is not None],
            self.rounds,
            *([w.reference] if w.reference is not None else []),
            self.prompts,
            self.counters,
            self.threads,
            state.Wrapped("kl_controller", "json", self.kl),
            *[s for s in (*self.shapers, self.sampler) if getattr(s, "part_names", ())],
            *([self.ptx.stream] if self.ptx is not None else []),
            state.GlobalRNG({"shuffle": self.shuffle}),
        ]
