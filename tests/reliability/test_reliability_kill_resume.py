"""Kill -9 a training run again and again, at random moments and in the middle of checkpoints;
resume each time; the end must be the run that never stopped, bit for bit.

Each life of the run is a child process forked from a fork server that has imported glassrl,
torch and transformers but run nothing (multiprocessing "forkserver": no thread pool to break
in the child, no import to pay per life). A life is ended by a real SIGKILL, either

- after a random delay (anywhere: loading, generating, updating, writing a checkpoint, the
  metrics, a ledger, the lock), or
- from inside, at a random fsync of a checkpoint save (between two files of a part, after the
  manifest, after the rename, before ``latest`` moves): the moments a crash-safe save is for.

The next life resumes when a checkpoint exists (else starts afresh), and the last one runs to the
end. Compared with a straight run: every file of the final checkpoint (actor and critic weights,
optimiser states, RNGs, data position, reward normaliser: their sha256), metrics.jsonl (every
number; each step exactly once, none lost, none twice), every ledger file, byte for byte.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
from pathlib import Path

import pytest
from harness import checkpoint_contents, strict_jsonl, without_perf

from helpers import tiny_run_overrides

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KILLS = 5  # lives ended by SIGKILL before the one that finishes
SEED = 5  # of the kill moments (with it: a kill mid-part and one after the rename, before `latest` moves)
SAVE_FSYNCS = 41  # checkpoint.fsync calls of one save of this run (each file, each directory, tmp, root)
STEPS = 5
# PPO (actor and critic, two optimisers), reward normalisation (a running state), a checkpoint
# and a ledger every step, two checkpoints kept: every part of a checkpoint is exercised.
OVERRIDES = [
    f"steps={STEPS}",
    "algo.reward_norm=true",
    "logging.checkpoint_every=1",
    "logging.keep_checkpoints=2",
    "logging.ledger_every=1",
    "logging.report=false",
]


def _life(overrides: list[str], resume: bool, kill_at_fsync: int | None) -> None:
    """One life of the run (in a child process); SIGKILLs itself at the given checkpoint fsync."""
    import glassrl.run.checkpoint as checkpoint
    from glassrl.config import load_config
    from glassrl.rl.config import TrainConfig
    from glassrl.rl.loop import Trainer

    if kill_at_fsync is not None:
        real, calls = checkpoint.fsync, [0]

        def fsync_then_maybe_die(path):
            real(path)
            calls[0] += 1
            if calls[0] == kill_at_fsync:
                os.kill(os.getpid(), signal.SIGKILL)

        checkpoint.fsync = fsync_then_maybe_die
    Trainer(load_config(TrainConfig, EXAMPLES / "ppo.yaml", overrides), resume=resume, progress=False).train()


def _has_checkpoint(run: Path) -> bool:
    root = run / "checkpoints"
    return root.is_dir() and any((p / "manifest.json").is_file() for p in root.glob("step_*"))


@pytest.mark.slow
def test_random_kills_end_as_the_run_that_never_stopped(tmp_path, tiny_model_dir, prompt_files):
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["glassrl.rl.loop", "glassrl.run.checkpoint", "harness"])
    straight, run = tmp_path / "straight", tmp_path / "killed"

    def start(out: Path, resume: bool, kill_at_fsync: int | None = None):
        overrides = [*tiny_run_overrides(tiny_model_dir, prompt_files, out), *OVERRIDES]
        process = ctx.Process(target=_life, args=(overrides, resume, kill_at_fsync))
        process.start()
        return process

    first = start(straight, resume=False)
    first.join(300)
    assert first.exitcode == 0

    rng, moments, lives = random.Random(SEED), [], 0
    while len(moments) < KILLS:
        lives += 1
        resume = _has_checkpoint(run)
        if len(moments) % 2:  # from inside, mid-checkpoint: the j-th such kill in the j-th stretch of a save
            j, n = len(moments) // 2, KILLS // 2
            at = rng.randint(1 + SAVE_FSYNCS * j // n, SAVE_FSYNCS * (j + 1) // n)
            process = start(run, resume, kill_at_fsync=at)
            process.join(300)
            moment = f"checkpoint fsync #{at}"
        else:  # from outside, at a random time
            delay = rng.uniform(0.5, 4.0)
            process = start(run, resume)
            process.join(delay)
            process.kill()
            process.join()
            moment = f"{delay:.1f}s"
        if process.exitcode == -signal.SIGKILL:
            moments.append(moment)
        else:  # it finished first: the kills so far are all this run gets
            assert process.exitcode == 0
            break
    last = start(run, resume=_has_checkpoint(run))
    last.join(300)
    assert last.exitcode == 0
    print(f"\n{len(moments)} kills survived ({', '.join(moments)}), {lives + 1} lives")

    # the final checkpoint: every file the same (the config part names its own output_dir)
    final = f"step_{STEPS:08d}"
    one = checkpoint_contents(straight / "checkpoints" / final)
    two = checkpoint_contents(run / "checkpoints" / final)
    assert one.keys() == two.keys() and {"actor", "actor_optim", "critic", "critic_optim", "rng"} <= one.keys()
    for part in one.keys() - {"config"}:
        assert one[part] == two[part], part
    assert (run / "checkpoints" / "latest").read_text() == f"{final}\n"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", f"step_{STEPS - 1:08d}", final]
    # every logged number, each step exactly once
    rows = strict_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(STEPS + 1))
    assert without_perf(rows) == without_perf(strict_jsonl(straight / "metrics.jsonl"))
    # every ledger, byte for byte
    ledgers = sorted(p.name for p in (straight / "ledgers").iterdir())
    assert ledgers == sorted(p.name for p in (run / "ledgers").iterdir()) and len(ledgers) == STEPS
    for name in ledgers:
        assert (straight / "ledgers" / name).read_bytes() == (run / "ledgers" / name).read_bytes(), name
    # no lock, no temporary file left; one resumes.jsonl line per resumed life
    assert not (run / ".lock").exists()
    resumes = (run / "resumes.jsonl").read_text().splitlines() if (run / "resumes.jsonl").exists() else []
    assert all(json.loads(line)["step"] >= 1 for line in resumes)
