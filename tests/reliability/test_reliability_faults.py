"""The fault catalogue: every input a user can get wrong, and every fault of the machine a run can
meet, ends in one GlassrlError line and exit code 2, and leaves nothing half-written behind.

Each case runs ``glassrl`` as a user would (glassrl.cli.main in this process) or drives the
trainer where the fault is injected from inside (a write that fails with ENOSPC).
"""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path

import pytest
import torch
import transformers
from harness import assert_one_error_line, checkpoint_contents, run_cli, strict_jsonl

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.optim import OptimConfig
from glassrl.rl.config import TrainConfig
from glassrl.run.checkpoint import read_manifest
from glassrl.supervised.rm import RMConfig, train_rm
from glassrl.supervised.sft import SFTConfig, train_sft
from helpers import tiny_run_overrides

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
REWARD_FNS = Path(__file__).resolve().parents[1] / "rl" / "trainer_reward_fns.py"
DATA = Path(__file__).resolve().parent / "data"
PAIRS, PREFS = DATA / "sft_pairs.jsonl", DATA / "preferences.jsonl"  # 8 short examples each
LATIN1 = "réponse".encode("latin-1")  # b"r\xe9ponse": not UTF-8
EXPLAIN = ["explain", "--tokens", "a", "b", "c", "--values", "0.1", "0.2", "0.3"]


def _write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


# ---------------------------------------------------------------- inputs: one line, exit 2, before any model loads

# id -> (argv after building files in tmp, regex of the error line). "{tmp}" is replaced.
INPUT_FAULTS = {
    "config-not-utf8": (["train", "{tmp}/latin.yaml"], r"latin\.yaml:2: not UTF-8 text \(byte 0xe9 at column 4\)"),
    "config-duplicate-key": (["train", "{tmp}/dup.yaml"], r"dup\.yaml: not valid YAML: line 4.*duplicate key 'lam'"),
    "override-not-yaml": (["train", "grpo", "steps=[1,"], r"steps: '\[1,' is not a YAML value"),
    "override-duplicate-key": (["train", "grpo", "algo={clip_low: 1, clip_low: 2}"], r"duplicate key 'clip_low'"),
    "lr-inf": (["train", "grpo", "actor_optim.lr=.inf"], r"actor_optim\.lr = inf: must be a finite number"),
    "weight-decay-nan": (["train", "grpo", "actor_optim.weight_decay=.nan"], r"weight_decay = nan: must be a finite"),
    "kl-coef-overflow": (["train", "grpo", "algo.kl.coef=1e400"], r"algo\.kl\.coef = inf: must be a finite"),
    "int-beyond-float": (["train", "grpo", "algo.gamma=" + "9" * 400], r"algo\.gamma = 9+: must be a finite"),
    "sft-lr-nan": (["sft", "sft", "optim.lr=nan"], r"optim\.lr = nan: must be a finite number"),
    "rm-batch-size-0": (["rm", "rm", "batch_size=0"], r"batch_size = 0: must be >= 1"),
    "rm-lr-inf": (["rm", "rm", "optim.lr=-.inf"], r"optim\.lr = -inf: must be a finite number"),
    "explain-score-nan": ([*EXPLAIN, "--score", "nan"], r"--score: expected a finite number, got 'nan'"),
    "explain-score-inf": ([*EXPLAIN, "--score", "inf"], r"--score: expected a finite number, got 'inf'"),
    "explain-value-overflow": (
        ["explain", "--tokens", "a", "--values", "1e999", "--score", "1"],
        r"--values\[0\]: expected a finite number",
    ),
    "explain-kl-nan": ([*EXPLAIN, "--score", "1", "--kl", "0", "nan", "0"], r"--kl\[1\]: expected a finite number"),
    "explain-input-nan": (["explain", "--input", "{tmp}/nan.json"], r"score: expected a finite number, got nan"),
    "explain-input-not-utf8": (["explain", "--input", "{tmp}/latin.yaml"], r"latin\.yaml:2: not UTF-8 text"),
    "explain-input-duplicate-key": (["explain", "--input", "{tmp}/dup.yaml"], r"duplicate key 'lam'"),
    "explain-out-directory": ([*EXPLAIN, "--score", "1", "--out", "{tmp}"], r"--out .*: is a directory"),
    "explain-csv-out-directory": (
        [*EXPLAIN, "--score", "1", "--format", "csv", "--out", "{tmp}"],
        r"--out .*: is a directory",
    ),
    "explain-html-directory": ([*EXPLAIN, "--score", "1", "--html", "{tmp}"], r"--html .*: is a directory"),
    "explain-out-missing-dir": ([*EXPLAIN, "--score", "1", "--out", "{tmp}/no/x.txt"], r"directory .*/no does not"),
    # issue 32: numpy's range for a seed, Python's int-string limit, recursion, lone surrogates
    "seed-negative": (["train", "grpo", "seed=-1"], r"seed = -1: must be a whole number in \[0, 4294967295\]"),
    "seed-huge": (["train", "grpo", "seed=99999999999999999999"], r"seed = 99999999999999999999: must be a whole"),
    "sft-seed-negative": (["sft", "sft", "seed=-1"], r"seed = -1: must be a whole number in \[0, 4294967295\]"),
    "rm-seed-huge": (["rm", "rm", "seed=4294967296"], r"seed = 4294967296: must be a whole number in"),
    "config-int-5001-digits": (["train", "{tmp}/int.yaml"], r"int\.yaml: not valid YAML: .*an integer of 5001 digits"),
    "override-int-5001-digits": (["train", "grpo", "steps=" + "9" * 5001], r"steps: .*an integer of 5001 digits"),
    "config-nested-deep": (["train", "{tmp}/deep.yaml"], r"deep\.yaml: not valid YAML: nested deeper than 64 levels"),
    "config-surrogate": (
        ["train", "{tmp}/surrogate.yaml"],
        r"surrogate\.yaml: field 'output_dir': \\ud800 at character 5 is a lone",
    ),
    "override-surrogate": (
        ["train", "grpo", 'data.prompt_key="a\\udfff"'],
        r"command line: field 'data\.prompt_key': \\udfff at character 1 is a lone surrogate",
    ),
}


def _input_files(tmp: Path) -> None:
    _write(tmp / "latin.yaml", b"steps: 3\n# " + LATIN1 + b"\n")
    _write(tmp / "dup.yaml", "steps: 3\nalgo:\n  lam: 1.0\n  lam: 0.9\n")
    response = {"tokens": ["a"], "score": float("nan"), "values": [0.5]}
    _write(tmp / "nan.json", json.dumps({"responses": [response]}))  # Python writes NaN
    _write(tmp / "int.yaml", "steps: " + "9" * 5001 + "\n")
    _write(tmp / "deep.yaml", "algo: " + "[" * 100_000 + "]" * 100_000 + "\n")
    _write(tmp / "surrogate.yaml", 'output_dir: "runs/\\ud800"\n')  # a YAML escape: valid YAML, not text


@pytest.mark.parametrize("fault", sorted(INPUT_FAULTS))
def test_a_bad_input_is_one_line(fault, capsys, tmp_path):
    argv, match = INPUT_FAULTS[fault]
    _input_files(tmp_path)
    assert_one_error_line(capsys, [a.replace("{tmp}", str(tmp_path)) for a in argv], match)


# ---------------------------------------------------------------- inputs read once the model is there


def test_non_utf8_data_files_name_the_file_and_line(capsys, tmp_path, tiny_model_dir, prompt_files):
    prompts = _write(tmp_path / "prompts.jsonl", b'{"prompt": "1+1", "answer": "2"}\n{"prompt": "' + LATIN1 + b'"}\n')
    pairs = _write(tmp_path / "pairs.jsonl", b'{"prompt": "a", "response": "' + LATIN1 + b'"}\n')
    prefs = _write(tmp_path / "prefs.jsonl", b'{"prompt": "a", "chosen": "b", "rejected": "' + LATIN1 + b'"}\n')
    run = tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "run")
    assert_one_error_line(capsys, ["train", "grpo", *run, f"data.train={prompts}"], r"prompts\.jsonl:2: not UTF-8")
    sft = ["sft", "sft", f"model={tiny_model_dir}", f"output_dir={tmp_path / 'sft'}"]
    assert_one_error_line(capsys, [*sft, f"data={pairs}", f"eval_data={pairs}"], r"pairs\.jsonl:1: not UTF-8")
    rm = ["rm", "rm", f"model={tiny_model_dir}", f"output_dir={tmp_path / 'rm'}", f"eval_data={prefs}"]
    assert_one_error_line(capsys, [*rm, f"data={prefs}"], r"prefs\.jsonl:1: not UTF-8 text \(byte 0xe9")
    assert not (tmp_path / "sft").exists() and not (tmp_path / "rm").exists()


@pytest.mark.parametrize("command", [["sft", "sft"], ["rm", "rm"], ["dpo", "dpo"]], ids=["sft", "rm", "dpo"])
def test_sft_max_length_beyond_the_models_positions(command, tmp_path, tiny_model_dir):
    """One line, and only it: ``rm`` loaded the model first, and transformers printed its load report
    (the fresh scalar head) before the line (issue 37, low); the positions are read from config.json first.
    In a process of its own: transformers' logging is configured once per process, as a user's is."""
    import subprocess
    import sys

    argv = [*command, f"model={tiny_model_dir}", "max_length=1000", f"output_dir={tmp_path / 'out'}"]
    done = subprocess.run(
        [sys.executable, "-m", "glassrl.cli", *argv], capture_output=True, text=True, timeout=300, check=False
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, lines
    assert "max_length = 1000: more than the 64 positions of the model" in lines[0]


# ---------------------------------------------------------------- NaN never reaches a checkpoint


def _trainer(preset: str, overrides: list[str], **kwargs):
    from glassrl.rl.loop import Trainer

    return Trainer(load_config(TrainConfig, EXAMPLES / f"{preset}.yaml", overrides), progress=False, **kwargs)


def _finite_weights(checkpoint: Path) -> bool:
    from safetensors.torch import load_file

    files = sorted((checkpoint / "actor").glob("*.safetensors"))
    return bool(files) and all(torch.isfinite(t).all() for f in files for t in load_file(f).values())


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_a_huge_learning_rate_never_reaches_a_checkpoint(policy, capsys, tmp_path, tiny_model_dir, prompt_files):
    """actor_optim.lr=1e30 (the issue's probe): under stop the run ends with exit 2 and one line naming
    the step, the phase and the tensor; under skip the bad optimiser steps are dropped and counted.
    Either way every checkpoint is finite, and with keep_checkpoints=1 the last one survives."""
    run = tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "run")
    argv = ["train", "grpo", *run, "steps=3", "actor_optim.lr=1e30", "logging.checkpoint_every=1"]
    # Padded passes: step 1's first gradient is then exactly 0 (π_θ = π_ref bit for bit, equal rewards) and
    # the run diverges at step 2, after a checkpoint; with the shared-prefix layout it is rounding noise,
    # which Adam at lr 1e30 turns into infinities within step 1 (glassrl.models.shared_prefix).
    argv.append("model.shared_prefix=false")
    argv += ["logging.keep_checkpoints=1", "logging.report=false", f"on_nonfinite={policy}"]
    checkpoints = tmp_path / "run" / "checkpoints"
    if policy == "stop":
        assert_one_error_line(
            capsys,
            argv,
            r"^glassrl train: error: step 2, actor update, optimiser step \d of 2: actor/\S+ = nan.*weights were not"
            r" changed.*last checkpoint, step_00000001, holds finite weights$",
        )
    else:
        rc, _, _ = run_cli(capsys, *argv)
        assert rc == 0
        rows = strict_jsonl(tmp_path / "run" / "metrics.jsonl")
        assert sum(r.get("actor/skipped_steps", 0) for r in rows) >= 2
    (latest,) = [p for p in checkpoints.iterdir() if p.name.startswith("step_")]
    assert (checkpoints / "latest").read_text().strip() == latest.name
    assert read_manifest(latest)["finite"] and _finite_weights(latest)


def _sft_cfg(tiny_model_dir, out: Path, **overrides) -> SFTConfig:
    fields = dict(model=str(tiny_model_dir), data=str(PAIRS), eval_data=str(PAIRS), steps=4, batch_size=4, log_every=1)
    optim = OptimConfig(lr=overrides.pop("lr", 1e-3))
    return SFTConfig(**(fields | overrides), optim=optim, output_dir=str(out))


def _rm_cfg(tiny_model_dir, out: Path, **overrides) -> RMConfig:
    fields = dict(model=str(tiny_model_dir), data=str(PREFS), eval_data=str(PREFS), steps=4, batch_size=4, log_every=1)
    optim = OptimConfig(lr=overrides.pop("lr", 1e-3))
    return RMConfig(**(fields | overrides), optim=optim, output_dir=str(out))


@pytest.mark.parametrize("trainer", ["sft", "rm"])
def test_sft_and_rm_never_write_a_nan_model(trainer, tmp_path, tiny_model_dir):
    """The issue's probe: sft and rm wrote all-NaN models with exit 0. Now a first good run's
    outputs survive a second run that diverges (stop: nothing written), and under skip the
    metrics hold null where a value is not finite, never NaN."""
    make, train = (_sft_cfg, train_sft) if trainer == "sft" else (_rm_cfg, train_rm)
    out = tmp_path / trainer
    train(make(tiny_model_dir, out))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(GlassrlError, match=rf"{trainer} step \d+: train/(loss|grad_norm) = (nan|inf)"):
        train(make(tiny_model_dir, out, lr=1e30))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # old outputs, whole
    assert [p.name for p in tmp_path.iterdir()] == [trainer]  # no staging or lock left behind

    train(make(tiny_model_dir, out, lr=1e30, on_nonfinite="skip"))
    rows = strict_jsonl(out / "metrics.jsonl")
    assert sum(r.get("train/skipped_steps", 0) for r in rows) >= 1
    assert any(r["train/loss"] is None for r in rows)  # a window of skipped steps: null, not NaN
    from safetensors.torch import load_file

    assert all(torch.isfinite(t).all() for f in out.glob("*.safetensors") for t in load_file(f).values())


# ---------------------------------------------------------------- one run per directory


def test_two_runs_into_one_directory_are_refused(capsys, tmp_path, tiny_model_dir, prompt_files):
    run = tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "run")
    first = _trainer("grpo", run)
    assert (tmp_path / "run" / ".lock").read_text().startswith("pid ")
    with pytest.raises(GlassrlError, match=r"output_dir = .*/run is in use by another glassrl run \(pid \d+"):
        _trainer("grpo", run)
    assert_one_error_line(capsys, ["train", "grpo", *run], r"is in use by another glassrl run")
    from glassrl.run.lock import RunLock, sibling_lock_path

    with RunLock(sibling_lock_path(tmp_path / "sft"), "test"):  # sft, rm, init-model: the sibling lock
        assert_one_error_line(
            capsys, ["sft", "sft", f"model={tiny_model_dir}", f"output_dir={tmp_path / 'sft'}"], r"is in use"
        )
        assert_one_error_line(capsys, ["init-model", "--out", tmp_path / "sft"], r"--out .*/sft is in use")
    first.close()
    assert not (tmp_path / "run" / ".lock").exists()
    _trainer("grpo", run).close()  # free again


@pytest.mark.parametrize("case", ["in use", "holds checkpoints", "nothing to resume"])
def test_a_run_directory_that_cannot_serve_fails_before_any_model_is_loaded(
    case, monkeypatch, tmp_path, tiny_model_dir, prompt_files
):
    """The run's lock, then the fresh-or-resume check, come first (glassrl.run.session): a second run
    into a directory, a fresh run into one with checkpoints and a resume without one fail at once,
    before any model is loaded (they used to load every worker first), and leave no lock behind."""
    from glassrl.rl import loop
    from glassrl.run.lock import RunLock

    def no_workers(*args, **kwargs):
        raise AssertionError("the workers were built")

    monkeypatch.setattr(loop, "build_local_workers", no_workers)
    run = tmp_path / "run"
    held = RunLock(run / ".lock", "test") if case == "in use" else None
    if case == "holds checkpoints":
        (run / "checkpoints" / "step_00000001").mkdir(parents=True)
        (run / "checkpoints" / "step_00000001" / "manifest.json").write_text("{}")
    message = {"in use": "is in use by another", "holds checkpoints": "already holds checkpoints"}
    with pytest.raises(GlassrlError, match=message.get(case, "--resume: no checkpoint in")):
        _trainer("grpo", tiny_run_overrides(tiny_model_dir, prompt_files, run), resume=case == "nothing to resume")
    if held is not None:
        held.release()
    assert not (run / ".lock").exists()


def test_a_stale_lock_of_a_dead_run_is_taken_over(tmp_path, tiny_model_dir, prompt_files):
    """A killed run leaves its lock file; the kernel dropped its flock, so the next run takes it."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").write_text("pid 999999, started 2026-01-01 00:00:00\n")
    trainer = _trainer("grpo", tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "run"))
    assert trainer.lock.stale == "pid 999999, started 2026-01-01 00:00:00"
    trainer.close()


# ---------------------------------------------------------------- a full disk


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_is_one_line(capsys, monkeypatch, tmp_path, tiny_model_dir, prompt_files):
    """ENOSPC from a checkpoint write, a metrics write and an sft output write: one line each,
    and what was there before stays whole."""
    import glassrl.report.sinks as sinks
    import glassrl.run.checkpoint as checkpoint

    run = tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "run")
    with monkeypatch.context() as m:
        m.setattr(checkpoint, "save_file", _enospc)
        assert_one_error_line(
            capsys, ["train", "grpo", *run, "steps=1"], r"checkpoint step_00000001: cannot write .*No space left"
        )
    assert not list((tmp_path / "run" / "checkpoints").iterdir())  # the tmp-* directory was removed
    with monkeypatch.context() as m:
        m.setattr(sinks.JsonlSink, "log", _enospc)
        assert_one_error_line(capsys, ["train", "grpo", *run, "steps=1"], r"output_dir = .*: cannot write .*No space")
    out = tmp_path / "sft"
    train_sft(_sft_cfg(tiny_model_dir, out))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with monkeypatch.context() as m:
        m.setattr(transformers.modeling_utils, "safe_save_file", _enospc)  # the weights: the last write
        assert_one_error_line(
            capsys,
            ["sft", "sft", f"model={tiny_model_dir}", f"data={PAIRS}", f"eval_data={PAIRS}", f"output_dir={out}"],
            r"output_dir = .*/sft: cannot write .*No space left on device",
        )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# ---------------------------------------------------------------- sft and rm outputs appear whole


def test_a_killed_rerun_leaves_the_old_outputs_whole(monkeypatch, tmp_path, tiny_model_dir):
    """A re-run killed after its metrics were written but before its weights: the directory still
    holds the first run's weights beside the first run's metrics."""
    out = tmp_path / "sft"
    train_sft(_sft_cfg(tiny_model_dir, out, steps=2))
    (out / "notes.txt").write_text("mine")  # a file of the user's is carried over
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    class Killed(BaseException):
        pass

    def kill(*args, **kwargs):
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(transformers.modeling_utils, "safe_save_file", kill)  # after the metrics, before the weights
        with pytest.raises(Killed):
            train_sft(_sft_cfg(tiny_model_dir, out, steps=3, seed=1))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    train_sft(_sft_cfg(tiny_model_dir, out, steps=3, seed=1))
    rows = strict_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft"]


# ---------------------------------------------------------------- resume and run-directory hygiene


@pytest.mark.slow
def test_resume_hygiene(capsys, tmp_path, tiny_model_dir, prompt_files):
    """One run of 2 steps, then its directory mistreated: latest deleted, config.yaml deleted or
    edited, the directory moved; each resume works, says what it found, and ends as a run that
    never stopped. An override that changes the run is refused; steps may change and is recorded."""
    run = tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "a")
    common = ["logging.checkpoint_every=1", "logging.keep_checkpoints=3", "logging.report=false"]
    straight = tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "straight")
    _trainer("grpo", [*straight, *common, "steps=3"]).train()

    _trainer("grpo", [*run, *common, "steps=2"]).train()
    a = tmp_path / "a"
    (a / "checkpoints" / "latest").unlink()
    (a / "config.yaml").write_text((a / "config.yaml").read_text().replace("seed: 0", "seed: 7"))
    moved = tmp_path / "moved"
    a.rename(moved)
    with pytest.raises(GlassrlError, match=r"--resume: the config differs from the checkpoint's in actor_optim\.lr"):
        _trainer("grpo", [*run, *common, "steps=3", f"output_dir={moved}", "actor_optim.lr=0.5"], resume=True)
    trainer = _trainer("grpo", [*run, *common, "steps=3", f"output_dir={moved}"], resume=True)
    assert trainer.counters.step == 2
    trainer.train()
    (record,) = [json.loads(line) for line in (moved / "resumes.jsonl").read_text().splitlines()]
    assert record["step"] == 2 and record["checkpoint"] == "step_00000002"
    assert record["changed"] == {"output_dir": [str(tmp_path / "a"), str(moved)], "steps": [2, 3]}
    notes = " | ".join(record["notes"])
    assert "latest is missing; resuming from step_00000002" in notes
    assert "config.yaml differed from the checkpoint's config (seed); rewritten" in notes
    assert "seed: 0" in (moved / "config.yaml").read_text()
    done = sorted((moved / "checkpoints").glob("step_*"))[-1]
    same = checkpoint_contents(tmp_path / "straight" / "checkpoints" / "step_00000003")
    assert {k: v for k, v in checkpoint_contents(done).items() if k != "config"} == {
        k: v for k, v in same.items() if k != "config"
    }


def test_the_resumed_config_is_judged_against_the_checkpoints_copy():
    from glassrl.run.state import RunConfig

    defaults = {"steps": 10, "lr": 0.1, "logging": {"every": 1}, "new_knob": "off"}
    saved = {"steps": 10, "lr": 0.1, "logging": {"every": 1}}  # written before new_knob existed
    now = RunConfig({**defaults, "steps": 20, "logging": {"every": 5}}, ("steps", "logging"), defaults)
    now.load_state_dict({"config": saved})
    assert now.changes == {"logging.every": (1, 5), "steps": (10, 20)} and now.saved == saved
    with pytest.raises(GlassrlError, match=r"differs from the checkpoint's in new_knob \(new_knob: None then, 'on'"):
        RunConfig({**defaults, "new_knob": "on"}, ("steps",), defaults).load_state_dict({"config": saved})
    with pytest.raises(GlassrlError, match=r"in lr \(lr: 0\.1 then, 0\.2 now\).*only steps may change"):
        RunConfig({**defaults, "lr": 0.2}, ("steps",), defaults).load_state_dict({"config": saved})


# ---------------------------------------------------------------- every checkpoint reads back


def _odd_values():
    """What a Parquet row or a reward's details can hold that JSON cannot say directly."""
    import datetime as dt

    import pandas as pd

    return {
        "created": pd.Timestamp("2024-05-01 12:00:00.000000123"),
        "day": dt.date(2024, 5, 1),
        "at": dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc),
        "tags": {"b", "a"},
        "pair": (1, "x"),
        "blob": b"\x00\xff",
        "nan": math.nan,
        "inf": -math.inf,
        "by_id": {3: "three"},
    }


def test_the_sample_buffer_reads_back_with_values_json_lacks(tmp_path):
    from glassrl.data.records import PromptRecord
    from glassrl.rewards.base import RewardResult
    from glassrl.rl.sampling import DynamicSampler, _Group
    from glassrl.rollout.base import RolloutBatch
    from glassrl.run.checkpoint import CheckpointManager, Part
    from glassrl.run.codec import same

    odd = _odd_values()
    rollout = RolloutBatch(
        torch.ones(2, 3, dtype=torch.long),
        torch.ones(2, 3, dtype=torch.bool),
        torch.arange(8).reshape(2, 4),
        torch.ones(2, 4, dtype=torch.bool),
        torch.zeros(2, dtype=torch.long),
        ["stop", "length"],
        ["a", "b"],
        rollout_logprobs=torch.tensor([[-0.5, math.nan, 0.0, 0.0], [-1.0, -2.0, 0.0, 0.0]]),
    )
    result = RewardResult("ok", 1.0, ((2, 0.5),), "", {"inner": RewardResult("ok", 0.5, details=odd), **odd})
    sampler = DynamicSampler(need=1, max_rounds=1, pad_id=0)
    sampler.buffer = [_Group(rollout, PromptRecord("q", "4", odd, "p.parquet#0"), [1, 2, 3], [result, result])]
    ((name, (kind, value)),) = sampler.state_dict().items()
    manager = CheckpointManager(tmp_path, keep=1)
    other = DynamicSampler(need=1, max_rounds=1, pad_id=0)
    other.load_state_dict(manager.load(manager.save(1, {name: Part(kind, value)}), {name}))
    (group,) = other.buffer
    assert same(group.prompt.metadata, odd) and group.prompt.source == "p.parquet#0"
    inner = group.results[0].details["inner"]
    assert isinstance(inner, RewardResult) and inner.score == 0.5 and same(inner.details, odd)
    assert same(group.results[0].details["tags"], {"a", "b"}) and group.results[0].process_rewards == ((2, 0.5),)
    assert same(group.rollout.rollout_logprobs, rollout.rollout_logprobs) and group.rollout.texts == ["a", "b"]


@pytest.mark.slow
def test_a_run_with_parquet_timestamps_in_the_buffer_resumes(tmp_path, tiny_model_dir, prompt_files):
    """The issue's probe: a Parquet timestamp column made --resume of a DAPO run fail
    (UnpicklingError). Prompts with a timestamp and a date column, a buffer that holds groups at
    the checkpoint, a resume that ends bit-identical to the run that never stopped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from run_helpers import KillAt, Killed

    rows = [json.loads(line) for line in prompt_files[0].read_text().splitlines()]
    table = pa.Table.from_pylist(rows).append_column(
        "created", pa.array([1_700_000_000_000_000_123 + i for i in range(len(rows))], pa.timestamp("ns"))
    )
    pq.write_table(table, tmp_path / "prompts.parquet")
    reward = f"reward.sources=[{{name: user_function, spec: '{REWARD_FNS}:says_yes'}}]"
    common = [f"data.train={tmp_path / 'prompts.parquet'}", reward, "steps=3", "algo.dynamic_sampling_max_rounds=8"]
    common += ["logging.checkpoint_every=1", "logging.keep_checkpoints=1", "logging.report=false"]
    straight = _trainer("dapo", [*tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "s"), *common])
    straight.train()
    run = [*tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "r"), *common]
    victim = _trainer("dapo", run)
    victim.sinks.sinks.append(KillAt(2))
    with pytest.raises(Killed):
        victim.train()
    resumed = _trainer("dapo", run, resume=True)
    assert any(type(r.metadata.get("created")).__name__ == "Timestamp" for r in resumed.prompts.records)
    resumed.train()
    one = strict_jsonl(tmp_path / "s" / "metrics.jsonl")
    two = strict_jsonl(tmp_path / "r" / "metrics.jsonl")
    assert [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in one] == [
        {k: v for k, v in r.items() if not k.startswith("perf/")} for r in two
    ]
