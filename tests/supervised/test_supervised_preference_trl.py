"""What a TRL DPOConfig user reaches for (issue 44 item 3): truncation as TRL's DPOTrainer cuts,
gradient accumulation, epochs, RPO/CPO/ORPO/BCO in a run (BCO's δ across a resume), SimPO's β, and
TRL's names answered with glassrl's keys for every supervised command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from glassrl.config import describe, load_config
from glassrl.data.preferences import preference_pairs
from glassrl.errors import GlassrlError
from glassrl.optim import OptimConfig
from glassrl.supervised.foreign_names import PREFERENCE, REWARD, SFT
from glassrl.supervised.preference import LEDGER_FILE, PreferenceObjective, train_preference
from glassrl.supervised.preference_config import PreferenceConfig
from glassrl.supervised.preference_data import Rule, truncate
from glassrl.supervised.rm import RMConfig
from glassrl.supervised.sft import SFTConfig

CPU = torch.device("cpu")
DOC = (Path(__file__).resolve().parents[2] / "docs" / "trl-verl.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl_pairs")
    files = {}
    for split, size in (("train", 24), ("test", 10)):
        rows = [
            {"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in preference_pairs(split, size=size)
        ]
        path = root / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        files[split] = str(path)
    return files


def _cfg(tiny_model_dir, pair_files, out, **kw) -> PreferenceConfig:
    base = dict(
        model=str(tiny_model_dir),
        data=pair_files["train"],
        eval_data=pair_files["test"],
        optim=OptimConfig(lr=3e-3, warmup_steps=0, decay="cosine"),
        steps=4,
        batch_size=4,
        log_every=1,
        output_dir=str(out),
        device="cpu",
        threads=1,
    )
    return PreferenceConfig(**(base | kw))


def _weights(out):
    return load_file(Path(out) / "model.safetensors")


def _rows(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- truncation, by hand


P, C, R = [1, 2, 3, 4], [10, 11, 12, 13, 14], [20, 21]  # prompt 4, chosen 5, rejected 2 tokens


@pytest.mark.parametrize(
    ("rule", "prompt", "responses"),
    [
        (Rule(9), P, [C, R]),  # 4 + 5 fits: nothing cut
        (Rule(7, mode="keep_start"), P, [[10, 11, 12], R]),  # responses keep their first 7 − 4 tokens
        (Rule(7, mode="keep_end"), [3, 4], [C, R]),  # the prompt keeps its last 7 − 5 tokens, for both
        (Rule(9, max_prompt_length=2), [3, 4], [C, R]),  # TRL's prompt_input_ids[-max_prompt_length:]
        (Rule(9, max_completion_length=3), P, [[10, 11, 12], R]),  # TRL's chosen_input_ids[:max_completion_length]
        (Rule(5, max_prompt_length=3, mode="keep_end"), [4], [[11, 12, 13, 14], R]),  # a response alone fills it
    ],
)
def test_truncation_is_trl_s_rule(rule, prompt, responses):
    cut_prompt, cut, changed = truncate(P, [C, R], rule, "pairs.jsonl:1")
    assert (cut_prompt, cut) == (prompt, responses)
    assert changed == ((prompt, responses) != (P, [C, R]))
    assert len(cut_prompt) + max(map(len, cut)) <= rule.max_length


def test_a_prompt_that_fills_max_length_under_keep_start_names_the_pair():
    with pytest.raises(
        GlassrlError, match=r"pairs.jsonl:3: the prompt alone is 4 tokens, max_length = 4.*max_prompt_length"
    ):
        truncate(P, [C, R], Rule(4), "pairs.jsonl:3")


def test_a_long_pair_is_cut_with_a_line_instead_of_refused(tiny_model_dir, pair_files, tmp_path, capsys):
    """Before issue 44 a pair past max_length was an error; now it is cut as TRL cuts, and said."""
    cfg = _cfg(tiny_model_dir, pair_files, tmp_path / "run", max_length=14, steps=2)
    obj = PreferenceObjective.build(cfg, CPU)
    line = capsys.readouterr().out
    assert re.search(r"dpo: \d+ of 24 training pairs and \d+ of 10 held-out pairs cut to fit \(max_length = 14", line)
    assert all(len(p) + max(len(c), len(r)) <= 14 for _, (p, c, r, _) in obj.train)
    assert train_preference(cfg)["steps"] == 2


# ---------------------------------------------------------------- batches: accumulation, epochs


def test_micro_batches_give_the_batch_s_step(tiny_model_dir, pair_files, tmp_path):
    """batch_size 4 in passes of 2 (TRL: per_device_train_batch_size 2, gradient_accumulation_steps 2)
    ends with the weights and metric rows of one pass of 4, up to float32 rounding."""
    one = _cfg(tiny_model_dir, pair_files, tmp_path / "one")
    two = _cfg(tiny_model_dir, pair_files, tmp_path / "two", micro_batch_size=2)
    train_preference(one)
    train_preference(two)
    a, b = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=2e-5, rtol=1e-4)
    for row_a, row_b in zip(_rows(tmp_path / "one"), _rows(tmp_path / "two")):
        for key in ("train/loss", "train/rewards/margins", "train/rewards/accuracies"):
            assert row_a[key] == pytest.approx(row_b[key], abs=1e-4), key


def test_epochs_set_the_steps(tiny_model_dir, pair_files, tmp_path):
    cfg = _cfg(tiny_model_dir, pair_files, tmp_path / "run", steps=200, epochs=0.5)  # 0.5 × 24 / 4 = 3 steps
    assert PreferenceObjective.build(cfg, CPU).steps == 3
    assert train_preference(cfg)["steps"] == 3
    assert [r["step"] for r in _rows(tmp_path / "run")] == [1, 2, 3]


# ---------------------------------------------------------------- the new losses in a run


def test_rpo_s_ledger_shows_the_nll_terms(tiny_model_dir, pair_files, tmp_path):
    train_preference(_cfg(tiny_model_dir, pair_files, tmp_path / "run", rpo_alpha=1.0, steps=2))
    ledger = json.loads((tmp_path / "run" / "ledgers" / LEDGER_FILE).read_text().splitlines()[0])
    nll = [t["nll"] for t in ledger["chosen"]["tokens"]]
    assert all(v is not None and v > 0 for v in nll) and all(t["nll"] is None for t in ledger["rejected"]["tokens"])
    assert ledger["params"]["rpo_alpha"] == 1.0


def test_bco_keeps_its_running_mean_across_a_resume(tiny_model_dir, pair_files, tmp_path, monkeypatch):
    whole = _cfg(tiny_model_dir, pair_files, tmp_path / "a", loss="bco", checkpoint_every=2)
    train_preference(whole)
    broken = _cfg(tiny_model_dir, pair_files, tmp_path / "b", loss="bco", checkpoint_every=2)
    calls, real = {"n": 0}, PreferenceObjective.loss

    def dies_at_step_3(self, examples):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, examples)

    monkeypatch.setattr(PreferenceObjective, "loss", dies_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        train_preference(broken)
    monkeypatch.setattr(PreferenceObjective, "loss", real)
    train_preference(broken, resume=True)
    assert _rows(tmp_path / "a") == _rows(tmp_path / "b")
    a, b = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)
    ledger = json.loads((tmp_path / "a" / "ledgers" / LEDGER_FILE).read_text().splitlines()[0])
    assert ledger["params"]["bco_delta"] != 0.0  # δ, the running mean, is shown
    summary = json.loads((tmp_path / "a" / "glassrl.json").read_text())
    assert summary["params"]["bco_delta"] == ledger["params"]["bco_delta"]  # explain --model reads δ back


# ---------------------------------------------------------------- SimPO's β


def test_simpo_without_beta_takes_its_paper_s_beta_and_says_so(tiny_model_dir, pair_files, tmp_path):
    cfg = load_config(PreferenceConfig, None, ["loss=simpo"])
    assert cfg.params().beta == 2.0 and load_config(PreferenceConfig, None, ["loss=dpo"]).params().beta == 0.1
    assert "β: simpo's default" in dict((q, u) for q, _, u in cfg.rows())["loss"]
    assert load_config(PreferenceConfig, None, ["loss=simpo", "beta=0.1"]).params().beta == 0.1
    out = tmp_path / "run"
    train_preference(_cfg(tiny_model_dir, pair_files, out, loss="simpo", steps=1))
    assert "beta: 2.0" in (out / "simpo_config.yaml").read_text()  # recorded as it ran


# ---------------------------------------------------------------- TRL's names


def _keys(cls) -> set[str]:
    return {o.key for o in describe(cls)}


@pytest.mark.parametrize(
    ("cls", "table", "name"),
    [(PreferenceConfig, PREFERENCE, n) for n in PREFERENCE]
    + [(SFTConfig, SFT, n) for n in SFT]
    + [(RMConfig, REWARD, n) for n in REWARD],
)
def test_each_trl_name_names_a_real_key_and_the_docs_list_it(cls, table, name):
    text = table[name]
    key = text.partition(" (")[0].partition("=")[0]
    assert text.startswith("no such key") or key in _keys(cls) or key.split(".")[0] in _keys(cls), (name, key)
    assert name not in _keys(cls)  # a name glassrl spells the same needs no hint
    assert f"`{name}`" in DOC, name


@pytest.mark.parametrize(
    ("cls", "override", "hint"),
    [
        (PreferenceConfig, "learning_rate=1e-6", "did you mean optim.lr?"),
        (PreferenceConfig, "per_device_train_batch_size=4", "did you mean micro_batch_size?"),
        (PreferenceConfig, "num_train_epochs=3", "did you mean epochs?"),
        (PreferenceConfig, "gradient_accumulation_steps=8", "did you mean micro_batch_size?"),
        (PreferenceConfig, "loss_type=sigmoid", "did you mean loss? sigmoid: dpo"),
        (SFTConfig, "num_train_epochs=3", "did you mean epochs?"),
        (RMConfig, "learning_rate=1e-5", "did you mean optim.lr?"),
    ],
)
def test_a_trl_name_on_a_supervised_command_says_the_glassrl_key(cls, override, hint):
    with pytest.raises(GlassrlError, match=re.escape(hint) + r".*docs/trl-verl\.md\); valid keys here"):
        load_config(cls, None, [override])


def test_trl_s_dpo_length_names_are_keys_now():
    """max_prompt_length was answered "did you mean max_length?"; it is a key of its own now."""
    cfg = load_config(PreferenceConfig, None, ["max_prompt_length=32", "max_completion_length=16", "max_length=60"])
    assert cfg.rule() == Rule(60, 32, 16, "keep_start")
