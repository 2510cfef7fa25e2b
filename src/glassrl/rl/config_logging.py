"""What a ``glassrl train`` run writes and watches (``logging.*``): metric rows and trackers, ledger samples,
evaluations, checkpoints, the report, the reward-hacking watch. A section of glassrl.rl.config.TrainConfig."""

from __future__ import annotations

from dataclasses import dataclass

from glassrl.config import option


@dataclass
class WandbConfig:
    """Weights & Biases (``pip install 'glassrl[wandb]'``); WANDB_MODE=offline writes the run locally."""

    project: str = option("glassrl", help="W&B project the run is logged to")
    name: str | None = option(None, help="the W&B run's name; null = the name of output_dir")
    entity: str | None = option(None, help="W&B team or user; null = the logged-in user's default")


@dataclass
class MlflowConfig:
    """MLflow (``pip install 'glassrl[mlflow]'``): a tracking server, or a local store."""

    tracking_uri: str | None = option(
        None, help="http(s)://… or file://…; null = MLFLOW_TRACKING_URI, else MLflow's default"
    )
    experiment: str = option("glassrl", help="MLflow experiment the run is logged to")
    name: str | None = option(None, help="the MLflow run's name; null = the name of output_dir")


@dataclass
class LoggingConfig:
    log_every: int = option(1, help="steps between metric rows (metrics.jsonl, console, TensorBoard, W&B, MLflow)")
    tensorboard: bool = option(False, help="also write TensorBoard event files under output_dir/tensorboard")
    wandb: WandbConfig | None = option(None, help="also log to Weights & Biases; true = the defaults; null = off")
    mlflow: MlflowConfig | None = option(None, help="also log to MLflow; true = the defaults; null = off")
    ledger_every: int = option(
        10, help="steps between ledger samples (output_dir/ledgers/step_XXXXXX.jsonl); 0 = never"
    )
    ledger_samples: int = option(4, help="responses per ledger sample")
    eval_every: int = option(
        0, help="steps between greedy evaluations on the test set; 0 = only before the first and after the last step"
    )
    eval_group_by: str | None = option(
        None, help="a metadata key of the test records (e.g. lang): also eval/accuracy/<value> per value"
    )
    eval_k: int = option(1, help="responses per evaluation prompt: 1 = greedy; k > 1 = sampled, for mean@k and pass@k")
    eval_threshold: float = option(
        1.0, help="a response is correct when its reward reaches this (a verifier's verdict wins)"
    )
    checkpoint_every: int = option(0, help="steps between checkpoints; 0 = only after the last step")
    keep_checkpoints: int = option(2, help="newest checkpoints kept on disk")
    report: bool = option(True, help="write output_dir/report.html (glassrl report) at the end of the run")
    report_every: int = option(0, help="steps between refreshes of report.html during the run; 0 = only at the end")
    watch_window: int = option(
        10, help="reward-hacking watch (docs/debugging.md): steps each signal is read over; 0 = off"
    )
    watch_threshold: float = option(
        2.0, help="the watch fires when proxy and gold part (or a signal jumps) by more than this many spreads"
    )
