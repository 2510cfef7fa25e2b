"""Ctrl-C (SIGINT) and SIGTERM at named points of a run (issue 32): each ends with one line, exit
code 128 + the signal, no process of the run left behind, and a resume, by the command the line
gives, that ends as the run that never stopped, bit for bit.

Each life of a run is a child of a fork server (as in the kill test), running ``glassrl train`` as
the command line would (glassrl.cli.main, then the interpreter's exit handlers) with a real signal
sent to itself when step 2 reaches the named point:

- a phase of the step (generate, score: the reward workers, logprobs, advantages, update), the
  ledger, or an fsync of the step's checkpoint;
- once: the step ends, is checkpointed (the schedule here writes none at step 2: the stop does),
  and the run stops at step 2; twice: the second signal abandons the step where it is (a
  checkpoint being written is removed), and the run stops at its last checkpoint, step 1.

The life is a child subreaper, so every process the run started (reward workers and their
reapers) comes back to it when orphaned: after the command's exit handlers have run, none may
be left. The ``sft`` and ``rm`` loop, which writes nothing until its end, is tested in-process.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import multiprocessing
import os
import re
import shlex
import signal
import time
from pathlib import Path

import pytest
from harness import checkpoint_contents, strict_jsonl, without_perf

from glassrl.errors import GlassrlError
from helpers import tiny_run_overrides

REWARD_FNS = Path(__file__).resolve().parents[1] / "rl" / "trainer_reward_fns.py"
STEPS = 3
OVERRIDES = [
    f"steps={STEPS}",
    "threads=1",
    "logging.report=false",
    "logging.keep_checkpoints=3",
    f"reward.sources=[{{name: user_function, spec: '{REWARD_FNS}:says_yes', style: glassrl}}]",  # worker processes
]
SIGINT, SIGTERM = signal.SIGINT, signal.SIGTERM
# id -> (signal, times sent, where in step 2, logging.checkpoint_every, the step it stops at)
CASES = {
    "sigint-generate": (SIGINT, 1, "generate", 0, 2),
    "sigint-score": (SIGINT, 1, "score", 0, 2),
    "sigint-logprobs": (SIGINT, 1, "logprobs", 0, 2),
    "sigint-update": (SIGINT, 1, "update", 0, 2),
    "sigint-ledger": (SIGINT, 1, "ledger", 0, 2),
    "sigint-checkpoint": (SIGINT, 1, "checkpoint", 1, 2),
    "sigterm-advantages": (SIGTERM, 1, "advantages", 0, 2),
    "sigint-twice-generate": (SIGINT, 2, "generate", 1, 1),
    "sigint-twice-score": (SIGINT, 2, "score", 1, 1),
    "sigint-twice-update": (SIGINT, 2, "update", 1, 1),
    "sigint-twice-checkpoint": (SIGINT, 2, "checkpoint", 1, 1),
    "sigterm-twice-logprobs": (SIGTERM, 2, "logprobs", 1, 1),
}
PR_SET_CHILD_SUBREAPER = 36


def _children() -> list[tuple[int, str]]:
    """(pid, name) of this process's live children (zombies reaped first)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
            if int(rest[1]) == os.getpid() and rest[0] != "Z":
                found.append((int(entry.name), name))
    return found


def _life(argv: list[str], out: str, where: str | None, signum: int, times: int, at_step: int) -> None:
    """One run of ``glassrl ARGV`` in this child, signalled at ``where`` in step ``at_step``; writes
    out/life.json: exit code, stderr lines, processes left."""
    import glassrl.rl.loop as loop
    import glassrl.rl.metrics as metrics
    import glassrl.run.checkpoint as checkpoint
    from glassrl.cli import main

    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    stderr = Path(out) / "stderr.txt"
    for fd, path in ((1, Path(out) / "stdout.txt"), (2, stderr)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    current, fired = [0], [False]

    def fire() -> None:
        if current[0] == at_step and not fired[0]:
            fired[0] = True
            for _ in range(times):
                os.kill(os.getpid(), signum)

    real_step, real_phase, real_fsync, real_ledger = (
        loop.Trainer.step,
        metrics.PhaseTimer.phase,
        checkpoint.fsync,
        loop.from_experience,
    )

    def step(self):
        current[0] = self.counters.step + 1
        return real_step(self)

    def phase(self, name):
        if name == where:
            fire()
        return real_phase(self, name)

    def fsync(path):
        real_fsync(path)
        if where == "checkpoint":
            fire()

    def ledger(*args, **kwargs):
        if where == "ledger":
            fire()
        return real_ledger(*args, **kwargs)

    loop.Trainer.step, metrics.PhaseTimer.phase, checkpoint.fsync, loop.from_experience = step, phase, fsync, ledger
    code = main(argv)
    atexit._run_exitfuncs()  # as the interpreter's exit would: the reward workers' pools close
    deadline, left = time.monotonic() + 15, _children()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _children()
    for pid, _ in left:
        os.kill(pid, signal.SIGKILL)
    lines = [line for line in stderr.read_text().splitlines() if line.strip()]
    (Path(out) / "life.json").write_text(json.dumps({"code": code, "stderr": lines, "left": left}))
    os._exit(0)


@pytest.fixture(scope="module")
def lives():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["glassrl.rl.loop", "glassrl.cli", "harness"])

    def live(
        argv: list[str], out: Path, where: str | None = None, signum: int = SIGINT, times: int = 0, at_step: int = 2
    ):
        out.mkdir(parents=True, exist_ok=True)
        process = ctx.Process(target=_life, args=([str(a) for a in argv], str(out), where, signum, times, at_step))
        process.start()
        process.join(300)
        assert process.exitcode == 0, (process.exitcode, (out / "stderr.txt").read_text()[-3000:])
        return json.loads((out / "life.json").read_text())

    return live


@pytest.fixture(scope="module")
def straight(lives, tmp_path_factory, tiny_model_dir, prompt_files) -> Path:
    """The run that never stopped."""
    run = tmp_path_factory.mktemp("straight") / "run"
    life = lives(["train", "grpo", *tiny_run_overrides(tiny_model_dir, prompt_files, run), *OVERRIDES], run.parent)
    assert life["code"] == 0 and not life["left"], life
    return run


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_stopped_run_says_one_line_leaves_nothing_and_resumes_exactly(
    case, lives, straight, tmp_path, tiny_model_dir, prompt_files
):
    signum, times, where, every, at = CASES[case]
    run = tmp_path / "run"
    argv = ["train", "grpo", *tiny_run_overrides(tiny_model_dir, prompt_files, run), *OVERRIDES]
    life = lives([*argv, f"logging.checkpoint_every={every}"], tmp_path / "stopped", where, signum, times)

    name = signal.Signals(signum).name
    assert life["code"] == 128 + signum and not life["left"], life
    assert not any("Traceback" in line for line in life["stderr"]), life["stderr"]
    notice = f"glassrl: {name}: stopping when this step ends; {'Ctrl-C' if signum == SIGINT else name} again stops"
    assert life["stderr"][:-1] == [line for line in life["stderr"][:-1] if line.startswith(notice)], life["stderr"]
    why = "" if times == 1 else rf", the last checkpoint \(a second {name} abandoned the step in progress\)"
    command = rf"glassrl train {re.escape(str(run / 'config.yaml'))} --resume"
    assert re.fullmatch(rf"glassrl train: stopped at step {at}{why}; resume with: {command}", life["stderr"][-1])
    checkpoints = run / "checkpoints"
    assert (checkpoints / "latest").read_text() == f"step_{at:08d}\n"
    assert not [p for p in checkpoints.iterdir() if p.name.startswith("tmp-")]
    assert not (run / ".lock").exists()

    resumed = lives(shlex.split(life["stderr"][-1].partition("resume with: ")[2])[1:], tmp_path / "resumed")
    assert resumed["code"] == 0 and not resumed["left"], resumed
    final = f"step_{STEPS:08d}"
    one = checkpoint_contents(straight / "checkpoints" / final)
    two = checkpoint_contents(checkpoints / final)
    assert one.keys() == two.keys() and {"actor", "actor_optim", "rng"} <= one.keys()
    for part in one.keys() - {"config"}:
        assert one[part] == two[part], part
    rows = strict_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(STEPS + 1))
    assert without_perf(rows) == without_perf(strict_jsonl(straight / "metrics.jsonl"))
    for ledger in sorted((straight / "ledgers").iterdir()):
        assert ledger.read_bytes() == (run / "ledgers" / ledger.name).read_bytes(), ledger.name


@pytest.mark.slow
def test_with_rollout_overlap_a_stop_checkpoints_the_round_in_flight(lives, tmp_path, tiny_model_dir, prompt_files):
    """rollout.overlap samples step 4's round during step 3, with step 3's weights: a stop in step 3
    checkpoints step 3 with that round (glassrl.rl.sampling.AsyncRounds waits for it), and the resume
    is the run that never stopped."""
    overlap = [*OVERRIDES, "steps=4", "rollout.overlap=true", "logging.checkpoint_every=2"]
    straight, run = tmp_path / "straight" / "run", tmp_path / "run"
    life = lives(
        ["train", "grpo", *tiny_run_overrides(tiny_model_dir, prompt_files, straight), *overlap], straight.parent
    )
    assert life["code"] == 0, life
    argv = ["train", "grpo", *tiny_run_overrides(tiny_model_dir, prompt_files, run), *overlap]
    life = lives(argv, tmp_path / "stopped", "update", SIGINT, 1, at_step=3)
    assert life["code"] == 130 and not life["left"], life
    assert re.fullmatch(r"glassrl train: stopped at step 3; resume with: .*", life["stderr"][-1])
    resumed = lives(shlex.split(life["stderr"][-1].partition("resume with: ")[2])[1:], tmp_path / "resumed")
    assert resumed["code"] == 0, resumed
    one, two = (checkpoint_contents(r / "checkpoints" / "step_00000004") for r in (straight, run))
    assert {k: v for k, v in one.items() if k != "config"} == {k: v for k, v in two.items() if k != "config"}
    assert without_perf(strict_jsonl(run / "metrics.jsonl")) == without_perf(strict_jsonl(straight / "metrics.jsonl"))


@pytest.mark.slow
@pytest.mark.parametrize("agent", [["rollout.agent.tools=[calculator]"], ["rollout.agent.environment=tool-add"]])
def test_a_stopped_tool_using_run_resumes_by_the_printed_command(agent, lives, tmp_path, tiny_model_dir, prompt_files):
    """Issue 44: the resume command a stopped tool-using run printed was refused ("rollout.agent.
    valid_call_reward = 0.0: ignored"): its config.yaml holds rollout.agent's defaults."""
    run = tmp_path / "run"
    argv = ["train", "grpo", *tiny_run_overrides(tiny_model_dir, prompt_files, run), *OVERRIDES, *agent]
    life = lives(
        [*argv, "rollout.agent.max_turns=2", "rollout.agent.describe_tools=false"],
        tmp_path / "stopped",
        "update",
        SIGINT,
        1,
    )
    assert life["code"] == 130 and not life["left"], life
    assert "; resume with: glassrl train " in life["stderr"][-1], life["stderr"]
    resumed = lives(shlex.split(life["stderr"][-1].partition("resume with: ")[2])[1:], tmp_path / "resumed")
    assert resumed["code"] == 0 and not resumed["left"], resumed
    assert [r["step"] for r in strict_jsonl(run / "metrics.jsonl")] == list(range(STEPS + 1))


# ---------------------------------------------------------------- sft and rm: nothing written


@pytest.fixture(params=["default", "ignored"])
def sigint_before(request):
    """SIGINT's handler when the run starts: Python's, or ignored, as in a process that a
    non-interactive shell started in the background (``make test &``: POSIX has such a command
    ignore SIGINT); the handlers the test found are given back after it."""
    found = {number: signal.getsignal(number) for number in (SIGINT, SIGTERM)}
    handler = signal.default_int_handler if request.param == "default" else signal.SIG_IGN
    signal.signal(SIGINT, handler)
    yield handler
    for number, was in found.items():
        signal.signal(number, was)


@pytest.mark.parametrize("times", [1, 2])
def test_a_stopped_sft_run_says_one_line_and_writes_nothing(
    times, sigint_before, monkeypatch, tmp_path, tiny_model_dir
):
    """The step in progress ends (or, at a second signal, is abandoned); the previous outputs stay whole;
    the run leaves SIGINT's handler as it found it (the test asserted Python's own, and failed in a
    suite started in the background, where SIGINT is ignored)."""
    import torch

    from glassrl.run.stop import Stopped
    from glassrl.supervised.sft import SFTConfig, train_sft

    data = Path(__file__).resolve().parent / "data" / "sft_pairs.jsonl"
    out = tmp_path / "sft"
    cfg = SFTConfig(model=str(tiny_model_dir), data=str(data), eval_data=str(data), steps=4, batch_size=4)
    cfg.output_dir = str(out)
    train_sft(cfg)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls, clip = [0], torch.nn.utils.clip_grad_norm_

    def clip_then_signal(*args, **kwargs):  # the loop clips once a step
        calls[0] += 1
        if calls[0] == 2:
            for _ in range(times):
                os.kill(os.getpid(), SIGINT)
        return clip(*args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_then_signal)
    stopped = "stopped at step 2 of 4" if times == 1 else "stopped during a step"
    with pytest.raises(Stopped, match=rf"^{stopped}; nothing was written \(output_dir = {out} is as it was\)") as err:
        train_sft(cfg)
    assert err.value.exit_code == 130 and not isinstance(err.value, GlassrlError)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft"]  # no staging directory, no lock left
    assert signal.getsignal(SIGINT) is sigint_before  # the handler is given back


@pytest.mark.slow
def test_a_stopped_dpo_run_checkpoints_its_steps_and_resumes_exactly(monkeypatch, tmp_path, tiny_model_dir):
    """A preference run keeps checkpoints: a stop writes one at the step it ends (none was due), the line
    says to add --resume, and that resume ends as the run that never stopped, bit for bit."""
    import torch
    from safetensors.torch import load_file

    from glassrl.data.preferences import preference_pairs
    from glassrl.run.stop import Stopped
    from glassrl.supervised.preference import train_preference
    from glassrl.supervised.preference_config import PreferenceConfig

    data = tmp_path / "pairs.jsonl"
    rows = [
        {"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in preference_pairs("train", size=12)
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")

    def cfg(name: str) -> PreferenceConfig:
        return PreferenceConfig(
            model=str(tiny_model_dir), data=str(data), eval_data=str(data), steps=4, batch_size=4,
            checkpoint_every=3, log_every=1, output_dir=str(tmp_path / name), device="cpu", threads=1,
        )  # fmt: skip

    train_preference(cfg("whole"))
    calls, clip = [0], torch.nn.utils.clip_grad_norm_

    def clip_then_signal(*args, **kwargs):  # the loop clips once a step
        calls[0] += 1
        if calls[0] == 2:
            os.kill(os.getpid(), SIGTERM)
        return clip(*args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_then_signal)
    out = tmp_path / "stopped"
    resume = rf"output_dir = {out} is as it was; add --resume to the same command to go on from step_00000002"
    with pytest.raises(Stopped, match=rf"^stopped at step 2 of 4; {resume}$") as err:
        train_preference(cfg("stopped"))
    assert err.value.exit_code == 128 + SIGTERM
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step_00000002"]
    monkeypatch.undo()
    train_preference(cfg("stopped"), resume=True)
    assert (out / "metrics.jsonl").read_bytes() == (tmp_path / "whole" / "metrics.jsonl").read_bytes()
    a, b = load_file(tmp_path / "whole" / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- a Ray driver

RAY = ["trainer.backend=ray", "ray.actor.world_size=2", "ray.actor.resources={CPU: 0.25}"]


@pytest.mark.slow
def test_a_ray_driver_stopped_by_sigterm_says_one_line_and_resumes(lives, tmp_path, tiny_model_dir, prompt_files):
    """It aborted with exit code 134 (ray.init's own SIGTERM handler called sys.exit mid-step). Now the
    step ends and is checkpointed, Ray's processes end with the driver, and the resume takes up at
    step 3 (that a Ray run resumes bit for bit: tests/rl/test_rl_ray.py, a killed rank)."""
    pytest.importorskip("ray")
    run = tmp_path / "run"
    argv = ["train", "grpo", *tiny_run_overrides(tiny_model_dir, prompt_files, run), *OVERRIDES, *RAY]
    life = lives(argv, tmp_path / "stopped", "update", SIGTERM, 1)
    assert life["code"] == 128 + SIGTERM and not life["left"], life
    assert not any("Traceback" in line for line in life["stderr"]), life["stderr"]
    (line,) = [line for line in life["stderr"] if line.startswith("glassrl train:")]  # Ray's workers log there too
    command = rf"glassrl train {re.escape(str(run / 'config.yaml'))} --resume"
    assert re.fullmatch(rf"glassrl train: stopped at step 2; resume with: {command}", line), life
    resumed = lives(shlex.split(line.partition("resume with: ")[2])[1:], tmp_path / "resumed")
    assert resumed["code"] == 0 and not resumed["left"], resumed
    assert [r["step"] for r in strict_jsonl(run / "metrics.jsonl")] == list(range(STEPS + 1))
