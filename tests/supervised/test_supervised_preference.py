"""The preference trainers (glassrl dpo: DPO family, KTO) on the tiny default-format model."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from glassrl.algos.losses import PREFERENCE_LOSSES
from glassrl.cli import main as cli_main
from glassrl.config import load_config
from glassrl.data.preferences import preference_pairs
from glassrl.errors import GlassrlError
from glassrl.models.lora import LoraConfig
from glassrl.optim import OptimConfig
from glassrl.supervised import preference
from glassrl.supervised.preference import PreferenceObjective, train_preference
from glassrl.supervised.preference_config import PreferenceConfig
from glassrl.supervised.reference import FILE, ReferenceLogprobs, sequence_logprobs

CPU = torch.device("cpu")


def _write_pairs(path, pairs):
    rows = [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpo_pairs")
    return {
        "train": _write_pairs(root / "train.jsonl", preference_pairs("train", size=24)),
        "test": _write_pairs(root / "test.jsonl", preference_pairs("test", size=10)),
    }


def _cfg(tiny_model_dir, pair_files, tmp_path, **kw) -> PreferenceConfig:
    base = dict(
        model=str(tiny_model_dir),
        data=pair_files["train"],
        eval_data=pair_files["test"],
        optim=OptimConfig(lr=3e-3, warmup_steps=0, decay="cosine"),
        steps=6,
        batch_size=4,
        log_every=1,
        eval_every=3,
        output_dir=str(tmp_path / "run"),
        device="cpu",
        threads=1,
    )
    return PreferenceConfig(**(base | kw))


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("loss", ["dpo", "ipo", "simpo", "cpo", "orpo", "bco", "kto"])
def test_each_loss_trains_and_writes_its_outputs(tiny_model_dir, pair_files, tmp_path, loss):
    extra = {"beta": 2.0} if loss == "simpo" else {}
    cfg = _cfg(tiny_model_dir, pair_files, tmp_path, loss=loss, **extra)
    result = train_preference(cfg)
    out = tmp_path / "run"
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    trl = ["rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"]
    assert all(f"train/{k}" in rows[0] for k in trl) and all(f"eval/{k}" in rows[2] for k in trl)
    assert ("train/kl" in rows[0]) == (loss == "kto") and ("eval/loss" in rows[2]) == (loss != "kto")
    assert 0 <= result["eval/rewards/accuracies"] <= 1 and result["eval_pairs"] == 10
    summary = json.loads((out / "glassrl.json").read_text())
    assert summary["kind"] == "preference" and summary["loss"] == loss
    assert summary["held_out_accuracy"] == result["eval/rewards/accuracies"]
    assert (out / f"{loss}_config.yaml").is_file() and (out / "model.safetensors").is_file()
    assert (out / FILE).is_file() == PREFERENCE_LOSSES[loss].reference  # SimPO, CPO, ORPO: no cache
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step_00000006"]


def test_the_cache_holds_the_initial_policy_s_log_probs_and_rewards_start_at_0(tiny_model_dir, pair_files, tmp_path):
    cfg = _cfg(tiny_model_dir, pair_files, tmp_path)
    obj = PreferenceObjective.build(cfg, CPU)
    pairs = [pair for _, pair in obj.train]
    fresh = sequence_logprobs(obj.model, [(p, c) for p, c, _, _ in pairs], batch_size=3, pad_id=0, dtype=torch.float32)
    for cached, again in zip(obj.reference.groups["train/chosen"], fresh):
        torch.testing.assert_close(cached, again, atol=1e-5, rtol=0)
    metrics = obj.evaluate()  # π_θ = π_ref: every implicit reward 0, up to padding's rounding
    assert abs(metrics["eval/rewards/chosen"]) < 1e-5 and abs(metrics["eval/rewards/margins"]) < 1e-5
    read = ReferenceLogprobs.load(tmp_path / "run" / FILE, "another fingerprint")
    assert read is None  # a cache of other data or another reference is never read


def test_a_resumed_run_ends_as_one_that_never_stopped(tiny_model_dir, pair_files, tmp_path, monkeypatch):
    whole = _cfg(tiny_model_dir, pair_files, tmp_path / "a", checkpoint_every=3)
    train_preference(whole)
    broken = _cfg(tiny_model_dir, pair_files, tmp_path / "b", checkpoint_every=3)
    calls = {"n": 0}
    real_loss = PreferenceObjective.loss

    def dies_at_step_5(self, examples):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt  # killed after the checkpoint of step 3 and one more step
        return real_loss(self, examples)

    monkeypatch.setattr(PreferenceObjective, "loss", dies_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        train_preference(broken)
    monkeypatch.setattr(PreferenceObjective, "loss", real_loss)
    out_b = tmp_path / "b" / "run"
    assert not (out_b / "metrics.jsonl").exists() and (out_b / "checkpoints" / "step_00000003").is_dir()
    with pytest.raises(GlassrlError, match="already holds checkpoints: resume with --resume"):
        train_preference(broken)
    train_preference(broken, resume=True)
    out_a = tmp_path / "a" / "run"
    assert _rows(out_a) == _rows(out_b)
    a, b = load_file(out_a / "model.safetensors"), load_file(out_b / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_lora_trains_the_adapters_only(tiny_model_dir, pair_files, tmp_path):
    cfg = _cfg(tiny_model_dir, pair_files, tmp_path, lora=LoraConfig(r=4, alpha=8.0))
    obj = PreferenceObjective.build(cfg, CPU)
    trainable = [n for n, p in obj.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    train_preference(cfg)
    assert (tmp_path / "run" / "adapter_config.json").is_file()


def test_bf16_autocast_runs_on_cpu(tiny_model_dir, pair_files, tmp_path):
    result = train_preference(_cfg(tiny_model_dir, pair_files, tmp_path, compute_dtype="bfloat16", steps=2))
    assert torch.isfinite(torch.tensor(result["train/loss"]))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["loss=sppo"], "loss = 'sppo': unknown; valid: dpo, ipo, simpo, cpo, orpo, bco, kto"),
        (["loss=ipo", "rpo_alpha=1"], "rpo_alpha = 1.0: ignored by loss ipo"),
        (["loss=cpo", "reference=/tmp"], "reference = '/tmp': ignored: cpo is reference-free"),
        (["epochs=2", "steps=10"], "steps = 10: ignored: epochs = 2.0 sets the steps; remove one"),
        (["batch_size=32", "micro_batch_size=5"], "micro_batch_size = 5: does not divide batch_size = 32"),
        (["max_prompt_length=64"], "max_prompt_length = 64: must be < max_length = 64"),
        (["max_completion_length=0"], "max_completion_length = 0: must be >= 1"),
        (["loss=ipo", "label_smoothing=0.1"], "label_smoothing = 0.1: ignored by loss ipo"),
        (["loss=simpo", "reference=/tmp"], "reference = '/tmp': ignored: simpo is reference-free"),
        (["beta=0"], "beta = 0.0: must be > 0"),
        (["data=pairs.jsonl"], "eval_data = None: needed when data is a file"),
    ],
)
def test_config_errors_name_the_key(overrides, message):
    with pytest.raises(GlassrlError, match=message.replace("(", r"\(")):
        load_config(PreferenceConfig, None, overrides)


def test_cli_dpo_with_the_preset(tiny_model_dir, pair_files, tmp_path, capsys):
    out = tmp_path / "cli"
    args = [f"model={tiny_model_dir}", f"data={pair_files['train']}", f"eval_data={pair_files['test']}"]
    args += ["steps=2", "batch_size=4", f"output_dir={out}", "device=cpu", "threads=1"]
    assert cli_main(["dpo", "dpo", *args]) == 0
    assert "held-out preference accuracy:" in capsys.readouterr().out
    assert cli_main(["dpo", "dpo", *args]) == 2  # a fresh run into a run with checkpoints
    assert "already holds checkpoints" in capsys.readouterr().err
    assert cli_main(["dpo", "dpo", *args, "steps=3", "--resume"]) == 0
    assert [r["step"] for r in _rows(out)] == [2, 3]  # log_every 10: the last step of each session


def test_kto_pairs_each_example_with_another_s_response(tiny_model_dir, pair_files, tmp_path):
    obj = PreferenceObjective.build(_cfg(tiny_model_dir, pair_files, tmp_path, loss="kto"), CPU)
    examples = [e for _, e in obj.train]
    assert len(examples) == 48 and sum(e.desirable for e in examples) == 24
    responses = [e.response for e in examples]
    partners = [e.partner for e in examples]
    assert sorted(map(tuple, partners)) == sorted(map(tuple, responses))  # a permutation of the responses
    assert all(e.partner is not e.response for e in examples)  # never its own response
    assert preference.UNPAIRED_LOSSES["kto"].reference
