"""The single-controller trainer (DESIGN §2): one step is seven phases, read top to bottom.

    trainer = Trainer(load_config(TrainConfig, "examples/grpo.yaml"))
    trainer.train()

The trainer owns the algorithm and talks to role workers (glassrl.workers.base);
it never touches a torch model. Algorithm variants plug in as small parts chosen
by config values, never by algorithm name: the estimator's REQUIRED_INPUTS decide
which inputs are computed (values → critic, baseline_rewards → greedy rollout),
score shapers (experience.SCORE_SHAPERS) by their keys, loss terms by their
coefficients (update.actor_terms).

Run directory (``output_dir``): config.yaml (the resolved config), metrics.jsonl,
tensorboard/ (when on), ledgers/step_XXXXXX.jsonl, checkpoints/ (glassrl.trainer.checkpoint).
"""

from __future__ import annotations

import json
import math
import re
import time
from functools import partial
from pathlib import Path

import torch
import yaml
from rich.console import Console

from glassrl.algos.advantages import REQUIRED_INPUTS, AdvantageParams
from glassrl.algos.kl import AdaptiveKLController, FixedKLController, kl_penalty
from glassrl.algos.masked import masked_mean
from glassrl.config import to_dict
from glassrl.errors import GlassrlError
from glassrl.ledger import Ledger
from glassrl.models.default_model import format_prompt
from glassrl.report.html import write_run_report
from glassrl.report.run_dir import collect_environment
from glassrl.report.sinks import ConsoleSink, JsonlSink, MetricSinks, TensorBoardSink
from glassrl.rollout.base import SamplingParams
from glassrl.trainer import experience as X
from glassrl.trainer import state
from glassrl.trainer.build import actor_path, build_local_workers, build_ptx, load_records, test_spec
from glassrl.trainer.checkpoint import CheckpointManager
from glassrl.trainer.common import seed_everything
from glassrl.trainer.config import TrainConfig, resolve
from glassrl.trainer.dynamic_sampling import DynamicSampler, OneRound, Sampled
from glassrl.trainer.metrics import PhaseTimer
from glassrl.trainer.step_metrics import accuracy, correct, response_metrics, reward_metrics, tensor_metrics
from glassrl.trainer.update import minibatch_plan

# Shown under the progress bar, in this order (when present).
CONSOLE_KEYS = (
    "reward/mean",
    "task/accuracy",
    "kl/mean",
    "actor/policy_loss",
    "critic/value_loss",
    "response/length/mean",
    "eval/accuracy",
    "perf/step_s",
)


class Trainer:
    """Builds the workers of ``cfg`` and runs its steps; ``resume`` continues from the latest checkpoint."""

    def __init__(
        self, cfg: TrainConfig, *, resume: bool = False, console: Console | None = None, progress: bool = True
    ) -> None:
        from glassrl.models import load_tokenizer

        self.cfg, self.resolved = cfg, resolve(cfg)
        self.console = console or Console()
        seed_everything(cfg.seed)
        path = actor_path(cfg, self.console)
        self.tokenizer = load_tokenizer(path)
        max_tokens = cfg.data.max_prompt_tokens
        self.prompts = state.PromptStream(
            load_records(cfg.data.train, "train", self.tokenizer, max_tokens, "data.train"), cfg.seed
        )
        spec = test_spec(cfg)
        self.test_records = [] if spec is None else load_records(spec, "test", self.tokenizer, max_tokens, "data.test")
        self.test_records = self.test_records[: cfg.data.eval_size]
        self.ptx = build_ptx(cfg, self.resolved, self.tokenizer)  # PPO-ptx's supervised batches, or None
        self.workers = build_local_workers(cfg, self.resolved, path, self.tokenizer, self.ptx)
        kl = cfg.algo.kl
        self.kl = (
            FixedKLController(kl.coef) if kl.target is None else AdaptiveKLController(kl.coef, kl.target, kl.horizon)
        )
        self.shapers = [make(cfg.algo) for on, make in X.SCORE_SHAPERS.values() if on(cfg.algo)]
        self.shuffle = torch.Generator().manual_seed(cfg.seed + 2)  # mini-batch order
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.sampler = (
            DynamicSampler(cfg.batch.prompts_per_step, cfg.algo.dynamic_sampling_max_rounds, pad_id)
            if cfg.algo.dynamic_sampling
            else OneRound()
        )
        self.counters = state.Counters()
        self.components = [c for c in (self.workers.actor, self.workers.critic, self.workers.rollout) if c is not None]
        self.components += [
            self.prompts,
            self.counters,
            state.Wrapped("kl_controller", "json", self.kl),
            *[s for s in (*self.shapers, self.sampler) if getattr(s, "part_names", ())],
            *([self.ptx.stream] if self.ptx is not None else []),
            state.GlobalRNG({"shuffle": self.shuffle}),
        ]
        self.out = Path(cfg.output_dir)
        self.checkpoints = CheckpointManager(self.out / "checkpoints", cfg.logging.keep_checkpoints)
        self._check_run_dir(resume)
        if resume:
            self.counters.step = state.restore(self.checkpoints, self.components)
        self.initial_eval: float | None = None  # eval/accuracy before the first step (set by train)
        self.timer = PhaseTimer()
        self.sinks = self._sinks(resume, progress)

    # ------------------------------------------------------------------ the step

    def step(self) -> dict[str, float]:
        """One training step (DESIGN §2); returns its metrics."""
        step, start = self.counters.step + 1, time.perf_counter()
        self.timer.reset()
        # 1–2. generate n responses per prompt and score them, in rounds (dynamic sampling) or one
        sampled, sampling = self.sampler.fill(partial(self._round, step))
        with self.timer.phase("score"):  # 2. shape the scores, place them on tokens; failures masked
            exp, flags = self._score(sampled)
        with self.timer.phase("logprobs"):  # 3. old and reference log-probs, values
            self._model_outputs(exp)
        with self.timer.phase("rewards"):  # 4. token rewards
            self._token_rewards(exp)
        with self.timer.phase("advantages"):  # 5. advantages and returns
            X.estimate_advantages(
                exp,
                self.cfg.algo.advantage,
                self._advantage_params(),
                self.cfg.algo.whiten_advantages,
                self.cfg.algo.gamma,
            )
        with self.timer.phase("update"):  # 6. update critic and actor
            updated = self._update(exp, step)
        self.counters.step = step
        metrics = self._metrics(exp, flags, {**sampling, **updated}, start)  # 7. log, ledger, evaluation, checkpoint
        self._log_and_save(step, exp, metrics)
        return metrics

    def train(self) -> dict[str, float]:
        """Run the remaining steps (evaluating before the first); returns the last metrics."""
        metrics: dict[str, float] = {}
        try:
            (self.out / "config.yaml").write_text(
                yaml.safe_dump(to_dict(self.cfg), sort_keys=False, allow_unicode=True)
            )
            (self.out / "environment.json").write_text(json.dumps(collect_environment(), indent=2))
            if self.counters.step == 0 and self.test_records:
                initial = self.evaluate()
                self.initial_eval = initial["eval/accuracy"]
                self.sinks.log(0, initial)
            while self.counters.step < self.cfg.steps:
                metrics = self.step()
        finally:
            self.sinks.close()
        if self.cfg.logging.report and self.counters.step == self.cfg.steps:
            write_run_report([self.out], self.out / "report.html")
        return metrics

    # ------------------------------------------------------------------ phases

    def _sampling(self, greedy: bool = False) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(r.max_new_tokens, r.temperature, r.top_p, r.top_k, greedy)

    def _round(self, step: int) -> Sampled:
        """Phases 1–2 for the next ``batch.prompts_per_step`` prompts: n responses each, their
        typed reward results (failures counted: too many stop the run)."""
        prompts = self.prompts.take(self.cfg.batch.prompts_per_step)
        with self.timer.phase("generate"):
            prompt_ids = [format_prompt(self.tokenizer, r.prompt) for r in prompts]
            rollout = self.workers.rollout.generate(prompt_ids, n=self.cfg.rollout.n, params=self._sampling())
            self.timer.add_tokens("generate", int(rollout.response_mask.sum()))
        with self.timer.phase("score"):
            records = [prompts[g] for g in rollout.group_index.tolist()]  # the record each response answers
            results = self.workers.reward.score(X.reward_requests(rollout, records, self.tokenizer))
            X.check_failure_rate(results, step, self.cfg.reward.max_failure_rate)
        return Sampled(rollout, prompts, prompt_ids, results)

    def _score(self, sampled: Sampled):
        """Phase 2: the Experience with scores placed on tokens and failed rows masked out; and
        the task verifier's verdict per response (for task/accuracy)."""
        rollout, prompts, prompt_ids, results = sampled.rollout, sampled.prompts, sampled.prompt_ids, sampled.results
        records = [prompts[g] for g in rollout.group_index.tolist()]  # the record each response answers
        requests = X.reward_requests(rollout, records, self.tokenizer)
        raw, scored = X.outcome_scores(results, rollout.response_mask.device)
        scores = raw
        for shape in self.shapers:
            scores = shape(scores, scored, rollout)
        exp = X.Experience(rollout, records, results, scored, scores, rollout.response_mask, raw_scores=raw)
        exp.token_scores, exp.step_end_mask = X.place_scores(results, scores, rollout, self.tokenizer)
        if "baseline_rewards" in REQUIRED_INPUTS[self.cfg.algo.advantage]:
            exp.baseline_rewards, baseline_ok = self._greedy_baseline(rollout, prompts, prompt_ids)
            scored = scored & baseline_ok
        rows = X.estimator_rows(self.cfg.algo.advantage, scored, rollout.group_index)
        exp.response_mask = rollout.response_mask & rows.unsqueeze(-1)  # (B, T)
        return exp, correct(requests)

    def _greedy_baseline(self, rollout, prompts, prompt_ids):
        """ReMax (Li et al. 2023, Algorithm 1): the reward of the greedy response to each prompt,
        per response (B,), and whether it was scored (B,)."""
        greedy = self.workers.rollout.generate(prompt_ids, n=1, params=self._sampling(greedy=True))
        results = self.workers.reward.score(X.reward_requests(greedy, prompts, self.tokenizer))
        scores, ok = X.outcome_scores(results, rollout.response_mask.device)
        return scores[rollout.group_index], ok[rollout.group_index]

    def _model_outputs(self, exp: X.Experience) -> None:
        batch = self._model_batch(exp)
        exp.logprobs, exp.entropy = self.workers.actor.compute_logprobs(batch)
        if self.workers.reference is not None:
            exp.ref_logprobs = self.workers.reference.compute_logprobs(batch)
            exp.kl = kl_penalty(exp.logprobs, exp.ref_logprobs, self.cfg.algo.kl.kind)
        if self.workers.critic is not None:
            exp.values = self.workers.critic.compute_values(batch)
        self.timer.add_tokens("logprobs", int(exp.rollout.attention_mask.sum()))

    def _token_rewards(self, exp: X.Experience) -> None:
        in_reward = self.cfg.algo.kl.placement == "reward"
        exp.beta = self.kl.value if exp.kl is not None else 0.0
        beta = exp.beta if in_reward else 0.0
        exp.token_rewards = X.token_rewards(exp.token_scores, exp.kl, beta, exp.response_mask)
        # Ziegler et al. 2019, §2.2: β adapts to the KL of the batch just sampled, measured per
        # token (verl's apply_kl_penalty; TRL sums over the sequence instead); n = responses.
        kl_mean = masked_mean(exp.kl, exp.response_mask).item() if in_reward else math.nan
        if math.isfinite(kl_mean):
            self.kl.update(kl_mean, self.resolved.responses_per_step)

    def _advantage_params(self) -> AdvantageParams:
        a = self.cfg.algo
        return AdvantageParams(gamma=a.gamma, lam=a.lam, critic_lam=a.critic_lam, length_alpha=a.length_alpha)

    def _update(self, exp: X.Experience, step: int) -> dict[str, float]:
        base = self._model_batch(exp)
        plan = minibatch_plan(len(exp.rollout), self.resolved.mini_batch_responses, self.cfg.batch.epochs, self.shuffle)
        metrics: dict[str, float] = {}
        if self.workers.critic is not None:
            critic_batch = {**base, "old_values": exp.values, "returns": exp.returns}
            metrics.update(self.workers.critic.update(critic_batch, plan))
        if step > self.cfg.algo.value_warmup_steps:  # VAPO value pre-training: critic only until then
            # "scores" marks VAPO's positive examples: correct answers, judged before any shaping.
            actor_batch = {
                **base,
                "old_logprobs": exp.logprobs,
                "advantages": exp.policy_advantages,
                "scores": exp.raw_scores,
            }
            if exp.ref_logprobs is not None:
                actor_batch["ref_logprobs"] = exp.ref_logprobs
            metrics.update(self.workers.actor.update(actor_batch, plan))
        tokens = int(exp.rollout.attention_mask.sum()) * self.cfg.batch.epochs
        self.timer.add_tokens("update", tokens * (2 if self.workers.critic is not None else 1))
        return metrics

    # ------------------------------------------------------------------ phase 7

    def _metrics(self, exp: X.Experience, flags, updated: dict[str, float], start: float) -> dict[str, float]:
        metrics = {**reward_metrics(exp.results), "task/accuracy": accuracy(flags), **response_metrics(exp)}
        metrics.update(tensor_metrics(exp))
        metrics.update(updated)
        metrics.update(self.timer.metrics())
        metrics["perf/step_s"] = time.perf_counter() - start
        return metrics

    def _log_and_save(self, step: int, exp: X.Experience, metrics: dict[str, float]) -> None:
        lg = self.cfg.logging
        if (lg.eval_every and step % lg.eval_every == 0 or step == self.cfg.steps) and self.test_records:
            metrics.update(self.evaluate())
        if step % lg.log_every == 0 or step == self.cfg.steps:
            self.sinks.log(step, metrics)
        if lg.ledger_every and (step % lg.ledger_every == 0 or step == self.cfg.steps):  # the last step: for the report
            (self.out / "ledgers").mkdir(exist_ok=True)
            self.ledger(exp, step).to_jsonl(self.out / "ledgers" / f"step_{step:06d}.jsonl")
        if lg.checkpoint_every and step % lg.checkpoint_every == 0 or step == self.cfg.steps:
            state.save(self.checkpoints, step, self.components)

    def evaluate(self) -> dict[str, float]:
        """Greedy responses to the test prompts, judged by the task's verifier: eval/accuracy, and
        with ``logging.eval_group_by`` eval/accuracy/<value> over the records whose metadata has
        that value (records without the key count in the total only)."""
        flags = []
        chunk = self.resolved.responses_per_step
        for start in range(0, len(self.test_records), chunk):
            records = self.test_records[start : start + chunk]
            ids = [format_prompt(self.tokenizer, r.prompt) for r in records]
            rollout = self.workers.rollout.generate(ids, n=1, params=self._sampling(greedy=True))
            flags += correct(X.reward_requests(rollout, records, self.tokenizer))
        metrics = {"eval/accuracy": accuracy(flags)}
        key = self.cfg.logging.eval_group_by
        if key is not None:
            groups: dict[str, list[bool | None]] = {}
            for record, flag in zip(self.test_records, flags):
                if key in record.metadata:
                    groups.setdefault(metric_segment(record.metadata[key]), []).append(flag)
            metrics.update({f"eval/accuracy/{value}": accuracy(group) for value, group in sorted(groups.items())})
        return metrics

    def ledger(self, exp: X.Experience, step: int) -> Ledger:
        """The first ``logging.ledger_samples`` responses of the step (whole groups first), every token."""
        k = min(self.cfg.logging.ledger_samples, len(exp.rollout))
        rows = torch.arange(k)
        pick = lambda t: None if t is None else t[:k]  # noqa: E731
        rollout = exp.rollout.select(rows)
        a = self.cfg.algo
        return Ledger.from_tensors(
            prompts=[X.prompt_text(self.tokenizer, r.prompt) for r in exp.records[:k]],
            token_texts=[[self.tokenizer.decode([t]) for t in row.tolist()] for row in rollout.response_ids],
            response_mask=pick(exp.response_mask),
            estimator=a.advantage,
            gamma=a.gamma,
            lam=a.lam if exp.values is not None else None,
            beta=exp.beta if a.kl.placement == "reward" else 0.0,
            kl_kind=a.kl.kind if exp.kl is not None else None,
            token_ids=rollout.response_ids,
            logprobs=pick(exp.logprobs),
            ref_logprobs=pick(exp.ref_logprobs),
            kl=pick(exp.kl),
            token_scores=pick(exp.token_scores),
            token_rewards=pick(exp.token_rewards),
            values=pick(exp.values),
            deltas=pick(exp.deltas),
            advantages=pick(exp.advantages),
            returns=pick(exp.returns),
            whitened_advantages=pick(exp.whitened_advantages),
            step_end_mask=pick(exp.step_end_mask),
            scores=pick(exp.scores),
            group_ids=rollout.group_index,
            baseline_rewards=pick(exp.baseline_rewards),
            lengths=rollout.lengths,
            finish_reasons=rollout.finish_reasons,
            responses=rollout.texts,
            step=step,
        )

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _model_batch(exp: X.Experience) -> dict[str, torch.Tensor]:
        r = exp.rollout
        return {"input_ids": r.input_ids, "attention_mask": r.attention_mask, "response_mask": exp.response_mask}

    def _check_run_dir(self, resume: bool) -> None:
        """A fresh run must not mix with an old one; a resumed run must have the same config."""
        saved = self.out / "config.yaml"
        if not resume:
            if self.checkpoints.checkpoints():
                raise GlassrlError(
                    f"output_dir = {self.out} already holds checkpoints: resume with --resume, "
                    "or choose another output_dir"
                )
            return
        if saved.is_file():
            old, new = _flatten(yaml.safe_load(saved.read_text(encoding="utf-8"))), _flatten(to_dict(self.cfg))
            changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
            if changed:
                raise GlassrlError(
                    f"--resume: the config differs from {saved} in {', '.join(changed)} "
                    f"({changed[0]}: {old.get(changed[0])!r} then, {new.get(changed[0])!r} now); "
                    "a resumed run continues the same run"
                )

    def _sinks(self, resume: bool, progress: bool) -> MetricSinks:
        self.out.mkdir(parents=True, exist_ok=True)
        step = self.counters.step
        jsonl = JsonlSink(self.out / "metrics.jsonl")
        if resume:
            jsonl.truncate_after(step)
        elif step == 0:
            jsonl.truncate_after(-1)  # a fresh run starts a fresh log
        sinks = [jsonl]
        if self.cfg.logging.tensorboard:
            sinks.append(TensorBoardSink(self.out / "tensorboard", purge_step=step + 1 if resume else None))
        if progress:
            sinks.append(ConsoleSink(self.cfg.steps, CONSOLE_KEYS, start_step=step, console=self.console))
        return MetricSinks(sinks)


def metric_segment(value) -> str:
    """A metadata value as one segment of a metric key: lower case, runs of other characters → "_"."""
    return re.sub(r"[^a-z0-9_-]+", "_", str(value).lower()).strip("_") or "_"


def _flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and scalars are leaves."""
    flat: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
