"""`glassrl explain --mismatch RUN [--step N]` on a real run of the tiny model (3 steps, a checkpoint
after each, log μ kept with ``rollout.sampling_logprobs``): the step's gap is measured from the
ledger and split so that the table sums to it; a ledger whose tokens were sampled by older weights
(log μ of step 1's policy written in, as an asynchronous run would have it) puts staleness first;
bad input is one line naming the flag."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from glassrl import cli
from run_helpers import logged_metrics

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tiny_model_dir, prompt_files, tmp_path_factory) -> Path:
    from glassrl.config import load_config
    from glassrl.rl.config import TrainConfig
    from glassrl.rl.loop import Trainer
    from helpers import tiny_run_overrides

    out = tmp_path_factory.mktemp("mismatch") / "run"
    overrides = [
        *tiny_run_overrides(tiny_model_dir, prompt_files, out),
        "steps=3",
        "logging.checkpoint_every=1",
        "logging.keep_checkpoints=5",
        "logging.ledger_samples=16",  # the whole batch: the sampler's decoding is replayed exactly
        "logging.report=false",
        "rollout.sampling_logprobs=true",
        "actor_optim.lr=0.01",
        "actor_optim.warmup_steps=0",
    ]
    Trainer(load_config(TrainConfig, ROOT / "examples" / "grpo.yaml", overrides), progress=False).train()
    return out


def table(capsys, *argv: str) -> dict[str, float]:
    """{row name: part} of the attribution (``--format jsonl``), "G" the measured gap, "sum" the rows' sum."""
    assert cli.main(["explain", "--mismatch", *argv, "--format", "jsonl"]) == 0
    found = json.loads(capsys.readouterr().out)
    rows = {p["factor"]: (float("nan") if p["share"] is None else p["share"]) for p in found["parts"]}
    rows |= {"G": found["gap"], "not reproduced": found["not_reproduced"]}
    rows["trainer not reproduced"] = found["trainer_not_reproduced"]
    rows["sum = G"] = found["explained"] + found["not_reproduced"] + found["trainer_not_reproduced"]
    return rows


def test_metrics_carry_the_gap_distribution(run):
    for row in logged_metrics(run)[1:]:
        assert 0 <= row["rollout/logprob_diff_mean"] <= row["rollout/logprob_diff_p99"]
        assert row["rollout/logprob_diff_p99"] <= row["rollout/logprob_diff_max"] < 1e-4


def test_a_synchronous_run_is_reproduced_and_sums(run, capsys):
    rows = table(capsys, str(run), "--step", "3")
    assert rows["sum = G"] == pytest.approx(rows["G"], rel=1e-3, abs=1e-12)
    # float32 on one CPU: the gap itself is rounding (G ~ 2e-7 nats/token); the sampler's decoding and the
    # trainer's pass are replayed to the same rounding (the ledger's numbers are float32: 1e-7 apart at most)
    assert rows["G"] < 1e-5
    assert rows["not reproduced"] <= max(0.05 * rows["G"], 1e-7) and abs(rows["trainer not reproduced"]) <= 1e-7
    assert rows["staleness"] == 0.0 and rows["precision"] == 0.0  # the same weights and arithmetic
    default = table(capsys, str(run))  # the latest step it can explain: 3
    assert default["G"] == rows["G"]
    assert cli.main(["explain", "--mismatch", str(run)]) == 0
    text = capsys.readouterr().out
    for row in (
        "precision",
        "batch",
        "staleness",
        "rerender",
        "engine",
        "not reproduced",
        "sum = G",
        "tokens carrying",
    ):
        assert f"\n{row}" in text, row
    out = run.parent / "mismatch.txt"
    assert cli.main(["explain", "--mismatch", str(run), "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == text and capsys.readouterr().out == ""


def stale_copy(run: Path, out: Path, policy) -> Path:
    """A copy of ``run`` whose step 3 ledger holds, on every generated token, log μ of ``policy``
    (version 1) as the sampler computes it (batch decoding), as if version 1 had sampled it."""
    import shutil

    import yaml

    from glassrl.diagnose.mismatch import Recompute, Sample, Side, recompute_logprobs
    from glassrl.models import load_tokenizer

    shutil.copytree(run, out)
    path = out / "ledgers" / "step_000003.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    tokenizer = load_tokenizer(yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))["model"]["actor"])
    heads = [r for r in rows if r["kind"] == "response"]
    samples = []
    for h in heads:
        ids = tuple(r["token_id"] for r in rows if r["kind"] == "token" and r["response_index"] == h["response_index"])
        prompt = tuple(tokenizer.encode(h["prompt_as_seen"], add_special_tokens=False))
        samples.append(Sample(prompt, ids, (True,) * len(ids), (), ()))
    rc = Recompute(weights=lambda v: policy, micro_batch=4, pad_id=0)
    mu = recompute_logprobs(samples, Side(layout="decode", version=1), rc).tolist()
    k = 0
    for r in rows:
        if r["kind"] == "token":
            if r["response_mask"]:
                r["rollout_logprobs"], r["policy_version"], r["staleness"] = mu[k], 1, 1
            k += 1
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return out


def test_stale_samples_put_staleness_first(run, tmp_path, capsys):
    """Step 3's ledger rewritten as if step 1's policy (version 1) had sampled it: log μ of version 1,
    as the sampler computes it, on every generated token."""
    import shutil

    import torch

    from glassrl.models import load_causal_lm
    from glassrl.run.open import open_checkpoint

    actor = open_checkpoint(run / "checkpoints" / "step_00000001").actor
    stale = stale_copy(run, tmp_path / "stale", load_causal_lm(actor, dtype="float32", device="cpu"))
    parts = table(capsys, str(stale), "--step", "3")
    named = {f: parts[f] for f in ("precision", "batch", "staleness", "rerender")}
    assert max(named, key=named.get) == "staleness"
    assert abs(sum(named.values()) - parts["G"]) <= 0.05 * parts["G"]
    assert torch.isfinite(torch.tensor(list(named.values()))).all()

    # version 1's checkpoint gone: staleness cannot be recomputed, says so, and its part stays unexplained
    shutil.rmtree(stale / "checkpoints" / "step_00000001")
    assert cli.main(["explain", "--mismatch", str(stale), "--step", "3", "--format", "jsonl"]) == 0
    found = json.loads(capsys.readouterr().out)
    row = next(p for p in found["parts"] if p["factor"] == "staleness")
    assert row["share"] is None and row["note"].startswith("no checkpoint of version 1")
    assert found["not_reproduced"] >= 0.95 * found["gap"]


def error(capsys, *argv: str) -> str:
    assert cli.main(["explain", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.removeprefix("glassrl explain: error: ").strip()


def test_errors_name_the_flag(run, tmp_path, capsys):
    assert error(capsys, "--step", "2").startswith("--step: only with --mismatch")
    assert "not a run directory" in error(capsys, "--mismatch", str(tmp_path))
    assert error(capsys, "--mismatch", str(run), "--step", "x") == "--step: expected a step number, got 'x'"
    assert "no ledger of that step" in error(capsys, "--mismatch", str(run), "--step", "9")
    assert error(capsys, "--mismatch", str(run), "--top", "-1") == "--top: expected a number of tokens >= 0, got -1"
    assert error(capsys, "--mismatch", str(run), "--ledger", "x").startswith("--mismatch explains a run's step")
    assert error(capsys, "--mismatch", str(run), "--format", "csv").startswith("--format csv: --mismatch prints")
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(run, cut)
    shutil.rmtree(cut / "checkpoints" / "step_00000002")
    message = error(capsys, "--mismatch", str(cut), "--step", "3")
    assert "the policy after step 2" in message and "checkpoints: 0, 1, 3" in message


def test_explain_ledger_stays_free_of_torch(run):
    """--mismatch imports torch when asked; --ledger, beside it in the same command, never does."""
    import subprocess
    import sys

    code = (
        "import contextlib, io, sys\n"
        "from glassrl import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert cli.main(['explain', '--ledger', {str(run / 'ledgers' / 'step_000003.jsonl')!r}]) == 0\n"
        "print('torch' in sys.modules, 'glassrl.diagnose.mismatch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_report_shows_the_gap_per_ledger_step(run, tmp_path):
    """The report's "Sampler/trainer gap" section: a row per ledger step with log μ, its max |Δ| the
    ledger's own (a run without log μ has no such section)."""
    from glassrl.ledger import read_jsonl
    from glassrl.report.html import write_run_report

    page = write_run_report([run], tmp_path / "report.html").read_text(encoding="utf-8")
    section = page[page.index('<section id="mismatch">') : page.index("</section>", page.index('id="mismatch"'))]
    for step in (1, 2, 3):
        ledger = read_jsonl(run / "ledgers" / f"step_{step:06d}.jsonl")
        gaps = [abs(t.rollout_logprobs - t.logprobs) for r in ledger.responses for t in r.tokens if t.response_mask]
        assert f"<td>{step}</td><td>{len(gaps)}</td>" in section
        assert f"<td>{max(gaps):.3g}</td></tr>" in section
    import shutil

    plain = tmp_path / "plain"  # the same run, its ledgers without log μ
    shutil.copytree(run, plain, ignore=shutil.ignore_patterns("checkpoints"))
    for path in (plain / "ledgers").iterdir():
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        rows = [{k: v for k, v in r.items() if k != "rollout_logprobs"} for r in rows]
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert 'id="mismatch"' not in write_run_report([plain], tmp_path / "plain.html").read_text(encoding="utf-8")


def test_a_vllm_run_without_vllm_names_why_the_engine_is_absent(run, tmp_path, capsys):
    """The run's config saying rollout.engine: vllm, where vllm is not installed (the main suite's
    environment): the engine's part stays in 'not reproduced', the row says why."""
    import shutil

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here: tests/diagnose/test_diagnose_mismatch_vllm.py recomputes the engine")
    import yaml

    other = tmp_path / "vllm-run"
    shutil.copytree(run, other)
    config = yaml.safe_load((other / "config.yaml").read_text(encoding="utf-8"))
    config["rollout"]["engine"] = "vllm"
    (other / "config.yaml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    assert cli.main(["explain", "--mismatch", str(other), "--step", "3", "--format", "jsonl"]) == 0
    found = json.loads(capsys.readouterr().out)
    row = next(p for p in found["parts"] if p["factor"] == "engine")
    assert row["share"] is None and row["sampler"] == "vllm" and row["note"].startswith("vllm is not installed")
    assert found["explained"] + found["not_reproduced"] + found["trainer_not_reproduced"] == pytest.approx(found["gap"])


def test_a_bfloat16_weights_run_is_reproduced(tiny_model_dir, prompt_files, tmp_path, capsys):
    """model.dtype=bfloat16: the trainer computes in bfloat16 weights loaded as such (a float32 model
    cast with .to differs: its rotary buffers are cast too, 1.3e-3 nats/token apart on this model)."""
    from glassrl.config import load_config
    from glassrl.rl.config import TrainConfig
    from glassrl.rl.loop import Trainer
    from helpers import tiny_run_overrides

    out = tmp_path / "bf16"
    overrides = [
        *tiny_run_overrides(tiny_model_dir, prompt_files, out),
        "model.dtype=bfloat16",
        "logging.checkpoint_every=1",
        "logging.ledger_samples=16",
        "logging.report=false",
        "rollout.sampling_logprobs=true",
    ]
    Trainer(load_config(TrainConfig, ROOT / "examples" / "grpo.yaml", overrides), progress=False).train()
    capsys.readouterr()
    rows = table(capsys, str(out), "--step", "2")
    assert rows["trainer not reproduced"] == 0.0 and rows["not reproduced"] <= 0.05 * rows["G"]
    assert rows["precision"] == 0.0  # bfloat16 on both sides


def test_a_lora_run_is_reproduced_with_its_adapters(tiny_model_dir, prompt_files, tmp_path, capsys):
    """model.lora: each checkpoint holds the adapters alone; π_old of step N is the base with step
    N − 1's adapters, unmerged, as the trainer computed it (step 1: the base, B = 0), reproduced at
    every step (the base alone is far from it: the adapters moved); and a ledger sampled by version
    1's adapters puts staleness first, its parts summing to the gap."""
    pytest.importorskip("peft")
    import torch

    from glassrl.config import load_config
    from glassrl.diagnose.mismatch import Recompute, Side, recompute_logprobs
    from glassrl.models import load_causal_lm, load_tokenizer
    from glassrl.models.lora import LoraSettings, load_lora_model
    from glassrl.rl.config import TrainConfig
    from glassrl.rl.loop import Trainer
    from glassrl.run.open import open_checkpoint
    from helpers import tiny_run_overrides

    out = tmp_path / "lora"
    overrides = [
        *tiny_run_overrides(tiny_model_dir, prompt_files, out),
        "steps=3",
        "model.lora.r=4",
        "model.lora.alpha=8",
        "logging.checkpoint_every=1",
        "logging.keep_checkpoints=5",
        "logging.ledger_samples=16",
        "logging.report=false",
        "rollout.sampling_logprobs=true",
        "actor_optim.lr=0.05",
        "actor_optim.warmup_steps=0",
    ]
    Trainer(load_config(TrainConfig, ROOT / "examples" / "grpo.yaml", overrides), progress=False).train()
    capsys.readouterr()
    for step in (1, 2, 3):  # step 1: the base (B = 0); steps 2 and 3: checkpoint 1's and 2's adapters
        rows = table(capsys, str(out), "--step", str(step))
        assert rows["sum = G"] == pytest.approx(rows["G"], rel=1e-3, abs=1e-12)
        assert rows["G"] < 1e-5 and abs(rows["trainer not reproduced"]) <= 1e-7, (step, rows)
        assert rows["not reproduced"] <= max(0.05 * rows["G"], 2e-7), (step, rows)  # 2e-7: float32 numbers

    # the adapters carry the policy: the base alone is far from π_old, the base with them equal to it
    from glassrl.commands.explain_mismatch import _samples
    from glassrl.ledger import read_jsonl

    path = out / "ledgers" / "step_000003.jsonl"
    tokenizer = load_tokenizer(tiny_model_dir)
    samples = _samples(read_jsonl(path), tokenizer, path)
    pi_old = torch.tensor([t for s in samples for t, m in zip(s.trainer, s.mask) if m])
    adapters = open_checkpoint(out / "checkpoints" / "step_00000002").actor
    policies = {
        "base": load_causal_lm(tiny_model_dir, dtype="float32", device="cpu"),
        "adapters": load_lora_model(adapters, LoraSettings(r=4, alpha=8), lambda p: load_causal_lm(p, device="cpu")),
    }
    gaps = {}
    for name, model in policies.items():
        rc = Recompute(weights=lambda v, m=model.eval(): m, micro_batch=4, pad_id=tokenizer.pad_token_id or 0)
        gaps[name] = float((recompute_logprobs(samples, Side(layout="padded", version=2), rc) - pi_old).abs().max())
    assert gaps["adapters"] < 1e-5 and gaps["base"] > 1e-3, gaps

    # a ledger sampled by version 1's adapters: staleness first, each version's adapters recomputed
    older = open_checkpoint(out / "checkpoints" / "step_00000001").actor
    policy = load_lora_model(older, LoraSettings(r=4, alpha=8), lambda p: load_causal_lm(p, device="cpu")).eval()
    parts = table(capsys, str(stale_copy(out, tmp_path / "stale", policy)), "--step", "3")
    named = {f: parts[f] for f in ("precision", "batch", "staleness", "rerender")}
    assert max(named, key=named.get) == "staleness" and parts["G"] > 1e-4, parts
    assert abs(sum(named.values()) - parts["G"]) <= 0.05 * parts["G"]
