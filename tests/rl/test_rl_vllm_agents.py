"""Multi-turn tool episodes sampled by vLLM (glassrl.agents.vllm_turns, `make test-vllm`).

- The loop with vLLM's turn sampler writes the episodes the HF sampler writes where the sampler's
  RNG plays no part: greedy decoding (argmax), the same prompts, the same environment — the same
  tokens, turns, roles, finish reasons and rewards. With temperature > 0 the tokens differ (vLLM's
  sampler draws from its own RNG; the seed is the same), so only greedy can be compared token by token.
- A GRPO run of the tool-add preset with ``rollout.engine=vllm``: observation tokens stay out of
  every loss (no advantage, no mask), each generated token carries vLLM's log μ, equal to the
  trainer's log π_old (the weights synced and verified before each rollout), rewards in range.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from glassrl.agents import AgentRolloutEngine, HFTurnSampler
from glassrl.agents.vllm_turns import VLLMTurnSampler
from glassrl.builtin.default_model import build_default_model
from glassrl.data.records import PromptRecord
from glassrl.ledger import read_jsonl
from glassrl.models import load_causal_lm, load_tokenizer
from glassrl.models.default_model import DefaultModelSpec
from glassrl.rollout.base import SamplingParams
from glassrl.rollout.vllm import VLLMRolloutEngine
from helpers import TINY_SPEC, preset_trainer

pytestmark = pytest.mark.vllm

AGENT_ENV = Path(__file__).resolve().parent / "agentic_env.py"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm-agents") / "model"  # heads of 32: vLLM's CPU attention takes no head of 16
    build_default_model(out, seed=0, spec=DefaultModelSpec(**{**TINY_SPEC, "hidden_size": 64}))
    return out


def _retry():
    from agentic_env import Retry  # tests/rl is on the path of this module's tests

    return Retry()


def test_greedy_episodes_are_the_hf_loops(model_dir):
    model, tokenizer = load_causal_lm(model_dir, dtype="float32", device="cpu"), load_tokenizer(model_dir)
    engine = VLLMRolloutEngine.colocated(model, tokenizer, gpu_memory_utilization=0.4, sleep=False, seed=0)
    records = [
        PromptRecord(f"{a}+{b}=?", str(a + b), {"sum": a + b}, f"t#{i}")
        for i, (a, b) in enumerate([(3, 4), (12, 30), (7, 7)])
    ]
    params = SamplingParams(max_new_tokens=40, greedy=True)
    batches = {}
    for name, sampler in {"hf": HFTurnSampler(model, tokenizer), "vllm": VLLMTurnSampler(engine)}.items():
        loop = AgentRolloutEngine(
            sampler, tokenizer, _retry, call_format="tagged", describe_tools=False, max_turns=3, sampling_logprobs=True
        )
        prompts = loop.format_prompts(records)
        batches[name] = loop.generate(
            prompts, n=2, params=params, generator=torch.Generator().manual_seed(0), records=records
        )
    hf, vllm = batches["hf"], batches["vllm"]
    assert engine.syncs == 1 and engine.last_sync.max_diff <= 1e-3
    assert "each turn by vLLM 0.32.0 on cpu" in AgentRolloutEngine(VLLMTurnSampler(engine), tokenizer, _retry).path
    assert (vllm.response_ids == hf.response_ids).all() and (vllm.response_mask == hf.response_mask).all()
    assert torch.equal(vllm.response_context_mask, hf.response_context_mask)  # generated and observation tokens
    assert vllm.finish_reasons == hf.finish_reasons and vllm.texts == hf.texts
    assert [[(t.start, t.end, t.finish_reason, t.text) for t in turns] for turns in vllm.turns] == [
        [(t.start, t.end, t.finish_reason, t.text) for t in turns] for turns in hf.turns
    ]
    assert (vllm.response_context_mask & ~vllm.response_mask).any()  # Retry answered: observation tokens, masked
    mask = vllm.response_mask
    assert (vllm.rollout_logprobs[mask] - hf.rollout_logprobs[mask]).abs().max() < 1e-3


def test_a_tool_episode_run_on_vllm(model_dir, tmp_path):
    out = tmp_path / "run"
    overrides = [
        f"model.actor={model_dir}",
        "data.eval_size=4",
        f"output_dir={out}",
        "steps=2",
        "rollout.n=2",
        "rollout.max_new_tokens=40",  # the tiny model's 64 positions
        "rollout.engine=vllm",
        f"rollout.agent.environment={AGENT_ENV}:Retry",  # one observation after the first turn
        "batch.prompts_per_step=4",
        "batch.mini_batch_prompts=4",
        "batch.micro_batch_responses=4",
        "actor_optim.lr=0.01",
        "actor_optim.warmup_steps=0",
        "logging.eval_group_by=null",
        "logging.report=false",
        "logging.ledger_every=1",
        "logging.ledger_samples=8",
        "logging.checkpoint_every=0",
    ]
    trainer = preset_trainer("tool_add", overrides)
    assert "each turn by vLLM 0.32.0 on cpu" in trainer.paths["rollout"]
    trainer.train()
    observed = generated = 0
    for path in sorted((out / "ledgers").glob("step_*.jsonl")):
        for response in read_jsonl(path).responses:
            assert response.turns and response.score is not None and 0.0 <= response.score <= 1.25
            for token in response.tokens:
                if token.role == "observation":  # in the context, out of every loss
                    observed += 1
                    assert not token.response_mask and token.advantages is None and token.rollout_logprobs is None
                elif token.response_mask:
                    generated += 1
                    assert abs(token.rollout_logprobs - token.logprobs) < 1e-3  # vLLM's μ is π_old: synced
    assert observed and generated
