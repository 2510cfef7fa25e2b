"""What a ``glassrl train`` run checks about itself while it runs (``check.*``): the sync truth check
(glassrl.workers.sync_truth). A section of glassrl.rl.config.TrainConfig."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from glassrl.config import option


@dataclass
class CheckConfig:
    sync: bool = option(
        True,
        help=(
            "after every weight sync to a sampler (Ray rollout ranks placed apart, asynchronous rollout, LoRA "
            "adapters, the reference that follows the actor), compare per-tensor checksums of both sides "
            "(docs/debugging.md, sync truth check)"
        ),
    )
    sync_probe_every: int = option(
        10,
        help=(
            "with check.sync: every N actor updates (and at the first sync) a fixed probe batch is scored by "
            "the sampler and the trainer, and the first token whose log-prob moved is named; 0 = never"
        ),
    )
    sync_probe_tolerance: float | None = option(
        None,
        help=(
            "the largest |Δ log-prob| at a probe token that passes, the same for every token; null = by dtype, per "
            "token: 1e-3 + 16·u·(the trainer's logit spread max − min at that token), u = 2^-24 float32, 2^-8 "
            "bfloat16, 2^-11 float16 (docs/debugging.md, the probe's tolerance)"
        ),
    )
    on_sync_breach: Literal["stop", "warn"] = option(
        "stop", help="a sync the check cannot prove: stop the run (exit 2) or warn and go on"
    )
