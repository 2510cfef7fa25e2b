"""Advantage estimators: the types, the one registry, and ``compute_advantages``.

    ADVANTAGE_ESTIMATORS[name].fn(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs

Each entry (``types.AdvantageEstimator``) also declares the inputs the estimator needs and
the algo.* knobs it reads; the config checks, the trainer's phases and ``glassrl explain``
read the entry. Adding an estimator: docs/algorithms/README.md, "Adding an estimator".

Shapes: B batch (responses), T response length. Token convention: DESIGN §1.
The math sits beside its adapter: ``gae.py`` (GAE, TD errors, VAPO's
length-adaptive λ, REINFORCE++) and ``group.py`` (GRPO, Dr.GRPO, GRPO process
rewards, RLOO, ReMax, REINFORCE++-baseline); ``types.py`` holds the inputs,
parameters and outputs.

What each estimator returns as ``returns`` (all are 0 on masked positions):

| estimator | returns | verl function it follows |
|---|---|---|
| gae | A + V, raw A (the critic's target) | compute_gae_advantage_return |
| grpo, dr_grpo | the advantages | compute_grpo_outcome_advantage |
| rloo | the advantages | compute_rloo_outcome_advantage |
| grpo_process | the advantages | (none in verl) |
| remax | the reward-to-go Σ_{j≥i} r_j, undiscounted | compute_remax_outcome_advantage |
| reinforce_pp | the discounted return G_i, before whitening | compute_reinforce_plus_plus_outcome_advantage |
| reinforce_pp_baseline | S − group mean, before whitening | compute_reinforce_plus_plus_baseline_outcome_advantage |

No critic is fitted to the critic-free ones: the ledger shows their returns,
nothing trains on them. Two differ from verl on purpose: verl's
REINFORCE++-baseline returns the whitened values (here the raw ones, as DESIGN
§1 defines returns from raw advantages), and verl's ReMax advantage is the
reward-to-go minus the baseline per token (here S − baseline on every token,
the paper's; the same when the reward is an outcome score without KL).
"""

from __future__ import annotations

import functools
from dataclasses import fields

import torch

from glassrl.algos.advantages.gae import estimate_gae, estimate_reinforce_pp, gae_reference, td_errors
from glassrl.algos.advantages.group import (
    estimate_grpo,
    estimate_grpo_process,
    estimate_reinforce_pp_baseline,
    estimate_remax,
    estimate_rloo,
)
from glassrl.algos.advantages.types import (
    AdvantageEstimator,
    AdvantageInputs,
    AdvantageOutputs,
    AdvantageParams,
    Estimator,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "GROUP_ESTIMATORS",
    "REQUIRED_INPUTS",
    "AdvantageEstimator",
    "AdvantageInputs",
    "AdvantageOutputs",
    "AdvantageParams",
    "Estimator",
    "compute_advantages",
    "gae_reference",
    "td_errors",
]

# One entry per estimator: its function, the inputs it needs, the algo.* knobs it reads
# (types.AdvantageEstimator). Everything else keyed by estimator reads these entries.
ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "gae": AdvantageEstimator(estimate_gae, inputs=("values",), knobs=("gamma", "lam", "critic_lam", "length_alpha")),
    "grpo": AdvantageEstimator(functools.partial(estimate_grpo, normalize_by_std=True), inputs=("group_index",)),
    "dr_grpo": AdvantageEstimator(functools.partial(estimate_grpo, normalize_by_std=False), inputs=("group_index",)),
    "grpo_process": AdvantageEstimator(estimate_grpo_process, inputs=("group_index", "step_end_mask")),
    "rloo": AdvantageEstimator(estimate_rloo, inputs=("group_index",)),
    "remax": AdvantageEstimator(estimate_remax, inputs=("baseline_rewards",)),
    # the discounted return-to-go: GAE with V = 0 and λ = 1, so γ is its only knob
    "reinforce_pp": AdvantageEstimator(estimate_reinforce_pp, knobs=("gamma",)),
    "reinforce_pp_baseline": AdvantageEstimator(estimate_reinforce_pp_baseline, inputs=("group_index",)),
}

# Views of the entries, for readers that ask one question of every estimator.
REQUIRED_INPUTS: dict[str, tuple[str, ...]] = {name: e.inputs for name, e in ADVANTAGE_ESTIMATORS.items()}
GROUP_ESTIMATORS: frozenset[str] = frozenset(name for name, e in ADVANTAGE_ESTIMATORS.items() if e.group)

_SHAPES = {  # expected shape of each input, from (B, T)
    "token_rewards": lambda B, T: (B, T),
    "response_mask": lambda B, T: (B, T),
    "values": lambda B, T: (B, T),
    "group_index": lambda B, T: (B,),
    "baseline_rewards": lambda B, T: (B,),
    "step_end_mask": lambda B, T: (B, T),
}


def _check(name: str, inputs: AdvantageInputs) -> None:
    missing = [f for f in ADVANTAGE_ESTIMATORS[name].inputs if getattr(inputs, f) is None]
    if missing:
        raise ValueError(f"advantage estimator {name!r} needs AdvantageInputs.{missing[0]}")
    if inputs.response_mask.dtype != torch.bool:
        raise ValueError(f"AdvantageInputs.response_mask must be bool, got {inputs.response_mask.dtype}")
    B, T = inputs.token_rewards.shape
    for field in fields(inputs):
        value = getattr(inputs, field.name)
        expected = _SHAPES[field.name](B, T)
        if value is not None and tuple(value.shape) != expected:
            raise ValueError(f"AdvantageInputs.{field.name}: expected shape {expected}, got {tuple(value.shape)}")


def compute_advantages(name: str, inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs:
    """Run the estimator ``name`` after checking that its inputs are present and shaped."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {', '.join(ADVANTAGE_ESTIMATORS)}")
    _check(name, inputs)
    return ADVANTAGE_ESTIMATORS[name].fn(inputs, params)
