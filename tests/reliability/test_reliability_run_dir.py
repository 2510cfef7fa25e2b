"""A mistreated run directory (issue 33, items 3 and 6): symbolic links where glassrl writes are
replaced or refused, never written through; a resume repairs the files it owns (a bad line in
metrics.jsonl, ledgers of steps after the checkpoint) instead of failing or keeping them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ERROR_LINE, assert_one_error_line, run_cli, strict_jsonl

from helpers import preset_trainer, tiny_run_overrides
from run_helpers import KillAt, Killed

PRECIOUS = "a file outside the run\n"


def _outside(tmp_path: Path, *names: str) -> dict[str, Path]:
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    files = {name: outside / name.replace("/", "_") for name in names}
    for path in files.values():
        path.write_text(PRECIOUS)
    return files


def test_links_where_glassrl_writes_a_whole_file_are_replaced_not_followed(
    capsys, tmp_path, tiny_model_dir, prompt_files
):
    """config.yaml, environment.json, a ledger file and report.html: each a link to a file outside the
    run; the run writes its own file in the link's place and the outside files stay as they were. A
    dangling link (to a file that does not exist) creates nothing where it points; nor does a link at
    the name of the metrics rewrite's old fixed temp file."""
    run = tmp_path / "run"
    (run / "ledgers").mkdir(parents=True)
    names = ("config.yaml", "environment.json", "ledgers/step_000001.jsonl", "report.html", "metrics.jsonl.tmp")
    victims = _outside(tmp_path, *names)
    for name, victim in victims.items():
        (run / name).symlink_to(victim)
    nowhere = tmp_path / "outside" / "created"
    (run / "ledgers" / "step_000002.jsonl").symlink_to(nowhere)
    rc, _, err = run_cli(capsys, "train", "grpo", *tiny_run_overrides(tiny_model_dir, prompt_files, run))
    assert rc == 0, err
    assert {name: path.read_text() for name, path in victims.items()} == dict.fromkeys(names, PRECIOUS)
    assert not nowhere.exists()
    for name in (*names[:-1], "ledgers/step_000002.jsonl"):
        assert (run / name).is_file() and not (run / name).is_symlink(), name
    assert "<html" in (run / "report.html").read_text()[:200].lower()


@pytest.mark.parametrize("name", [".lock", "metrics.jsonl"])
def test_a_link_where_glassrl_appends_or_locks_is_refused(name, capsys, tmp_path, tiny_model_dir, prompt_files):
    run = tmp_path / "run"
    run.mkdir()
    (victim,) = _outside(tmp_path, name).values()
    (run / name).symlink_to(victim)
    argv = ["train", "grpo", *tiny_run_overrides(tiny_model_dir, prompt_files, run)]
    assert_one_error_line(capsys, argv, rf"/run/{name} is a symbolic link \(to .*outside.*\): glassrl does not write")
    assert victim.read_text() == PRECIOUS and (run / name).is_symlink()


def test_links_at_resumes_jsonl_and_the_sft_lock_are_refused(capsys, tmp_path, tiny_model_dir, prompt_files):
    run = tmp_path / "run"
    overrides = [*tiny_run_overrides(tiny_model_dir, prompt_files, run), "steps=1", "logging.report=false"]
    assert run_cli(capsys, "train", "grpo", *overrides)[0] == 0
    victims = _outside(tmp_path, "resumes.jsonl", "sft.lock")
    (run / "resumes.jsonl").symlink_to(victims["resumes.jsonl"])
    assert_one_error_line(capsys, ["train", "grpo", *overrides, "steps=2", "--resume"], r"resumes\.jsonl is a symbolic")
    (tmp_path / ".sft.lock").symlink_to(victims["sft.lock"])
    sft = ["sft", "sft", f"model={tiny_model_dir}", f"output_dir={tmp_path / 'sft'}"]
    assert_one_error_line(capsys, sft, r"\.sft\.lock is a symbolic link")
    assert [p.read_text() for p in victims.values()] == [PRECIOUS, PRECIOUS]


def _hand_made_run(path: Path) -> Path:
    """The least a run directory holds for ``glassrl report``: its config and one metrics row."""
    path.mkdir()
    (path / "config.yaml").write_text("steps: 1\n")
    (path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    return path


def test_report_html_is_replaced_whole(tmp_path):
    """A reader saw a 0-byte report.html. A `glassrl report` whose write fails midway (a file-size
    limit: EFBIG after 4 KiB) leaves the old page whole, no temp file, and one line."""
    run = _hand_made_run(tmp_path / "run")
    (run / "report.html").write_text("<html>the old report</html>")
    limited = (
        "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)); "
        "from glassrl.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run([sys.executable, "-B", "-c", limited, "report", str(run)], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert ERROR_LINE.match(line) and re.search(r"report\.html: cannot write .*File too large", line), line
    assert (run / "report.html").read_text() == "<html>the old report</html>"
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "metrics.jsonl", "report.html"]


LATIN1 = "réponse".encode("latin-1")
# id -> (how the run directory or --out is spoiled, regex of the one error line)
REPORT_FAULTS = {
    "out-unwritable": (None, ["--out", "/proc/glassrl-report.html"], r"/proc/glassrl-report\.html: cannot write"),
    "out-under-a-file": (None, ["--out", "{run}/config.yaml/report.html"], r"config\.yaml/report\.html: cannot wr"),
    "config-not-utf8": ("config.yaml", [], r"config\.yaml:2: not UTF-8 text \(byte 0xe9"),
    "metrics-not-utf8": ("metrics.jsonl", [], r"metrics\.jsonl:2: not UTF-8 text \(byte 0xe9"),
    "environment-not-utf8": ("environment.json", [], r"environment\.json:2: not UTF-8 text"),
    "run-dir-a-link-loop": ("loop", [], r"run directory .*/loop: a symbolic link loop"),
}


@pytest.mark.parametrize("fault", sorted(REPORT_FAULTS))
def test_glassrl_report_on_a_spoiled_run_directory_is_one_line(fault, capsys, tmp_path):
    spoiled, flags, match = REPORT_FAULTS[fault]
    run = _hand_made_run(tmp_path / "run")
    if spoiled == "loop":
        run = tmp_path / "loop"
        run.symlink_to(run)
    elif spoiled is not None:
        (run / spoiled).write_bytes(b'{"step": 1}\n{"x": "' + LATIN1 + b'"}\n')
    assert_one_error_line(capsys, ["report", run, *(f.replace("{run}", str(run)) for f in flags)], match)


# ---------------------------------------------------------------- resume repairs its own files


def _killed(tmp_path, tiny_model_dir, prompt_files, steps: int) -> list[str]:
    """A run checkpointed at step 1 only that logged ``steps`` steps (a ledger each) and was killed in
    the next one; returns its overrides (without ``steps``)."""
    run = tmp_path / "run"
    overrides = [*tiny_run_overrides(tiny_model_dir, prompt_files, run), "logging.report=false"]
    overrides += ["logging.checkpoint_every=100", "logging.keep_checkpoints=1"]
    preset_trainer("grpo", [*overrides, "steps=1"]).train()  # the last step is always checkpointed
    victim = preset_trainer("grpo", [*overrides, f"steps={steps + 1}"], resume=True)
    victim.sinks.sinks.append(KillAt(steps + 1))
    with pytest.raises(Killed):
        victim.train()
    return overrides


def test_a_bad_line_in_metrics_jsonl_does_not_block_a_resume(capsys, tmp_path, tiny_model_dir, prompt_files):
    """One bad line (not JSON, JSON but no step, not UTF-8) stopped --resume with a traceback; the
    resume now rewrites the log to the checkpoint's step, dropping what it cannot read, and says so."""
    overrides = _killed(tmp_path, tiny_model_dir, prompt_files, steps=2)
    metrics = tmp_path / "run" / "metrics.jsonl"
    lines = metrics.read_bytes().splitlines(keepends=True)  # eval at 0, steps 1 to 3 (killed in 3)
    assert [json.loads(line)["step"] for line in lines] == [0, 1, 2, 3]
    for bad in (b"{not json\n", b'["no step"]\n', b'{"step": "1"}\n', b'{"step": 1, "x": "\xe9"}\n'):
        metrics.write_bytes(b"".join([lines[0], bad, *lines[1:]]))
        rc, out, err = run_cli(capsys, "train", "grpo", *overrides, "steps=2", "--resume")
        assert rc == 0, err
        assert "metrics.jsonl: line 2 was not a metrics row; dropped" in out
        assert [row["step"] for row in strict_jsonl(metrics)] == [0, 1, 2]


def test_a_resume_removes_the_ledgers_of_steps_after_its_checkpoint(capsys, tmp_path, tiny_model_dir, prompt_files):
    """A run that wrote ledgers up to step 3, checkpointed at step 1 and was killed, resumed with
    steps=2: the ledger of step 3 belongs to no step of the resumed run and is removed."""
    overrides = _killed(tmp_path, tiny_model_dir, prompt_files, steps=3)
    ledgers = tmp_path / "run" / "ledgers"
    assert sorted(p.name for p in ledgers.iterdir()) == [f"step_00000{i}.jsonl" for i in (1, 2, 3)]
    rc, _, err = run_cli(capsys, "train", "grpo", *overrides, "steps=2", "--resume")
    assert rc == 0, err
    assert sorted(p.name for p in ledgers.iterdir()) == ["step_000001.jsonl", "step_000002.jsonl"]
    assert [row["step"] for row in strict_jsonl(tmp_path / "run" / "metrics.jsonl")] == [0, 1, 2]


def test_the_research_judge_log_is_never_appended_through_a_link(tmp_path):
    """The research rubric's judge log was appended through a symbolic link (issue 37, low): a link there
    when the reward is built, or put there while it runs, is refused; the file it points to is untouched."""
    from glassrl.data.records import PromptRecord
    from glassrl.errors import GlassrlError
    from glassrl.rewards import RewardRequest, RewardResult
    from glassrl.rewards.research import CriterionJudge
    from helpers import FixedResults

    request = RewardRequest(prompt="p", response="r", record=PromptRecord("p"))

    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("mine\n")
    log = tmp_path / "judge.jsonl"
    log.symlink_to(elsewhere)
    source = FixedResults({"r": RewardResult.ok(1.0, details={"judge_text": "yes"})})
    with pytest.raises(GlassrlError, match=r"judge\.jsonl"):
        CriterionJudge("temporal", source, log)
    log.unlink()
    judge = CriterionJudge("temporal", source, log)
    judge.score([request])
    assert len(log.read_text().splitlines()) == 1
    log.unlink()
    log.symlink_to(elsewhere)
    with pytest.raises(GlassrlError, match=r"judge\.jsonl"):
        judge.score([request])
    assert elsewhere.read_text() == "mine\n"
