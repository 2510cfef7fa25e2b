"""Models for the four roles: loading, log-probs, values, sequence scores.

Importing this package imports torch and transformers; command modules import it inside ``run()``.
"""

from glassrl.models.loading import (
    SCALAR_HEADS,
    has_scalar_head,
    load_causal_lm,
    load_scalar_model,
    load_tokenizer,
    pad_id,
    resolve_device,
    resolve_dtype,
    resolve_model_path,
    scalar_outputs,
)
from glassrl.models.logprobs import (
    logprobs_from_hidden,
    naive_entropy,
    naive_logprobs,
    position_ids_from_mask,
    response_logprobs,
)
from glassrl.models.scalar import last_token_index, sequence_scores
from glassrl.models.value_head import CausalLMWithValueHead
from glassrl.models.values import response_values

__all__ = [
    "SCALAR_HEADS",
    "CausalLMWithValueHead",
    "last_token_index",
    "load_causal_lm",
    "has_scalar_head",
    "load_scalar_model",
    "load_tokenizer",
    "logprobs_from_hidden",
    "pad_id",
    "naive_entropy",
    "naive_logprobs",
    "position_ids_from_mask",
    "resolve_device",
    "resolve_dtype",
    "resolve_model_path",
    "response_logprobs",
    "response_values",
    "scalar_outputs",
    "sequence_scores",
]
