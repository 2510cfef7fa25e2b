"""`glassrl demo --pipeline rlhf` (glassrl.commands.pipeline) on the tiny model: SFT policy →
reward model → PPO with four models; every stage's output loads back and PPO reads the trained
reward model."""

from __future__ import annotations

import json

import pytest
import yaml

from glassrl.cli import main
from helpers import tiny_run_overrides, write_pairs


@pytest.fixture(scope="module")
def pipeline(tiny_model_dir, prompt_files, tmp_path_factory):
    from rich.console import Console

    from glassrl.commands.pipeline import run_rlhf

    out = tmp_path_factory.mktemp("pipeline")
    ppo = [
        o for o in tiny_run_overrides(tiny_model_dir, prompt_files, out) if not o.startswith(("output_dir", "model."))
    ]
    console = Console(record=True, width=200)
    result = run_rlhf(
        out,
        actor=str(tiny_model_dir),
        rm_overrides=["steps=4", "batch_size=8", "log_every=2", "eval_every=0"],
        ppo_overrides=[*ppo, "logging.eval_every=0"],
        console=console,
        progress=False,
    )
    return out, result, console.export_text()


@pytest.mark.slow
def test_every_stage_loads_back_and_ppo_reads_the_trained_reward_model(pipeline, tiny_model_dir):
    from glassrl.models import load_causal_lm, load_scalar_model
    from glassrl.run.checkpoint import CheckpointManager, read_manifest

    out, result, _ = pipeline
    assert result.sft == tiny_model_dir and result.rm == out / "rm" and result.ppo == out / "ppo"
    rm = load_scalar_model(result.rm, head="token-classification", dtype="float32", device="cpu")
    assert json.loads((result.rm / "glassrl.json").read_text())["kind"] == "reward-model"
    config = yaml.safe_load((result.ppo / "config.yaml").read_text())
    assert config["model"]["actor"] == str(tiny_model_dir)
    assert config["model"]["critic"] == "reward_model"
    assert config["reward"]["sources"][0]["path"] == str(result.rm)  # PPO's reward: the stage-2 model
    checkpoint = CheckpointManager(result.ppo / "checkpoints", keep=1).latest()
    parts = CheckpointManager(checkpoint.parent, keep=1).load(checkpoint, set(read_manifest(checkpoint)["parts"]))
    load_causal_lm(parts["actor"], dtype="float32", device="cpu")
    critic = load_scalar_model(parts["critic"], head="token-classification", dtype="float32", device="cpu")
    assert critic.state_dict().keys() == rm.state_dict().keys()  # the critic is a reward-model-shaped scalar model


@pytest.mark.slow
def test_gold_and_proxy_are_logged_and_printed(pipeline):
    from glassrl.report.metrics_doc import undocumented

    out, result, text = pipeline
    rows = [json.loads(line) for line in (result.ppo / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["step"] > 0]
    assert trained and all({"reward/gold", "reward/proxy", "kl/sequence"} <= set(r) for r in trained)
    assert undocumented({k for r in rows for k in r if k != "step"}) == []
    assert result.sft_accuracy == rows[0]["eval/accuracy"]  # the SFT policy, before the first step
    assert set(result.metrics) >= {"held-out gold", "sampled gold", "sampled proxy", "KL"}
    assert 'id="chart-gold-proxy"' in (result.ppo / "report.html").read_text()
    for figure in ("held-out pairwise accuracy", "held-out accuracy", "sampled proxy", str(result.ppo / "report.html")):
        assert figure in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["demo", "--pipeline", "dpo"], "--pipeline: unknown 'dpo'; valid: rlhf"),
        (["demo", "--pipeline", "rlhf", "--resume"], "--resume: the pipeline runs its three stages afresh"),
    ],
)
def test_demo_pipeline_argument_errors(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_the_offline_leg_trains_dpo_from_the_sft_policy_and_prints_before_and_after(tiny_model_dir, tmp_path):
    """``glassrl demo --pipeline rlhf --offline``'s leg (run_dpo) on the tiny model and a few pairs."""
    from rich.console import Console

    from glassrl.commands.pipeline import run_dpo

    files = {
        split: write_pairs(tmp_path / f"{split}.jsonl", split, size) for split, size in (("train", 16), ("test", 8))
    }
    overrides = [f"data={files['train']}", f"eval_data={files['test']}", "steps=3", "batch_size=4", "device=cpu"]
    console = Console(record=True, width=200)
    result = run_dpo(tmp_path / "out", actor=str(tiny_model_dir), dpo_overrides=overrides, console=console)
    assert result.dpo == tmp_path / "out" / "dpo" and (result.dpo / "model.safetensors").is_file()
    assert result.before["kl"] == 0.0 and result.after["kl"] != 0.0  # the SFT policy is the reference
    assert result.metrics["eval_pairs"] == 8
    assert set(result.after) == {"gold", "gold/en", "gold/zh", "kl"}  # the gold also by the prompts' language
    text = console.export_text()
    assert "DPO before → after" in text and "held-out preference accuracy (8 pairs)" in text
    assert "on the English prompts" in text and "on the Chinese prompts" in text
