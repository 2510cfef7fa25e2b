"""The tool-add agent as a plain OpenAI-client program (examples/agents/tool_add_agent.py) trains through
the endpoint to the same rewards as the native loop on the same seeds, token for token.

What differs, by construction: the calls' statuses (ok, error, timeout) are the agent's business and
are recorded as "agent", so the tool metrics that count them (tool/calls/ok, tool/valid_call_rate)
are not comparable; and the agent returns the environment's valid_call reward for the episode,
which the endpoint places on the episode's last turn, where the native environment places it on the
turn that made the call. GRPO reads the sum of a response's rewards, so the advantages, the losses
and the weights are the same; the per-token scores in the ledger sit one turn later.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glassrl.config import load_config
from glassrl.ledger import read_jsonl
from glassrl.rl.config import TrainConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = [
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
]


def _train(config: Path, out: Path, *extra: str) -> list[dict]:
    from glassrl.rl.loop import Trainer

    Trainer(load_config(TrainConfig, config, [f"output_dir={out}", *SMALL, *extra]), progress=False).train()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def ledger_rows(run: Path) -> list[tuple]:
    """Per response of every step's ledger: its text, score, token ids, masks and advantages."""
    rows = []
    paths = sorted((run / "ledgers").glob("step_*.jsonl"))
    assert paths, run
    for path in paths:
        for r in read_jsonl(path).responses:
            tokens = [(t.token_id, t.response_mask, round(t.advantages or 0.0, 6)) for t in r.tokens]
            rows.append((r.response, r.score, tokens))
    return rows


def _same_training(tmp_path: Path, *extra: str) -> None:
    pytest.importorskip("openai")
    native = _train(EXAMPLES / "tool_add.yaml", tmp_path / "native", *extra)
    endpoint = _train(EXAMPLES / "agents" / "tool_add_endpoint.yaml", tmp_path / "endpoint", *extra)
    assert [r["step"] for r in native] == [r["step"] for r in endpoint]
    compared = 0
    for a, b in zip(native, endpoint):
        for key in sorted(set(a) & set(b)):
            # the calls' statuses are the agent's, not recorded: tool metrics other than the count of calls differ
            tool_status = "tool/" in key and not key.endswith("tool/calls/mean")
            if key.startswith(("reward/", "actor/", "response/", "eval/", "tool/")) and not tool_status:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6, nan_ok=True), (a["step"], key)
                compared += 1
    assert compared > 20
    assert ledger_rows(tmp_path / "native") == ledger_rows(tmp_path / "endpoint")


def test_the_openai_client_agent_trains_like_the_native_loop(tmp_path):
    _same_training(tmp_path)


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray cluster of 2 CPUs of this test's own (as tests/rl/conftest.py starts one)."""
    ray = pytest.importorskip("ray")
    from glassrl.workers.ray_cluster import connect

    connect(None, num_cpus=2, object_store_memory=100 * 2**20, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_on_ray_the_agent_runs_on_the_rollout_rank_and_trains_like_the_native_loop(local_ray, tmp_path):
    """trainer.backend ray: the endpoint is served by the actor's rank (rollout with_actor), in its process."""
    _same_training(
        tmp_path,
        "trainer.backend=ray",
        "ray.actor.resources={CPU: 0.25}",
        "ray.reference.resources={CPU: 0.25}",
        "logging.report=false",
    )


def test_audit_checks_the_agent_s_captured_samples():
    """glassrl audit on an endpoint config: the agent's calls, sampled by a script, captured and checked
    (masks, re-rendering, limits) as native episodes are."""
    pytest.importorskip("openai")
    from glassrl.diagnose.episode_audit import summary
    from glassrl.rl.audit import audit_run

    cfg = load_config(TrainConfig, EXAMPLES / "agents" / "tool_add_endpoint.yaml", [])
    audits = audit_run(cfg, episodes=2, script=["<call>calculator 1+2</call>", "3"])
    checks, failures = summary(audits)
    assert failures == [] and [a.turns for a in audits] == [2, 2]
    assert all(passed == run == 2 for _, passed, run, _ in checks)


def test_endpoint_config_errors_name_the_key(tmp_path):
    from glassrl.errors import GlassrlError
    from glassrl.rl.build import endpoint_engine

    config = EXAMPLES / "agents" / "tool_add_endpoint.yaml"
    with pytest.raises(GlassrlError, match=r"rollout\.agent\.endpoint\.agent.*exactly one"):
        load_config(TrainConfig, config, ["rollout.agent.endpoint.agent=null"]).validate()
    with pytest.raises(GlassrlError, match=r"rollout\.agent\.endpoint\.on_rewrite"):
        load_config(TrainConfig, config, ["rollout.agent.endpoint.on_rewrite=drop"])
    cfg = load_config(TrainConfig, config, [f"rollout.agent.endpoint.agent={tmp_path}/none.py:agent"])
    with pytest.raises(GlassrlError, match=r"rollout\.agent\.endpoint\.agent: agent .*none\.py:agent.*no file"):
        endpoint_engine(cfg, cfg.rollout.agent, None, None, False)


def test_top_logprobs_are_the_model_s_and_hold_the_sampled_token():
    pytest.importorskip("openai")
    import openai
    import torch

    from glassrl.agents import HFTurnSampler
    from glassrl.agents.endpoint import EndpointRolloutEngine
    from glassrl.builtin.agent_model import ensure_agent_model
    from glassrl.data.tasks import load_task
    from glassrl.models.loading import load_causal_lm, load_tokenizer
    from glassrl.rollout.base import SamplingParams

    path = ensure_agent_model()
    tokenizer, model = load_tokenizer(path), load_causal_lm(path, device="cpu")
    seen = {}

    def agent(base_url, task):
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        messages = [{"role": "user", "content": task["prompt"]}]
        seen["reply"] = client.chat.completions.create(model="policy", messages=messages, logprobs=True, top_logprobs=3)

    engine = EndpointRolloutEngine(HFTurnSampler(model, tokenizer), tokenizer, agent, call_format="tagged")
    records = load_task("tool-add", "train", size=1)
    try:
        engine.generate(
            [[]], n=1, params=SamplingParams(max_new_tokens=8), generator=torch.Generator(), records=records
        )
    finally:
        engine.close()
    for entry in seen["reply"].choices[0].logprobs.content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert entry.logprob <= tops[0] + 1e-5
        if entry.token in [t.token for t in entry.top_logprobs]:
            assert entry.logprob == pytest.approx(
                dict((t.token, t.logprob) for t in entry.top_logprobs)[entry.token], abs=1e-4
            )
