"""Asynchronous training (``rollout.max_staleness`` ≥ 1) with the vLLM engine (`make test-vllm`).

Locally (max_staleness 1, glassrl.workers.overlap) the copy of the policy that samples ahead is
followed by the run's one vLLM engine (VLLMRolloutEngine.following); on Ray the rollout rank's
engine follows the rank's model, into which each batch's version is loaded (StagedWeights). Either
way every sync is verified (the probe), each token records the version that sampled it, and the
off-policy correction reads vLLM's own log-probs as log μ. What shows it, on every token the runs
trained on (the ledgers hold every response):

- the version: staleness and policy_version as the schedule says;
- vLLM sampled with that version's weights: log μ (vLLM's) equals the log-probs of the policy that
  sampled (locally the copy's recomputation, π_old; on Ray π_old itself where the lag is 0), while
  a lagged token's log μ differs from the current π_old (each update moves them: lr 0.01);
- the correction's weights are exp(log π_old − log μ) of those very numbers (token_tis, cap 100).
"""

from __future__ import annotations

import json
import math

import pytest

from glassrl.builtin.default_model import build_default_model
from glassrl.ledger import read_jsonl
from glassrl.models.default_model import DefaultModelSpec
from helpers import RAY_ROLLOUT_APART, TINY_SPEC, preset_trainer, tiny_run_overrides

pytestmark = pytest.mark.vllm

CORRECTION = "algo.off_policy={correction: token_tis, cap: 100}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm-async") / "model"  # heads of 32: vLLM's CPU attention takes no head of 16
    build_default_model(out, seed=0, spec=DefaultModelSpec(**{**TINY_SPEC, "hidden_size": 64}))
    return out


def _overrides(model_dir, prompt_files, out, k: int, *more: str) -> list[str]:
    return [
        *tiny_run_overrides(model_dir, prompt_files, out),
        "rollout.engine=vllm",
        f"rollout.max_staleness={k}",
        CORRECTION,
        "logging.report=false",
        "logging.ledger_samples=16",  # every response of a step
        "actor_optim.lr=0.01",  # each update moves what is sampled next
        "actor_optim.warmup_steps=0",
        *more,
    ]


def _tokens(out):
    """(step, token) for every generated token the run trained on."""
    for step, path in enumerate(sorted((out / "ledgers").glob("step_*.jsonl")), start=1):
        for response in read_jsonl(path).responses:
            for token in response.tokens:
                if token.policy_version is not None:
                    yield step, token


def _check_correction_reads_vllm(token) -> None:
    assert token.rollout_logprobs is not None
    rho = math.exp(token.logprobs - token.rollout_logprobs)
    assert token.is_weights == pytest.approx(min(rho, 100.0), rel=1e-4)


def test_sampling_ahead_locally_with_vllm(model_dir, prompt_files, tmp_path):
    out = tmp_path / "run"
    trainer = preset_trainer("grpo", _overrides(model_dir, prompt_files, out, 1, "steps=3"))
    assert trainer.paths["rollout"].startswith("vLLM 0.32.0 on cpu")
    assert trainer.paths["rollout"].endswith(
        "; asynchronous: 1 version behind, a copy of the policy sampling in a thread"
    )
    trainer.train()
    copy_engine = trainer.workers.rollout.engine
    assert copy_engine.llm is trainer.workers.rollout.live.engine.llm  # one vLLM engine, one KV cache
    assert copy_engine.syncs == 3 and copy_engine.last_sync.moved > 0  # a verified sync per round, each moved
    seen = set()
    for step, token in _tokens(out):
        lag = 0 if step == 1 else 1  # rounds 2 and 3 were requested before the update that trains on them
        assert (token.staleness, token.policy_version) == (lag, step - 1 - lag)
        # π_old here is the sampling copy's own recomputation: vLLM's μ is that policy's
        assert abs(token.logprobs - token.rollout_logprobs) < 1e-3
        _check_correction_reads_vllm(token)
        seen.add(step)
    assert seen == {1, 2, 3}


# LoRA: the rank receives the adapters alone and syncs the adapter alone into vLLM, a new LoRARequest per
# version, each verified (glassrl.rollout.vllm); ranks 4 adapters over lr 0.01 move μ as the full weights do
LORA = ["model.lora.r=4", "model.lora.alpha=8"]


@pytest.mark.parametrize("lora", [[], LORA], ids=["full", "lora"])
def test_sampling_ahead_on_ray_with_vllm(lora, local_ray, model_dir, prompt_files, tmp_path):
    if lora:
        pytest.importorskip("peft")
    out = tmp_path / "run"
    overrides = _overrides(model_dir, prompt_files, out, 2, "steps=4", *RAY_ROLLOUT_APART, *lora)
    trainer = preset_trainer("grpo", overrides)
    assert trainer.paths["rollout"].startswith("vLLM 0.32.0 on cpu")
    assert "asynchronous: up to 2 versions behind" in trainer.paths["rollout"]
    assert ("weights: the LoRA adapter alone" in trainer.paths["rollout"]) == bool(lora)
    trainer.train()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # the rank's sync checks, as many with the adapter alone as with the full weights, none breached (its
    # vLLM engine verifies each load besides: a sync that did not land stops the run)
    checks = {m["step"]: m["sync/checks"] for m in rows if "sync/checks" in m}
    assert checks == {1: 1, 4: 2} and not any(m.get("sync/breaches") for m in rows), checks
    lagged = []
    for step, token in _tokens(out):
        lag = min(2, step - 1)  # the rounds were requested at versions 0, 0, 0, 1
        assert (token.staleness, token.policy_version) == (lag, step - 1 - lag)
        if lag == 0:  # sampled by the weights that compute log π_old: vLLM's μ is π_old
            assert abs(token.logprobs - token.rollout_logprobs) < 1e-3
        else:
            lagged.append(abs(token.logprobs - token.rollout_logprobs))
        _check_correction_reads_vllm(token)
    assert lagged and max(lagged) > 1e-2  # μ is the older version's, not the current weights'
