"""Values read at the position before each response token (DESIGN §1), and sequence scores."""

from __future__ import annotations

import pytest
import torch

from glassrl.models import (
    CausalLMWithValueHead,
    last_token_index,
    load_scalar_model,
    position_ids_from_mask,
    response_values,
    sequence_scores,
)

PROMPT = [5, 17, 42, 8]
RESPONSE = [30, 31, 32, 33, 34]


def _critic(path, head):
    torch.manual_seed(11)
    return load_scalar_model(path, head=head, device="cpu")


def _hidden_and_head(critic, ids, mask):
    """Last hidden states (B, L, H) straight from the decoder, and the scalar head."""
    backbone = critic.backbone if isinstance(critic, CausalLMWithValueHead) else critic
    out = backbone.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask))
    return out.last_hidden_state, (critic.v_head if isinstance(critic, CausalLMWithValueHead) else critic.score)


@pytest.mark.parametrize("head", ["token-classification", "value-head"])
def test_value_i_comes_from_position_before_token_i(tiny_lm_path, head):
    critic = _critic(tiny_lm_path, head)
    ids = torch.tensor([PROMPT + RESPONSE])
    mask = torch.ones_like(ids)
    P, T = len(PROMPT), len(RESPONSE)
    with torch.no_grad():
        values = response_values(critic, ids, mask, T)
        hidden, score = _hidden_and_head(critic, ids, mask)
    assert values.shape == (1, T)
    for i in range(T):
        expected = score(hidden[:, P + i - 1]).squeeze(-1)  # (1,)
        torch.testing.assert_close(values[:, i], expected, rtol=1e-6, atol=1e-6)
    # values[0] sits on the last prompt token; no value is read at the last response token.
    assert not torch.allclose(values[:, 0], score(hidden[:, P]).squeeze(-1))


@pytest.mark.parametrize("head", ["token-classification", "value-head"])
def test_value_i_has_not_seen_token_i(tiny_lm_path, head):
    """V(s_i) depends on x ⊕ y_<i only: changing y_k leaves values[:k+1] and moves values[k+1]."""
    critic = _critic(tiny_lm_path, head)
    k = 2
    ids = torch.tensor([PROMPT + RESPONSE])
    changed = ids.clone()
    changed[0, len(PROMPT) + k] = 77
    mask = torch.ones_like(ids)
    with torch.no_grad():
        before = response_values(critic, ids, mask, len(RESPONSE))
        after = response_values(critic, changed, mask, len(RESPONSE))
    assert torch.equal(before[:, : k + 1], after[:, : k + 1])
    assert (before[:, k + 1 :] - after[:, k + 1 :]).abs().min() > 1e-4


def test_values_on_left_padded_batch_equal_unpadded(tiny_lm_path, make_batch):
    critic = _critic(tiny_lm_path, "value-head")
    prompts, responses = [PROMPT, [9, 10]], [RESPONSE, [50, 51, 52]]
    ids, mask, _, T = make_batch(prompts, responses)
    with torch.no_grad():
        batched = response_values(critic, ids, mask, T)
        for row, (p, r) in enumerate(zip(prompts, responses)):
            one = torch.tensor([p + r])
            alone = response_values(critic, one, torch.ones_like(one), len(r))
            torch.testing.assert_close(batched[row, : len(r)], alone[0], rtol=1e-5, atol=1e-5)


# --- sequence scores ----------------------------------------------------------


def test_last_token_index_table():
    mask = torch.tensor(
        [
            [1, 1, 1, 0, 0],  # right padding
            [0, 0, 1, 1, 1],  # left padding
            [0, 1, 1, 0, 0],  # both
            [1, 1, 1, 1, 1],  # none
        ]
    )
    assert last_token_index(mask).tolist() == [2, 4, 2, 4]
    assert last_token_index(mask.bool()).tolist() == [2, 4, 2, 4]


@pytest.mark.parametrize("head", ["token-classification", "value-head"])
def test_sequence_scores_any_padding(tiny_lm_path, head):
    rm = _critic(tiny_lm_path, head)
    rows = [[5, 17, 42, 8, 30], [9, 10, 11]]
    right = torch.tensor([rows[0], rows[1] + [0, 0]])
    right_mask = torch.tensor([[1] * 5, [1, 1, 1, 0, 0]])
    left = torch.tensor([rows[0], [0, 0] + rows[1]])
    left_mask = torch.tensor([[1] * 5, [0, 0, 1, 1, 1]])
    with torch.no_grad():
        alone = torch.stack(
            [sequence_scores(rm, torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long))[0] for r in rows]
        )
        from_right = sequence_scores(rm, right, right_mask)
        from_left = sequence_scores(rm, left, left_mask)
        # The score is the scalar at the last real token, computed by hand from the head.
        hidden, score = _hidden_and_head(rm, torch.tensor([rows[1]]), torch.ones(1, 3, dtype=torch.long))
    assert from_right.shape == (2,)
    torch.testing.assert_close(from_right, alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(from_left, alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(alone[1], score(hidden[0, -1]).squeeze(-1), rtol=1e-6, atol=1e-6)
