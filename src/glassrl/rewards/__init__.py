"""Reward sources: typed per-response results (ok / timeout / error), never a silent 0.

See :mod:`glassrl.rewards.base` for the protocol. Importing this package does not
import torch; the model-backed sources import it when built.
"""

from glassrl.rewards.base import RewardRequest, RewardResult, RewardSource
from glassrl.rewards.combine import CombinedReward
from glassrl.rewards.judge import JudgeSource
from glassrl.rewards.majority import MajorityVoteSource
from glassrl.rewards.math_answer import MathVerifier
from glassrl.rewards.registry import REWARD_SOURCES, build_combined, build_reward_source
from glassrl.rewards.reward_model import RewardModelSource
from glassrl.rewards.rubric import Criterion, RubricSource
from glassrl.rewards.user_function import UserFunctionSource
from glassrl.rewards.verifiers import ArithVerifyVerifier, ExactMatchVerifier, NumericVerifier
from glassrl.worker_pool import CallOutcome, WorkerPool, call_with_timeout, shared_pool

__all__ = [
    "REWARD_SOURCES",
    "ArithVerifyVerifier",
    "CallOutcome",
    "CombinedReward",
    "Criterion",
    "ExactMatchVerifier",
    "JudgeSource",
    "MajorityVoteSource",
    "MathVerifier",
    "NumericVerifier",
    "RewardModelSource",
    "RewardRequest",
    "RewardResult",
    "RewardSource",
    "RubricSource",
    "UserFunctionSource",
    "WorkerPool",
    "build_combined",
    "build_reward_source",
    "call_with_timeout",
    "shared_pool",
]
