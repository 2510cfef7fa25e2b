"""The reward red-team (glassrl.diagnose.reward_redteam, `glassrl audit --reward`): ten planted reward bugs,
each a reward function a user could write, are found; a correct reward and the bundled verifiers pass."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from glassrl.data.tasks import load_task
from glassrl.diagnose.reward_redteam import MUTATIONS, Sample, red_team
from glassrl.rewards import build_combined
from glassrl.rl.audit import TaskGold

BUGS = textwrap.dedent(
    '''
    import re

    def _numbers(text):
        return re.findall(r"-?\\d+", text)

    def correct(prompt, response, answer, metadata):          # the control: arith-verify's own rule, by hand
        m = re.fullmatch(r"(是的|不是)，等于(\\d+)！|(Yes|No), it equals (\\d+)!", response.strip())
        if not m:
            return 0.0
        verdict = (m.group(1) or m.group(3)) in ("是的", "Yes")
        return float(verdict == metadata["is_true"] and int(m.group(2) or m.group(4)) == metadata["sum"])

    def format_pays(prompt, response, answer, metadata):      # pays the punctuation of the format
        return float(("，" in response and "！" in response) or ("," in response and "!" in response))

    def substring(prompt, response, answer, metadata):        # "the answer appears somewhere"
        return float(str(metadata["sum"]) in response)

    def length_pays(prompt, response, answer, metadata):      # longer looks more thorough
        return min(1.0, len(response) / 40)

    def no_number_pays(prompt, response, answer, metadata):   # nothing to check counts as right
        numbers = _numbers(response)
        return float(not numbers or numbers[-1] == str(metadata["sum"]))

    def exception_pays(prompt, response, answer, metadata):   # a parse failure returns full marks
        try:
            return float(int(re.split("等于|equals", response)[1].strip(" ！!")) == metadata["sum"])
        except Exception:
            return 1.0

    def verdict_only(prompt, response, answer, metadata):     # checks the yes/no, never the number
        yes = response.startswith(("是", "Yes"))
        return float(yes == metadata["is_true"] and response[:1] in "是不YN")

    def tolerance(prompt, response, answer, metadata):        # an off-by-one tolerance on the sum
        numbers = _numbers(response)
        return float(bool(numbers) and abs(int(numbers[-1]) - metadata["sum"]) <= 1)

    def repeat_pays(prompt, response, answer, metadata):      # counts the answer's occurrences
        return min(1.0, response.count(str(metadata["sum"])) / 2)

    def prompt_echo(prompt, response, answer, metadata):      # "relevance": the question's numbers
        return float(f"{metadata['a']}+{metadata['b']}" in response or str(metadata["sum"]) in response)

    def first_number(prompt, response, answer, metadata):     # reads the first number, not the last
        numbers = _numbers(response)
        return float(bool(numbers) and numbers[0] == str(metadata["sum"]))
    '''
)
PLANTED = [
    "format_pays",
    "substring",
    "length_pays",
    "no_number_pays",
    "exception_pays",
    "verdict_only",
    "tolerance",
    "repeat_pays",
    "prompt_echo",
    "first_number",
]


@pytest.fixture(scope="module")
def samples():
    """The reference answers of 24 arith-verify prompts (both languages, true and false claims)."""
    return [Sample(r.prompt, r.answer, r) for r in load_task("arith-verify", "train", size=24)]


@pytest.fixture(scope="module")
def bugs(tmp_path_factory):
    path = tmp_path_factory.mktemp("bugs") / "bugs.py"
    path.write_text(BUGS, encoding="utf-8")
    return path


def _source(bugs, name):
    return build_combined([{"name": "user_function", "spec": f"{bugs}:{name}"}])


def test_ten_planted_reward_bugs_are_found_and_the_control_passes(bugs, samples):
    found = {}
    for name in PLANTED:
        report = red_team(_source(bugs, name), TaskGold(), samples)
        found[name] = [row.name for row in report.rows if row.failed]
    missed = [name for name, failed in found.items() if not failed]
    assert len(missed) <= 1, f"missed: {missed}; found: {found}"
    control = red_team(_source(bugs, "correct"), TaskGold(), samples)
    assert control.ok, "\n".join(control.table())


def test_each_bug_is_caught_by_the_mutation_that_exposes_it(bugs, samples):
    expected = {
        "format_pays": "format_only",
        "substring": "hedge",
        "length_pays": "padding",
        "no_number_pays": "empty",
        "exception_pays": "garbage",
        "verdict_only": "wrong_answer",
        "tolerance": "wrong_answer",
        "repeat_pays": "repeat",
        "prompt_echo": "prompt_copy",
        "first_number": "hedge",
    }
    for name, mutation in expected.items():
        failed = [row.name for row in red_team(_source(bugs, name), TaskGold(), samples).rows if row.failed]
        assert mutation in failed, (name, failed)


@pytest.mark.parametrize("task,source", [("arith-verify", "arith_verify"), ("add", "numeric"), ("add", "exact_match")])
def test_the_bundled_verifiers_pass(task, source):
    records = load_task(task, "train", size=16)
    report = red_team(build_combined([{"name": source}]), TaskGold(), [Sample(r.prompt, r.answer, r) for r in records])
    assert report.ok, "\n".join(report.table())


def test_the_table_names_sources_and_criteria_and_the_mutations(samples):
    reward = build_combined([{"name": "arith_verify"}])
    table = red_team(reward, TaskGold(), samples).table()
    assert table[0] == "mutations of the reference answers:"
    assert table[1].split()[:5] == ["mutation", "expects", "n", "reward", "arith_verify"]
    assert [line.split()[0] for line in table[2:-1]] == ["original", *MUTATIONS]
    assert table[-1] == "no mutation earned what it should not"


def test_glassrl_audit_reward_exits_1_naming_what_pays(bugs, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "data:\n  train: task:arith-verify\nreward:\n  sources:\n"
        f"    - {{name: user_function, spec: '{bugs}:format_pays'}}\n",
        encoding="utf-8",
    )
    cli = [sys.executable, "-m", "glassrl.cli", "audit", "--reward", str(config), "--samples", "12"]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "reward pays for nothing: format_only" in done.stdout
    assert "gold: task-verifier" in done.stderr
    fine = subprocess.run(
        [*cli[:-2], "--samples", "12", "reward.sources=[{name: arith_verify}]"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert fine.returncode == 0 and "no mutation earned what it should not" in fine.stdout, fine.stdout + fine.stderr


def test_the_policys_own_best_paid_responses_are_judged_by_the_gold(bugs, fast, tmp_path):
    """--run: the responses a run's policy sampled (its ledgers), best-paid first, judged themselves — a reward
    paying length pays the tiny model's long wrong answers; the task's own rule pays none of them."""
    from tests.helpers import EXAMPLES, preset_trainer

    from glassrl.config import load_config
    from glassrl.rl.audit import red_team_config
    from glassrl.rl.config import TrainConfig

    run = tmp_path / "run"
    task = ["data.train=task:arith-verify", "data.test=task:arith-verify/test"]
    preset_trainer("grpo", [*fast, f"output_dir={run}", *task]).train()

    def reports(name):
        source = f"reward.sources=[{{name: user_function, spec: '{bugs}:{name}'}}]"
        if name == "arith_verify":
            source = "reward.sources=[{name: arith_verify}]"
        cfg = load_config(TrainConfig, EXAMPLES / "grpo.yaml", [*fast, *task, source])
        return red_team_config(cfg, samples=12, run=run, top=8)

    paid = reports("length_pays")[1]
    assert not paid.ok and paid.rows[0].failed, "\n".join(paid.table())
    assert paid.rows[0].n == 8 and paid.rows[0].gold_correct < 1.0
    assert paid.found and all(line.startswith("reward ") for line in paid.found)
    assert "paid, wrong by the gold: reward" in "\n".join(paid.table())
    # the hand-written `correct` rule forgets the language: the policy's Chinese answer to an English question
    # is paid, and the gold (the task's verifier: "in the question's language") calls it wrong — found
    found = reports("correct")[1].found
    assert found and all("'Is " in line and "等于" in line for line in found), found
    fine = reports("arith_verify")[1]
    assert fine.ok, "\n".join(fine.table())


# What the red-team finds in each RL example's own reward (docs/debugging.md, "The bundled rewards"): the
# research rubric pays a report with the wrong figure 1.5 of 2.5 — its temporal (1.0) and citation (0.5)
# criteria still pass; only accuracy (1.0) reads the figure — more like a right report than a wrong one
KNOWN_GAPS = {"research_grpo": {"wrong_answer", "hedge"}, "research_ppo": {"wrong_answer", "hedge"}}
LABEL_FREE = {"ttrl"}  # majority vote: no reference answer to mutate (red-team its runs with --run instead)


def _rl_examples():
    from tests.helpers import EXAMPLES

    supervised = {"bco", "cpo", "dpo", "kto", "orpo", "rm", "sft"}
    return sorted(p.stem for p in EXAMPLES.glob("*.yaml") if p.stem not in supervised | LABEL_FREE)


@pytest.mark.parametrize("example", _rl_examples())
def test_each_rl_examples_reward_passes_or_its_gap_is_documented(example):
    from tests.helpers import EXAMPLES

    from glassrl.config import load_config
    from glassrl.rl.audit import red_team_config
    from glassrl.rl.config import TrainConfig

    cfg = load_config(TrainConfig, EXAMPLES / f"{example}.yaml", [])
    (report,) = red_team_config(cfg, samples=12)
    failed = {row.name for row in report.rows if row.failed}
    assert failed == KNOWN_GAPS.get(example, set()), "\n".join(report.table())
