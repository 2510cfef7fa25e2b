"""GAE, TD errors, VAPO's length-adaptive λ and REINFORCE++: the estimators
built on the discounted reverse sum, with the observation-token carry of DESIGN §1.

Shapes: B batch, T response length. ``token_rewards`` r_i, ``values`` V(s_i)
and ``response_mask`` are (B, T); ``lam`` is a float or a (B,) tensor (one λ
per row, for VAPO's length-adaptive λ).

GAE (Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE",
eq. 16): δ_i = r_i + γ·V(s_{i+1}) − V(s_i), A_i = Σ_l (γλ)^l δ_{i+l}, with
V(s_T) = 0. Positions where ``response_mask`` is False (tool/observation tokens
inside a response, padding after it) are skipped: the recursion carries the
next value and the running advantage across them unchanged (verl
``compute_gae_advantage_return``, multi-turn version), so the last generated
token before an observation bootstraps from the first generated token after
it. That makes GAE on a row equal to GAE on its valid tokens alone, which is
how the fast path computes it. Outputs are 0 on masked positions.

``estimate_gae`` and ``estimate_reinforce_pp`` adapt this math to the one
estimator signature (``glassrl.algos.advantages.types``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glassrl.algos.advantages.types import AdvantageInputs, AdvantageOutputs, AdvantageParams
from glassrl.algos.masked import masked_whiten

# Chunk length of the fast scan. Work is O(B·T·CHUNK) and the recursion depth
# is log_CHUNK(T); 16 measured fastest on 2 CPU cores for B = 256, T ≤ 8192.
CHUNK = 16


def _zero(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def _row_lam(lam: float | torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """λ as a (B, 1) tensor of x's dtype."""
    return torch.as_tensor(lam, dtype=x.dtype, device=x.device).expand(x.shape[0]).reshape(-1, 1)


def gae_reference(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slow reference: the backward Python loop over T (as verl), vectorised over B.

    Returns (advantages, returns), both (B, T), returns = advantages + values
    on valid tokens, 0 on masked positions.
    """
    lam = _row_lam(lam, token_rewards).squeeze(1)  # (B,)
    B, T = token_rewards.shape
    next_value = torch.zeros(B, dtype=values.dtype, device=values.device)
    running = torch.zeros(B, dtype=values.dtype, device=values.device)
    advantages = torch.zeros_like(token_rewards)
    for t in reversed(range(T)):
        valid = response_mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        # Masked positions leave both carries unchanged (DESIGN §1).
        running = torch.where(valid, delta + gamma * lam * running, running)
        next_value = torch.where(valid, values[:, t], next_value)
        advantages[:, t] = torch.where(valid, running, _zero(running))
    returns = torch.where(response_mask, advantages + values, _zero(values))
    return advantages, returns


def _slots(response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) long: rank of token t among its row's valid tokens; T for masked tokens.

    Moving each valid token to its slot packs the row's valid tokens to the
    left in order (GAE on them equals GAE with the carry); masked tokens all go
    to a spare column T that is dropped. Cumsum, O(B·T), no sort.
    """
    rank = response_mask.to(torch.int32).cumsum(-1, dtype=torch.int32) - 1  # (B, T)
    return torch.where(response_mask, rank, response_mask.shape[1]).long()


def _pack(x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """(B, T): each row's valid tokens moved left, zeros after them."""
    B, T = x.shape
    packed = torch.zeros((B, T + 1), dtype=x.dtype, device=x.device).scatter(1, slots, x)
    return packed[:, :T]


def _unpack(packed: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Inverse of ``_pack`` (B, T); masked positions read the spare zero column."""
    return F.pad(packed, (0, 1)).gather(1, slots)


def _packed_deltas(rewards: torch.Tensor, values: torch.Tensor, gamma: float) -> torch.Tensor:
    """δ on packed rows: the zeros past the last valid token give V(s_T) = 0."""
    return rewards + gamma * F.pad(values[:, 1:], (0, 1)) - values


def discounted_reverse_cumsum(x: torch.Tensor, discount: torch.Tensor) -> torch.Tensor:
    """y_t = Σ_{j ≥ t} discount^(j − t) · x_j along the last axis; x (B, T), discount (B, 1).

    Chunked: inside a chunk of C steps y = M x with M[i, j] = discount^(j − i)
    for j ≥ i (0 below); chunks are linked by the same scan, one level up, on
    each chunk's first entry with discount^C. Only non-negative powers ≤ C
    appear, so nothing overflows at any T (no discount^(−t) rescaling).
    """
    B, T = x.shape
    C = min(CHUNK, T)
    K = -(-T // C)  # number of chunks
    x = F.pad(x, (0, K * C - T)).reshape(B, K, C)  # (B, K, C)
    steps = torch.arange(C, device=x.device)
    exponents = (steps.unsqueeze(0) - steps.unsqueeze(1)).to(x.dtype)  # (C, C): j − i
    upper = exponents >= 0
    # (B, C, C); where(), not a product, so the masked lower triangle cannot be inf·0.
    powers = torch.where(upper, discount.unsqueeze(-1) ** exponents.clamp(min=0), _zero(x))
    local = torch.einsum("bkj,bij->bki", x, powers)  # (B, K, C): sums inside each chunk
    if K == 1:
        return local.reshape(B, C)[:, :T]
    chunk_starts = discounted_reverse_cumsum(local[:, :, 0], discount**C)  # (B, K)
    carry = F.pad(chunk_starts[:, 1:], (0, 1))  # (B, K): y at next chunk
    tail_powers = discount ** (C - steps).to(x.dtype)  # (B, C): discount^(C − i)
    y = local + carry.unsqueeze(-1) * tail_powers.unsqueeze(1)  # (B, K, C)
    return y.reshape(B, K * C)[:, :T]


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast GAE, equal to ``gae_reference``: (advantages, returns), both (B, T)."""
    slots = _slots(response_mask)
    deltas = _packed_deltas(_pack(token_rewards, slots), _pack(values, slots), gamma)
    packed = discounted_reverse_cumsum(deltas, gamma * _row_lam(lam, deltas))
    advantages = _unpack(packed, slots)
    returns = torch.where(response_mask, advantages + values, _zero(values))
    return advantages, returns


def td_errors(
    token_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """δ_i = r_i + γ·V(next valid state) − V(s_i) (B, T); 0 on masked positions.

    The next state is that of the next valid token (carry over observation
    tokens), V = 0 after the last one: the δ that ``gae`` sums.
    """
    slots = _slots(response_mask)
    deltas = _packed_deltas(_pack(token_rewards, slots), _pack(values, slots), gamma)
    return _unpack(deltas, slots)


def length_adaptive_lam(response_mask: torch.Tensor, alpha: float) -> torch.Tensor:
    """λ_b = 1 − 1/(α·l_b), l_b = valid tokens of row b (VAPO, Yue et al. 2025, §3.2). (B,).

    Clamped to [0, 1]: a row shorter than 1/α would get λ < 0, which is no
    weighting of n-step returns at all; 0 (one-step TD) is the nearest valid λ.
    """
    lengths = response_mask.sum(-1).to(torch.get_default_dtype())  # (B,)
    return (1.0 - 1.0 / (alpha * lengths)).clamp(0.0, 1.0)


def estimate_gae(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs:
    """GAE ("gae"): A from GAE, R = A + V with the raw A (verl compute_gae_advantage_return).

    Policy λ fixed, or VAPO's length-adaptive λ (Yue et al. 2025, §3.2) when
    ``length_alpha`` is set; with ``critic_lam`` or ``length_alpha`` the returns
    come from their own GAE run with λ_critic (VAPO's decoupled GAE, §3.1).
    """
    if params.length_alpha is None:
        policy_lam: float | torch.Tensor = params.lam
    else:
        policy_lam = length_adaptive_lam(inputs.response_mask, params.length_alpha)
    args = (inputs.token_rewards, inputs.values, inputs.response_mask, params.gamma)
    advantages, returns = gae(*args, policy_lam)
    if params.critic_lam is not None or params.length_alpha is not None:
        critic_lam = params.lam if params.critic_lam is None else params.critic_lam
        returns = gae(*args, critic_lam)[1]
    return AdvantageOutputs(advantages, returns)


def estimate_reinforce_pp(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs:
    """REINFORCE++ ("reinforce_pp"): A = the discounted returns whitened over the batch; R = those returns.

    REINFORCE++ (Hu 2025, arXiv 2501.03262): token-level discounted return
    G_i = Σ_j γ^(j−i) r_j, i.e. GAE with V = 0 and λ = 1 (same carry over
    observation tokens), then whitening over all valid tokens of the batch (its
    "global advantage normalization"). R = G before whitening, as verl's
    compute_reinforce_plus_plus_outcome_advantage returns.
    """
    zeros = torch.zeros_like(inputs.token_rewards)
    returns = gae(inputs.token_rewards, zeros, inputs.response_mask, params.gamma, 1.0)[0]
    return AdvantageOutputs(masked_whiten(returns, inputs.response_mask), returns)
