"""`glassrl explain --model`: the numbers are the models' and the trainer's, and bad input names its flag.

Two one-step runs of the tiny default-format model (tests/rl/conftest.py): PPO (critic, KL in
the reward, adaptive β) and GRPO (group advantages, KL in the loss). Each explained number is
recomputed here directly with glassrl.models and glassrl.algos.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from glassrl import cli
from glassrl.rl.explain import prompt_record
from helpers import flat_ledger_rows

ROOT = Path(__file__).resolve().parents[2]

PROMPT, RESPONSE = "请问1+1=2？", "是的，等于2！"


def _train(preset: str, out: Path, model: Path, prompts: tuple[Path, Path]) -> Path:
    from glassrl.config import load_config
    from glassrl.rl.config import TrainConfig
    from glassrl.rl.loop import Trainer

    train, test = prompts
    overrides = [
        f"model.actor={model}",
        f"data.train={train}",
        f"data.test={test}",
        "data.eval_size=0",
        f"output_dir={out}",
        "steps=1",
        "rollout.n=4",
        "batch.prompts_per_step=2",
        "batch.mini_batch_prompts=2",
        "batch.micro_batch_responses=8",
        "logging.ledger_every=0",
    ]
    Trainer(load_config(TrainConfig, ROOT / "examples" / f"{preset}.yaml", overrides), progress=False).train()
    return out


@pytest.fixture(scope="module")
def ppo_run(tiny_model_dir, prompt_files, tmp_path_factory) -> Path:
    return _train("ppo", tmp_path_factory.mktemp("explain_ppo") / "run", tiny_model_dir, prompt_files)


@pytest.fixture(scope="module")
def grpo_run(tiny_model_dir, prompt_files, tmp_path_factory) -> Path:
    return _train("grpo", tmp_path_factory.mktemp("explain_grpo") / "run", tiny_model_dir, prompt_files)


def explain_rows(capsys, *argv: str) -> list[dict]:
    assert cli.main(["explain", *argv, "--format", "jsonl"]) == 0
    return flat_ledger_rows(capsys.readouterr().out)


def error(capsys, *argv: str) -> str:
    """Run explain expecting a user error: exit 2, one line on stderr; return the message."""
    assert cli.main(["explain", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.removeprefix("glassrl explain: error: ").strip()


def direct(model_dir: Path, prompt: str, response: str, temperature: float = 1.0):
    """(token ids, log π of the response tokens) computed here, without glassrl's trainer."""
    from glassrl.data.formatting import format_prompt
    from glassrl.models import load_causal_lm, load_tokenizer, response_logprobs

    tokenizer = load_tokenizer(model_dir)
    prompt_ids = format_prompt(tokenizer, prompt)
    ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    input_ids = torch.tensor([prompt_ids + ids])
    model = load_causal_lm(model_dir, device="cpu")
    with torch.no_grad():
        lp, _ = response_logprobs(
            model, input_ids, torch.ones_like(input_ids, dtype=torch.bool), len(ids), temperature=temperature
        )
    return ids, input_ids, lp[0]


def col(rows: list[dict], name: str, b: int = 0) -> list:
    return [r[name] for r in rows if r["response_index"] == b]


# ---------------------------------------------------------------- PPO: critic, KL in the reward


def test_ppo_ledger_equals_direct_computation(ppo_run, tiny_model_dir, capsys):
    from glassrl.algos.advantages import AdvantageInputs, AdvantageParams, compute_advantages
    from glassrl.algos.kl import kl_penalty
    from glassrl.algos.masked import masked_whiten
    from glassrl.models import load_scalar_model, response_values

    rows = explain_rows(capsys, "--model", str(ppo_run), "--prompt", PROMPT, "--response", RESPONSE)
    checkpoint = ppo_run / "checkpoints" / (ppo_run / "checkpoints" / "latest").read_text().strip()
    ids, input_ids, lp = direct(checkpoint / "actor", PROMPT, RESPONSE)
    _, _, ref = direct(tiny_model_dir, PROMPT, RESPONSE)  # the run's reference: its initial actor
    T = len(ids)
    assert col(rows, "token_id") == ids and ids[-1] == rows[-1]["token_id"]  # the response, then EOS
    assert col(rows, "logprobs") == pytest.approx(lp.tolist(), abs=1e-5)
    assert col(rows, "ref_logprobs") == pytest.approx(ref.tolist(), abs=1e-5)
    kl = kl_penalty(lp, ref, "k1")  # examples/ppo.yaml: algo.kl.kind = k1
    assert col(rows, "kl") == pytest.approx(kl.tolist(), abs=1e-5)
    assert not torch.allclose(lp, ref)  # one PPO step moved the policy: the KL is not trivially 0
    critic = load_scalar_model(checkpoint / "critic", head="value-head", device="cpu")
    with torch.no_grad():
        values = response_values(critic, input_ids, torch.ones_like(input_ids, dtype=torch.bool), T)[0]
    assert col(rows, "values") == pytest.approx(values.tolist(), abs=1e-5)

    # 1+1=2 is true and the response says so with the right sum: score 1, on the last token (EOS).
    beta = json.loads((checkpoint / "kl_controller.json").read_text())["value"]
    assert rows[0]["beta"] == pytest.approx(beta) and rows[0]["score"] == 1.0
    assert col(rows, "token_scores") == [0.0] * (T - 1) + [1.0]
    rewards = torch.tensor([0.0] * (T - 1) + [1.0]) - beta * kl
    assert col(rows, "token_rewards") == pytest.approx(rewards.tolist(), abs=1e-5)
    mask = torch.ones(1, T, dtype=torch.bool)
    out = compute_advantages(
        "gae",
        AdvantageInputs(token_rewards=rewards[None], response_mask=mask, values=values[None]),
        AdvantageParams(gamma=1.0, lam=0.95),
    )
    assert col(rows, "advantages") == pytest.approx(out.advantages[0].tolist(), abs=1e-5)
    for row in rows:  # R = A + V with the raw A (DESIGN §1)
        assert row["returns"] == pytest.approx(row["advantages"] + row["values"], abs=1e-5)
    assert col(rows, "whitened_advantages") == pytest.approx(masked_whiten(out.advantages, mask)[0].tolist(), abs=1e-4)
    assert rows[0]["step"] == 1 and rows[0]["estimator"] == "gae" and rows[0]["finish_reason"] == "stop"


def test_flags_override_the_run(ppo_run, capsys):
    td = explain_rows(
        capsys,
        "--model",
        str(ppo_run),
        "--prompt",
        PROMPT,
        "--response",
        RESPONSE,
        "--lam",
        "0",
        "--beta",
        "0.5",
        "--no-whiten",
    )
    assert col(td, "advantages") == pytest.approx(col(td, "deltas"), abs=1e-6)  # λ = 0: A = δ
    for row in td:
        assert row["token_rewards"] == pytest.approx(row["token_scores"] - 0.5 * row["kl"], abs=1e-6)
        assert row["whitened_advantages"] is None


def test_table_has_the_run_header_and_legend(ppo_run, capsys):
    assert cli.main(["explain", "--model", str(ppo_run), "--prompt", PROMPT, "--response", RESPONSE]) == 0
    out = capsys.readouterr().out
    assert f"run {ppo_run} · checkpoint step_00000001 (step 1)" in out
    assert "δ_0 = r_0 + γ·V(s_1) − V(s_0)" in out and "<|eos|>" in out


def test_a_checkpoint_directory_is_accepted(ppo_run, capsys):
    from_run = explain_rows(capsys, "--model", str(ppo_run), "--prompt", PROMPT, "--response", RESPONSE)
    step = ppo_run / "checkpoints" / "step_00000001"
    assert explain_rows(capsys, "--model", str(step), "--prompt", PROMPT, "--response", RESPONSE) == from_run


# ---------------------------------------------------------------- GRPO: a group of given + sampled responses


def test_grpo_group_of_given_and_sampled_responses(grpo_run, tiny_model_dir, capsys):
    from glassrl.algos.kl import kl_penalty

    argv = ["--model", str(grpo_run), "--prompt", PROMPT, "--response", RESPONSE, "--sample", "3", "--seed", "7"]
    rows = explain_rows(capsys, *argv)
    assert explain_rows(capsys, *argv) == rows  # seeded sampling: the same responses and numbers
    assert {r["response_index"] for r in rows} == {0, 1, 2, 3} and {r["group_id"] for r in rows} == {0}
    scores = [col(rows, "score", b)[0] for b in range(4)]
    mean, std = statistics.fmean(scores), statistics.stdev(scores)
    for b in range(4):  # GRPO (Shao et al. 2024, §4.1.2): one standardised score per response
        expected = (scores[b] - mean) / (std + 1e-6)
        assert col(rows, "advantages", b) == pytest.approx([expected] * len(col(rows, "advantages", b)), abs=1e-5)
    # KL is in the loss (examples/grpo.yaml): it is shown, k3, and not in the token rewards (β = 0).
    _, _, lp = direct(grpo_run / "checkpoints" / "step_00000001" / "actor", PROMPT, RESPONSE)
    _, _, ref = direct(tiny_model_dir, PROMPT, RESPONSE)
    assert col(rows, "kl") == pytest.approx(kl_penalty(lp, ref, "k3").tolist(), abs=1e-5)
    assert rows[0]["beta"] == 0 and col(rows, "token_rewards") == col(rows, "token_scores")
    assert col(rows, "response", 0)[0] == RESPONSE and col(rows, "finish_reason", 0)[0] == "stop"


def test_plain_model_reference_is_itself(tiny_model_dir, capsys):
    rows = explain_rows(
        capsys,
        "--model",
        str(tiny_model_dir),
        "--prompt",
        "请问1+1=3？",
        "--response",
        "不是，等于2！",
        "--sample",
        "1",
        "--estimator",
        "rloo",
    )
    assert {r["kl"] for r in rows} == {0.0}  # π_ref = π: every log-ratio is exactly 0
    assert col(rows, "score", 0)[0] == 1.0  # 1+1=3 is false, the response says so with the right sum
    s0, s1 = col(rows, "score", 0)[0], col(rows, "score", 1)[0]
    assert col(rows, "advantages", 0)[0] == pytest.approx(s0 - s1)  # RLOO: baseline = the other's score


def test_answer_scores_a_free_prompt(tiny_model_dir, capsys):
    rows = explain_rows(
        capsys,
        "--model",
        str(tiny_model_dir),
        "--prompt",
        "1+1",
        "--response",
        "2",
        "--answer",
        "2",
        "--reward",
        "exact_match",
        "--estimator",
        "reinforce_pp",
    )
    assert rows[0]["score"] == 1.0


def test_a_plain_model_explains_with_defaults_that_follow_it(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """issue 31, item 8: a user's own model took three failures (gae without a critic, --sample
    demanded, the bundled task's reward with a hint to pass the --answer that was passed)."""
    free = ["--model", str(tiny_model_dir), "--prompt", "Natalia sold 48 clips. How many?"]
    rows = explain_rows(capsys, *free, "--response", "#### 72", "--answer", "72")
    assert {r["estimator"] for r in rows} == {"reinforce_pp"} and rows[0]["score"] == 1.0  # math, against --answer
    monkeypatch.chdir(tmp_path)  # --reward file.py:fn is read from the working directory, beside its helper
    (tmp_path / "glassrl_test_helper_31.py").write_text("def value(text):\n    return float('72' in text)\n")
    (tmp_path / "my_reward.py").write_text(
        "from glassrl_test_helper_31 import value\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return value(solution_str)\n"
    )
    rows = explain_rows(capsys, *free, "--response", "72", "--sample", "1", "--reward", "my_reward.py:compute_score")
    assert {r["estimator"] for r in rows} == {"grpo"} and col(rows, "score", 0)[0] == 1.0
    assert error(capsys, *free, "--response", "72", "--answer", "72", "--reward", "arith_verify").endswith(
        "; choose a reward that can score it with --reward NAME or --reward file.py:fn"
    )  # not "--answer TEXT": it was given
    assert error(capsys, *free, "--response", "72").endswith("give a prompt in a bundled task's form, or --answer TEXT")
    assert error(capsys, *free, "--response", "72", "--reward", "missing.py:f").startswith(
        f"--reward 'missing.py:f': no file {tmp_path / 'missing.py'}"
    )


def test_prompt_record_parses_the_task_forms():
    zh = prompt_record("请问1+1=3？", None)
    assert zh.answer == "不是，等于2！" and zh.metadata["is_true"] is False and zh.metadata["sum"] == 2
    en = prompt_record("Is 40+2=42?", None)
    assert en.answer == "Yes, it equals 42!" and en.metadata["lang"] == "en"
    assert prompt_record("3+4=", None).answer == "7"
    free = prompt_record("hello", "world")
    assert free.answer == "world" and free.metadata == {}


# ---------------------------------------------------------------- errors name the flag


def test_errors_name_the_flag(ppo_run, grpo_run, tiny_model_dir, tmp_path, capsys):
    base = ["--prompt", PROMPT, "--response", RESPONSE]
    nope = tmp_path / "nope"
    assert error(capsys, "--model", str(nope), *base).startswith(f"--model: {nope} is neither")
    (tmp_path / "empty_run").mkdir()
    (tmp_path / "empty_run" / "config.yaml").write_text("steps: 1\n")
    assert error(capsys, "--model", str(tmp_path / "empty_run"), *base).startswith(
        f"--model: run directory {tmp_path / 'empty_run'} has no checkpoint yet"
    )
    assert error(capsys, "--model", str(grpo_run), *base) == (
        "--sample: estimator grpo compares the responses to one prompt and needs at least 2, got 1 (add --sample N)"
    )
    assert error(capsys, "--model", str(grpo_run), *base, "--estimator", "gae").startswith(
        f"--estimator: gae needs a critic's values, and run {grpo_run} · checkpoint step_00000001 has no critic; "
        "use a critic-free estimator: grpo"
    )
    # issue 31, item 8: a plain model's default estimator is critic-free (was: "gae needs a critic's values")
    assert error(capsys, "--model", str(tiny_model_dir), *base, "--estimator", "gae").startswith(
        "--estimator: gae needs a critic's values"
    )
    assert error(capsys, "--model", str(grpo_run), *base, "--sample", "3", "--beta", "0.1").startswith("--beta: ")
    assert error(capsys, "--model", str(ppo_run), *base, "--sample", "0") == (
        "--sample: expected a number of responses >= 1, got 0"
    )
    assert error(capsys, "--model", str(ppo_run), *base, "--sample", "x") == "--sample: expected an integer, got 'x'"
    assert error(capsys, "--model", str(ppo_run), *base, "--lam", "2") == "--lam: must be in [0, 1], got 2"
    assert error(capsys, "--model", str(ppo_run), "--prompt", PROMPT).startswith("--response: missing")
    assert error(capsys, "--model", str(ppo_run), "--response", RESPONSE).startswith("--prompt: missing")
    assert error(capsys, "--model", str(ppo_run), "--prompt", "hello", "--response", "x") == (
        "--prompt: the reward could not score response 0 (error: arith_verify: 'hello': arith_verify needs metadata "
        "'is_true'); give a prompt in a bundled task's form, or --answer TEXT"
    )
    assert error(capsys, "--model", str(ppo_run), *base, "--values", "0").startswith(
        "--values: cannot be combined with --model"
    )
    assert error(capsys, *base, "--sample", "2") == "--sample: needs --model (a model that computes the numbers)"
    assert error(capsys, "--model", str(ppo_run), *base, "--reward", "nope").startswith(
        "--reward: unknown reward source 'nope'; valid: exact_match"
    )
