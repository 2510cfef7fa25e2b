"""The token ledger: construction from tensors, writers, round trip, renderers."""

from __future__ import annotations

import csv
import io
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.errors import GlassrlError
from glassrl.ledger import ALL_FIELDS, TOKEN_FIELDS, Ledger, read_jsonl
from glassrl.ledger.model import RESPONSE_ROW, TOKEN_ROW
from glassrl.ledger.render import columns, fmt, to_markdown, to_text

PARAMS = dict(estimator="gae", gamma=1.0, lam=0.95, beta=0.1, kl_kind=None)


def small_ledger(**overrides) -> Ledger:
    """Two responses: lengths 4 (an observation token at 2) and 2, padded to T = 4."""
    mask = torch.tensor([[True, True, False, True], [True, True, False, False]])
    kwargs = dict(
        prompts=["p0", "p1"],
        token_texts=[["a", "b", "<obs>", "c"], ["x", "y"]],
        response_mask=mask,
        kl=torch.tensor([[0.1, 0.2, 0.0, 0.3], [0.5, 0.25, 9.0, 9.0]]),
        values=torch.tensor([[0.5, 0.25, 0.125, 1.0], [2.0, 3.0, 9.0, 9.0]]),
        advantages=torch.tensor([[1.0, -1.0, 0.5, 0.25], [0.0, 1.5, 9.0, 9.0]]),
        scores=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        finish_reasons=["stop", "length"],
        **PARAMS,
    )
    kwargs.update(overrides)
    return Ledger.from_tensors(**kwargs)


def test_from_tensors_rows_per_token_and_missing_quantities_are_none():
    ledger = small_ledger()
    r0, r1 = ledger.responses
    assert (r0.length, r1.length) == (4, 2)  # trailing padding dropped, observation kept
    assert [t.token for t in r0.tokens] == ["a", "b", "<obs>", "c"]
    assert [t.response_mask for t in r0.tokens] == [True, True, False, True]
    assert r0.response == "ab<obs>c"
    assert [t.values for t in r1.tokens] == [2.0, 3.0]
    assert [t.kl for t in r0.tokens] == pytest.approx([0.1, 0.2, 0.0, 0.3])
    row = r0.tokens[1]
    for name in ("logprobs", "ref_logprobs", "token_id", "deltas", "returns", "whitened_advantages"):
        assert getattr(row, name) is None
    assert (r0.score, r1.score, r0.group_id, r1.finish_reason) == (1.0, 0.0, 0, "length")


def _experience(values: bool, kl_in_reward: bool):
    """A hand-made Experience of 3 responses (the attributes glassrl.ledger.compute reads)."""
    from types import SimpleNamespace

    from glassrl.rl.experience import Experience
    from glassrl.rollout.base import RolloutBatch

    B, T = 3, 2
    mask = torch.tensor([[True, True], [True, False], [True, True]])
    rollout = RolloutBatch(
        torch.ones(B, 1, dtype=torch.long),
        torch.ones(B, 1, dtype=torch.bool),
        torch.tensor([[5, 6], [7, 0], [8, 9]]),
        mask,
        torch.tensor([0, 0, 1]),
        ["stop", "stop", "length"],
        ["r0", "r1", "r2"],
    )
    full = torch.arange(B * T, dtype=torch.float32).reshape(B, T)
    exp = Experience(
        rollout=rollout,
        records=[],
        prompts=["p0", "p0", "p1"],
        results=[],
        scored=torch.ones(B, dtype=torch.bool),
        raw_scores=torch.tensor([1.0, 0.0, 1.0]),
        scores=torch.tensor([1.0, 0.0, 1.0]),
        token_scores=full,
        step_end_mask=None,
        baseline_rewards=None,
        response_mask=mask,
        logprobs=-full,
        kl=full / 10,
        values=full if values else None,
        beta=0.25,
        kl_in_reward=kl_in_reward,
        token_rewards=full,
        advantages=full,
        returns=full,
    )
    tokenizer = SimpleNamespace(decode=lambda ids: f"<{ids[0]}>")
    return exp, tokenizer


def test_from_experience_records_what_the_step_had():
    from glassrl.ledger.compute import from_experience

    run = dict(estimator="gae", gamma=0.9, lam=0.95, kl_kind="k1", step=7)
    exp, tokenizer = _experience(values=True, kl_in_reward=True)
    ledger = from_experience(exp, tokenizer, **run, samples=2)  # the first 2 responses
    assert (ledger.estimator, ledger.gamma, ledger.lam, ledger.beta, ledger.kl_kind, ledger.step) == (
        "gae",
        0.9,
        0.95,
        0.25,
        "k1",
        7,
    )
    assert [r.prompt for r in ledger.responses] == ["p0", "p0"] and [r.length for r in ledger.responses] == [2, 1]
    assert [t.token for t in ledger.responses[0].tokens] == ["<5>", "<6>"]
    assert [t.values for t in ledger.responses[0].tokens] == [0.0, 1.0]
    assert [t.kl for t in ledger.responses[1].tokens] == pytest.approx([0.2])
    # no critic: λ and the values are not recorded; KL in the loss: β of the token rewards is 0
    exp, tokenizer = _experience(values=False, kl_in_reward=False)
    ledger = from_experience(exp, tokenizer, **run)
    assert len(ledger.responses) == 3 and (ledger.lam, ledger.beta, ledger.kl_kind) == (None, 0.0, "k1")
    assert all(t.values is None for r in ledger.responses for t in r.tokens)
    exp.kl = None  # no reference: no KL estimator
    assert from_experience(exp, tokenizer, **run).kl_kind is None


def test_from_tensors_action_quantities_are_none_on_observation_tokens():
    ledger = small_ledger(token_rewards=torch.ones(2, 4), returns=torch.ones(2, 4))
    obs = ledger.responses[0].tokens[2]
    assert not obs.response_mask
    assert (obs.token_rewards, obs.advantages, obs.returns) == (None, None, None)
    assert (obs.kl, obs.values) == (0.0, 0.125)  # inputs stay as given
    assert ledger.responses[0].tokens[3].advantages == 0.25


def test_from_tensors_explicit_lengths_and_token_ids():
    ledger = small_ledger(lengths=torch.tensor([3, 1]), token_ids=torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]]))
    assert [r.length for r in ledger.responses] == [3, 1]
    assert [t.token_id for t in ledger.responses[0].tokens] == [5, 6, 7]


def test_from_tensors_rejects_wrong_shapes():
    with pytest.raises(ValueError, match="values: expected shape"):
        small_ledger(values=torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"token_texts\[1\]"):
        small_ledger(token_texts=[["a", "b", "c", "d"], ["x"]])


def test_jsonl_round_trip_exact(tmp_path):
    ledger = small_ledger(step=7)
    path = tmp_path / "ledger.jsonl"
    ledger.to_jsonl(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 + 6  # one line per response, then one per token row (issue 33)
    head, first = json.loads(lines[0]), json.loads(lines[1])
    assert list(head) == list(RESPONSE_ROW) and list(first) == list(TOKEN_ROW)
    assert first["values"] == 0.5 and first["returns"] is None and first["step"] == 7 and head["step"] == 7
    assert read_jsonl(path) == ledger


finite = st.floats(allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    B=st.integers(1, 3),
    T=st.integers(1, 5),
    present=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_jsonl_round_trip_property(tmp_path_factory, data, B, T, present):
    mask = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B)))
    names = [
        "logprobs",
        "ref_logprobs",
        "kl",
        "token_scores",
        "token_rewards",
        "values",
        "deltas",
        "advantages",
        "returns",
        "whitened_advantages",
        "token_ids",
        "step_end_mask",
    ]
    tensors = {}
    for name, keep in zip(names, present):
        if not keep:
            continue
        if name == "step_end_mask":
            tensors[name] = torch.tensor(
                data.draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B))
            )
        elif name == "token_ids":
            tensors[name] = torch.tensor(
                data.draw(st.lists(st.lists(st.integers(0, 50000), min_size=T, max_size=T), min_size=B, max_size=B))
            )
        else:
            tensors[name] = torch.tensor(
                data.draw(st.lists(st.lists(finite, min_size=T, max_size=T), min_size=B, max_size=B)),
                dtype=torch.float64,
            )
    texts = [[data.draw(st.text(max_size=3)) for _ in range(T)] for _ in range(B)]
    ledger = Ledger.from_tensors(
        prompts=[f"p{b}" for b in range(B)],
        token_texts=texts,
        response_mask=mask,
        lengths=torch.full((B,), T),
        **tensors,
        **PARAMS,
    )
    path = tmp_path_factory.mktemp("rt") / "l.jsonl"
    ledger.to_jsonl(path)
    assert read_jsonl(path) == ledger


def test_read_jsonl_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    rows = small_ledger().rows()
    del rows[1]["values"]
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    with pytest.raises(GlassrlError, match=r"bad.jsonl:2: missing field 'values'"):
        read_jsonl(path)
    path.write_text("{not json\n", encoding="utf-8")
    with pytest.raises(GlassrlError, match=r"bad.jsonl:1: not valid JSON"):
        read_jsonl(path)
    rows = small_ledger().rows()
    rows[3]["gamma"] = 0.5
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    with pytest.raises(GlassrlError, match=r"bad.jsonl:4: run fields differ"):
        read_jsonl(path)
    with pytest.raises(GlassrlError, match="not found"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_csv_has_every_field_and_empty_cells_for_missing(tmp_path):
    path = tmp_path / "l.csv"
    small_ledger().to_csv(path)
    rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    assert len(rows) == 6
    assert tuple(rows[0]) == ALL_FIELDS
    assert rows[0]["returns"] == "" and rows[0]["values"] == "0.5" and rows[2]["response_mask"] == "False"
    assert "nan" not in path.read_text(encoding="utf-8").lower()


def test_markdown_table_cells():
    md = to_markdown(small_ledger())
    table = [line for line in md.splitlines() if line.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    # no token ids / log-probs given: those optional columns are left out; V is shown
    assert header == ["i", "a_i", "kl_i", "score_i", "r_i", "V(s_i)", "δ_i", "A_i", "R_i", "Â_i", "mask"]
    row2 = [c.strip() for c in table[4].strip("|").split("|")]
    # observation token: V as given, but no A (the tensor's 0.5 there is not an action's advantage)
    assert row2 == ["2", "<obs>", "0.0000", "—", "—", "0.1250", "—", "—", "—", "—", "0"]
    assert "response 1" in md and "finish length" in md


def test_markdown_escapes_pipes_and_shows_whitespace():
    ledger = small_ledger(token_texts=[["a|b", " x", "\n", "c"], ["x", "y"]], logprobs=torch.zeros(2, 4))
    md = to_markdown(ledger)
    assert "a\\|b" in md and "␣x" in md and "\\n" in md
    assert "log π(a_i\\|s_i)" in md  # header pipe escaped, so the table keeps its columns


def test_text_table_shows_dash_and_dims_observations():
    text = "\n".join(to_text(small_ledger()))
    assert "V(s_i)" in text and "—" in text and "0.1250" in text
    assert "<obs>" in text and "\x1b[" not in text
    styled = to_text(small_ledger(), styled=True)
    # response 0: its line, a blank, the header, the rule, then its 4 tokens; the observation (token 2) dim
    rows = styled[styled.index(next(x for x in styled if x.startswith("response 0"))) + 4 :][:4]
    assert [row.startswith("\x1b[2m") for row in rows] == [False, False, True, False]


def test_a_table_too_wide_for_the_terminal_continues_below_with_the_token_columns():
    ledger = small_ledger(logprobs=torch.zeros(2, 4))
    whole = to_text(ledger)
    assert max(map(len, whole)) > 60
    parts = to_text(ledger, width=60)
    assert max(len(line) for line in parts if not line.startswith(("response", "estimator"))) <= 60
    first = parts[: parts.index(next(x for x in parts if x.startswith("response 1")))]  # response 0's tables
    headers = [line.split() for line in first if line.startswith(" i ")]
    assert len(headers) > 1 and all(h[:2] == ["i", "a_i"] for h in headers)
    # every column of the whole table is in one of the parts, once
    columns_shown = [name for h in headers for name in h[2:]]
    assert sorted(columns_shown) == sorted(whole[3].split()[2:])


def test_columns_and_fmt():
    assert "logprobs" not in columns(small_ledger())
    assert "logprobs" in columns(small_ledger(logprobs=torch.zeros(2, 4)))
    assert fmt(None) == "—" and fmt(-0.00001) == "0.0000" and fmt(0.621081) == "0.6211"
    assert set(TOKEN_FIELDS) >= {"values", "returns", "whitened_advantages", "response_mask"}


# -------------------------------------------------------- phases 4 and 5 (the trainer's and explain's one sequence)


def test_token_rewards_and_credit_by_hand():
    from glassrl.algos.advantages import AdvantageParams
    from glassrl.ledger.compute import credit, token_rewards

    def close(got, want, atol=1e-9):
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=0, atol=atol)

    # Three responses to one prompt; the third failed its score, so none of its tokens trains.
    mask = torch.tensor([[True, True], [True, True], [False, False]])
    scores = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    kl = torch.tensor([[0.2, 0.4], [0.0, 0.2], [9.0, 9.0]], dtype=torch.float64)
    r = token_rewards(scores, kl, 0.5, mask)  # r_i = score_i − β·kl_i on training tokens, 0 elsewhere
    close(r, [[-0.1, 0.8], [0.0, -0.1], [0.0, 0.0]])
    close(token_rewards(scores, None, 0.5, mask), [[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])  # no KL estimate

    # GRPO over the rows that train: S = 0.7 and −0.1, mean 0.3, std (unbiased) 0.4·√2; the failed row
    # is out of its group's baseline and gets 0. Whitening: 4 training tokens, ±√3/2 (unbiased std).
    out = credit("grpo", r, mask, AdvantageParams(), group_index=torch.tensor([0, 0, 0]), whiten=True)
    a = 0.4 / (0.4 * 2**0.5 + 1e-6)
    close(out.advantages, [[a, a], [-a, -a], [0.0, 0.0]])
    w = 3**0.5 / 2
    close(out.whitened_advantages, [[w, w], [-w, -w], [0.0, 0.0]], atol=1e-7)  # masked_whiten's ε
    assert out.deltas is None

    # GAE with values: δ_i = r_i + γ·V(s_{i+1}) − V(s_i); A_1 = δ_1, A_0 = δ_0 + γλ·A_1; R = A + V.
    values = torch.tensor([[0.5, 0.25], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    one = torch.tensor([[True, True], [False, False], [False, False]])
    out = credit("gae", r, one, AdvantageParams(gamma=1.0, lam=0.5), values=values, whiten=False)
    d0, d1 = -0.1 + 0.25 - 0.5, 0.8 - 0.25
    close(out.deltas, [[d0, d1], [0.0, 0.0], [0.0, 0.0]])
    close(out.advantages, [[d0 + 0.5 * d1, d1], [0.0, 0.0], [0.0, 0.0]])
    close(out.returns, [[d0 + 0.5 * d1 + 0.5, d1 + 0.25], [0.0, 0.0], [0.0, 0.0]])
    assert out.whitened_advantages is None
    one_token = torch.tensor([[True, False], [False, False], [False, False]])
    assert credit("gae", r, one_token, AdvantageParams(), values=values, whiten=True).whitened_advantages is None
