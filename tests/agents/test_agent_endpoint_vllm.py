"""The OpenAI-compatible endpoint served by vLLM (`make test-vllm`): ``rollout.engine: vllm`` with
``rollout.agent.endpoint`` samples the agent's calls with the run's vLLM engine (each turn one
``LLM.generate`` over the waiting calls' contexts: glassrl.agents.vllm_turns, behind the endpoint's
lockstep batcher), its weights synced and verified before each rollout.

The openai-client tool-add agent (examples/agents/tool_add_agent.py) trains for two steps on the
tests' tiny model with heads of 32 (vLLM's CPU attention takes no head of 16, so not default-agent:
its rewards mean little, its tokens are what is checked). Every generated token the run trained on
carries vLLM's log μ, equal to the trainer's log π_old (the same weights: the sync landed) to float32
rounding. (This model makes no tool call, so its episodes are one turn: the observation tokens' masks
behind the endpoint are tests/agents/test_agent_endpoint.py's.) vLLM's sampler has its own RNG, so its
tokens are not the HF engine's on the same seed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glassrl.builtin.default_model import build_default_model
from glassrl.config import load_config
from glassrl.ledger import read_jsonl
from glassrl.models.default_model import DefaultModelSpec
from glassrl.rl.config import TrainConfig
from helpers import TINY_SPEC

pytestmark = pytest.mark.vllm

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_openai_client_agent_trains_through_the_endpoint_on_vllm(tmp_path):
    pytest.importorskip("openai")
    from glassrl.rl.loop import Trainer

    model = tmp_path / "model"
    build_default_model(model, seed=0, spec=DefaultModelSpec(**{**TINY_SPEC, "hidden_size": 64}))
    out = tmp_path / "run"
    overrides = [
        f"output_dir={out}",
        f"model.actor={model}",
        "rollout.engine=vllm",
        "rollout.max_new_tokens=24",
        "steps=2",
        "rollout.n=2",
        "batch.prompts_per_step=4",
        "batch.mini_batch_prompts=4",
        "batch.micro_batch_responses=8",
        "logging.eval_every=0",
        "data.eval_size=8",
        "logging.ledger_every=1",
        "logging.ledger_samples=8",
        "logging.checkpoint_every=0",
        "logging.report=false",
        "actor_optim.lr=0.01",  # step 1's update moves the weights: step 2's sync must land for μ to equal π_old
        "actor_optim.warmup_steps=0",
    ]
    trainer = Trainer(
        load_config(TrainConfig, EXAMPLES / "agents" / "tool_add_endpoint.yaml", overrides), progress=False
    )
    path = trainer.paths["rollout"]
    assert "vLLM 0.32.0 on cpu" in path and "endpoint" in path, path
    trainer.train()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    generated = 0
    for step, ledger in enumerate(sorted((out / "ledgers").glob("step_*.jsonl")), start=1):
        for response in read_jsonl(ledger).responses:
            for token in response.tokens:
                if token.response_mask:  # sampled by vLLM: its log μ, the version that sampled it
                    assert token.rollout_logprobs is not None and token.logprobs is not None
                    assert abs(token.rollout_logprobs - token.logprobs) < 1e-3, (step, token)
                    generated += 1
    assert generated > 0
