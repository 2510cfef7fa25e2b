"""The preference ledger: per-token implicit rewards whose sums are the loss's rewards."""

from __future__ import annotations

import json
import math

import pytest
import torch

from glassrl.algos.losses import PreferenceLossParams
from glassrl.commands.explain_preference import explain_pair, is_preference_run
from glassrl.data.preferences import preference_pairs
from glassrl.ledger.implicit_rewards import SideNumbers, pair_ledger
from glassrl.ledger.preference import PreferenceLedger
from glassrl.optim import OptimConfig
from glassrl.supervised.preference import LEDGER_FILE, PreferenceObjective, train_preference
from glassrl.supervised.preference_config import PreferenceConfig
from helpers import write_pairs


def hand_pair(ref=True):
    chosen = SideNumbers(
        "是的", [5, 6], ["是", "的"], torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.5]) if ref else None
    )
    rejected = SideNumbers("不", [7], ["不"], torch.tensor([-3.0]), torch.tensor([-2.0]) if ref else None)
    return chosen, rejected


@pytest.mark.parametrize(
    ("loss", "params", "term"),
    [
        ("dpo", PreferenceLossParams(beta=0.1, rpo_alpha=1.0), math.log1p(math.exp(-0.2))),  # RPO
        ("cpo", PreferenceLossParams(beta=0.1, cpo_alpha=1.0), math.log(2)),
        ("orpo", PreferenceLossParams(beta=0.1), 0.1 * math.log1p(math.exp(-1.7014132779827524))),
    ],
)
def test_a_ledger_with_an_nll_term_shows_each_token_s_share(loss, params, term):
    """ν_i = −α·log π_θ(a_i)/|y_w| on the chosen tokens: (0.5, 1.0); the pair's loss is the
    preference term plus Σ ν_i = 1.5, and the text shows both."""
    ledger = pair_ledger("p", *hand_pair(ref=loss == "dpo"), loss=loss, params=params)
    assert [t.nll for t in ledger.chosen.tokens] == pytest.approx([0.5, 1.0])
    assert all(t.nll is None for t in ledger.rejected.tokens)
    assert ledger.pair_loss == pytest.approx(term + 1.5)
    for lang, words in (
        ("en", "Plus the NLL term on the chosen response Σ_i ν_i = 1.5000"),
        ("zh", "NLL 项 Σ_i ν_i = 1.5000"),
    ):
        text = "\n".join(ledger.lines(lang))
        assert words in text and f"{term + 1.5:.4f}" in text and f"{term:.4f}" in text and "ν_i" in text
    assert PreferenceLedger.from_dict(json.loads(json.dumps(ledger.to_dict()))) == ledger


def test_a_ledger_by_hand_in_both_languages():
    ledger = pair_ledger("p", *hand_pair(), loss="dpo", params=PreferenceLossParams(beta=0.1))
    assert [t.reward for t in ledger.chosen.tokens] == pytest.approx([0.05, 0.05])
    assert ledger.chosen.reward == pytest.approx(0.1) and ledger.rejected.reward == pytest.approx(-0.1)
    assert ledger.margin == pytest.approx(0.2)
    assert ledger.pair_loss == pytest.approx(math.log1p(math.exp(-0.2)))
    assert ledger.params == {"beta": 0.1, "label_smoothing": 0.0, "rpo_alpha": 0.0}
    assert all(t.nll is None for t in ledger.chosen.tokens) and "ν_i" not in "\n".join(ledger.lines())
    en, zh = "\n".join(ledger.lines("en")), "\n".join(ledger.lines("zh"))
    assert "the pair is ordered right" in en and "0.5981" in en and "ρ_i = β·(log π_θ(a_i|s_i)" in en
    assert "这对回答排序正确" in zh and "优选回答" in zh and "0.5981" in zh
    assert PreferenceLedger.from_dict(json.loads(json.dumps(ledger.to_dict()))) == ledger
    simpo = pair_ledger("p", *hand_pair(ref=False), loss="simpo", params=PreferenceLossParams(beta=2.0))
    assert simpo.chosen.reward == pytest.approx(-3.0) and simpo.chosen.ref_logprob is None  # 2·mean(−1, −2)
    assert "reference-free" in "\n".join(simpo.lines())
    kto = pair_ledger("p", *hand_pair(), loss="kto", params=PreferenceLossParams(beta=0.1))
    assert kto.pair_loss is None and "z₀" in "\n".join(kto.lines())


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("pref_ledger")
    files = {split: write_pairs(root / f"{split}.jsonl", split, size) for split, size in (("train", 16), ("test", 6))}
    cfg = PreferenceConfig(
        model=str(tiny_model_dir),
        data=str(files["train"]),
        eval_data=str(files["test"]),
        optim=OptimConfig(lr=1e-2, warmup_steps=0, decay="constant"),
        steps=4,
        batch_size=4,
        output_dir=str(root / "run"),
        device="cpu",
        threads=1,
    )
    train_preference(cfg)
    return cfg, root / "run"


def test_the_ledger_s_sums_are_the_rewards_of_the_trainer_s_loss(trained, tiny_model_dir):
    cfg, run = trained
    assert is_preference_run(run) and not is_preference_run(tiny_model_dir)
    # the trained policy against the run's reference, through the trainer's own objective
    again = PreferenceConfig(**{**cfg.__dict__, "model": str(run), "reference": str(tiny_model_dir)})
    obj = PreferenceObjective.build(again, torch.device("cpu"))
    for index in range(3):
        loss, r_c, r_r, _ = obj._pairs([obj.evals[index]], [index], "eval", grad=False)
        pair = obj.eval_pairs[index]
        ledger = explain_pair(run, pair.prompt, pair.chosen, pair.rejected)
        for side, trainer in ((ledger.chosen, r_c), (ledger.rejected, r_r)):
            assert sum(t.reward for t in side.tokens) == pytest.approx(side.reward, abs=1e-6)
            assert side.reward == pytest.approx(trainer.sequence.item(), abs=1e-5)
            assert [t.reward for t in side.tokens] == pytest.approx(
                trainer.tokens[0, : len(side.tokens)].tolist(), abs=1e-5
            )
        assert ledger.pair_loss == pytest.approx(loss.item(), abs=1e-5)
        assert ledger.margin != 0  # trained: the policy has moved away from π_ref


def test_the_run_writes_the_ledgers_of_its_first_held_out_pairs(trained):
    _, run = trained
    lines = (run / "ledgers" / LEDGER_FILE).read_text(encoding="utf-8").splitlines()
    ledgers = [PreferenceLedger.from_dict(json.loads(line)) for line in lines]
    assert len(ledgers) == 4
    first = ledgers[0]
    again = explain_pair(run, first.prompt, first.chosen.response, first.rejected.response)
    assert first.chosen.reward == pytest.approx(again.chosen.reward, abs=1e-5)
    assert [t.token_id for t in first.rejected.tokens] == [t.token_id for t in again.rejected.tokens]
    assert first.rejected.tokens[-1].token.strip()  # EOS ends each response, shown by its text


def test_the_report_shows_the_preference_ledgers(trained, tmp_path):
    from glassrl.report.html import write_run_report

    _, run = trained
    page = (run / "report.html").read_text(encoding="utf-8")  # written by glassrl dpo at the end
    assert "<b>run</b> · pair 0" in page  # the run's name, not its staging directory's
    assert 'id="preference"' in page and 'id="pair-0-0"' in page and "ρ_i = β·(log π_θ" in page
    zh = write_run_report([run], tmp_path / "zh.html", lang="zh").read_text(encoding="utf-8")
    assert "优选回答" in zh and "这对回答排序" in zh


def test_glassrl_explain_prints_the_ledger_of_a_pair_whose_sums_are_the_loss_s(trained, capsys):
    from glassrl.cli import main

    _, run = trained
    pair = preference_pairs("test", size=1)[0]
    argv = ["explain", "--model", str(run), "--prompt", pair.prompt, "--chosen", pair.chosen]
    assert main([*argv, "--rejected", pair.rejected, "--format", "jsonl"]) == 0
    shown = PreferenceLedger.from_dict(json.loads(capsys.readouterr().out))
    again = explain_pair(run, pair.prompt, pair.chosen, pair.rejected)
    assert shown == PreferenceLedger.from_dict(json.loads(json.dumps(again.to_dict())))
    for side in (shown.chosen, shown.rejected):
        assert sum(t.reward for t in side.tokens) == pytest.approx(side.reward, abs=1e-6)
    assert main([*argv, "--rejected", pair.rejected, "--lang", "zh"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"preference run {run} · loss dpo") and "优选回答" in text


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--response", "x"], "--response: not for a preference run"),
        (["--beta", "0.5"], "--beta: not for a preference run"),
        (["--format", "csv"], "--format csv: not for a preference pair"),
        (["--html", "x.html"], "--html: not for a preference pair"),
    ],
)
def test_explain_of_a_preference_run_names_a_flag_that_does_not_fit(trained, extra, message, capsys):
    from glassrl.cli import main

    _, run = trained
    argv = ["explain", "--model", str(run), "--prompt", "p", "--chosen", "a", "--rejected", "b", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_chosen_and_rejected_need_a_preference_run(trained, tiny_model_dir, capsys):
    from glassrl.cli import main

    _, run = trained
    assert main(["explain", "--prompt", "p", "--chosen", "a", "--rejected", "b"]) == 2
    assert "--chosen: needs --model" in capsys.readouterr().err
    assert main(["explain", "--model", str(tiny_model_dir), "--prompt", "p", "--rejected", "b"]) == 2
    assert "is not a run of glassrl dpo" in capsys.readouterr().err
    assert main(["explain", "--model", str(run), "--prompt", "p", "--chosen", "a"]) == 2
    assert "--rejected: missing" in capsys.readouterr().err


@pytest.mark.parametrize("loss", ["dpo", "ipo", "simpo", "cpo", "orpo", "bco"])
def test_every_pair_loss_has_its_loss_line_in_both_languages(loss):
    from glassrl.algos.losses import PREFERENCE_LOSSES

    reference = PREFERENCE_LOSSES[loss].reference
    ledger = pair_ledger(
        "p", *hand_pair(ref=reference), loss=loss, params=PreferenceLossParams(beta=0.1, bco_delta=0.05)
    )
    for lang in ("en", "zh"):
        assert f"{ledger.pair_loss - sum(t.nll or 0.0 for t in ledger.chosen.tokens):.4f}" in "\n".join(
            ledger.lines(lang)
        )
