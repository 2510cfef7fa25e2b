"""The OpenAI-compatible endpoint served by vLLM (``rollout.engine: vllm``, `make test-vllm`).

The endpoint's engine (glassrl.agents.endpoint) samples the agents' calls with the run's turn sampler;
with ``rollout.engine: vllm`` that is vLLM's (glassrl.agents.vllm_turns.VLLMTurnSampler), the one the
native agent loop uses on vLLM.

- Every call is recorded token-exact: the captured sample's generated ids and log-probs are the ids
  vLLM sampled (cut as glassrl.agents.loop.trim_turn cuts them) and vLLM's own log-probs, each
  token with the policy version the engine sampled at.
- The openai-client tool-add agent (examples/agents/tool_add_agent.py) trains through the endpoint
  on vLLM: the start-up ``rollout:`` line names vLLM as the engine serving the endpoint, and each
  generated token's vLLM log μ equals the trainer's log π_old (the weights synced and verified
  before each rollout); in-process, and on the Ray backend with the endpoint and vLLM on a rollout
  rank apart (its weights broadcast after each update, then synced into vLLM).

vLLM's sampler draws from its own RNG: at temperature 1 the same seeds give other tokens than the
HF loop's (tests/agents/test_agent_endpoint_train.py compares the endpoint with the native loop
token for token on the HF engine; tests/rl/test_rl_vllm_agents.py compares the two samplers under
greedy decoding, where the RNG plays no part).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from glassrl.builtin.default_model import build_default_model
from glassrl.ledger import read_jsonl
from glassrl.models import load_causal_lm, load_tokenizer
from glassrl.models.default_model import DefaultModelSpec
from glassrl.rollout.base import ROLE_GENERATED, SamplingParams
from glassrl.rollout.vllm import VLLMRolloutEngine
from helpers import RAY_ROLLOUT_APART, TINY_SPEC, preset_trainer

pytestmark = pytest.mark.vllm

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm-endpoint") / "model"  # heads of 32: vLLM's CPU attention takes no head of 16
    build_default_model(out, seed=0, spec=DefaultModelSpec(**{**TINY_SPEC, "hidden_size": 64}))
    return out


def test_each_call_is_captured_as_vllm_sampled_it(model_dir):
    pytest.importorskip("openai")
    import sys

    sys.path.insert(0, str(EXAMPLES / "agents"))
    try:
        from tool_add_agent import agent
    finally:
        sys.path.remove(str(EXAMPLES / "agents"))
    from glassrl.agents.endpoint import EndpointRolloutEngine
    from glassrl.agents.vllm_turns import VLLMTurnSampler
    from glassrl.data.tasks import load_task

    model, tokenizer = load_causal_lm(model_dir, dtype="float32", device="cpu"), load_tokenizer(model_dir)

    class Versions:  # the weights' version, as asynchronous training's StagedWeights gives it
        def refresh(self) -> int:
            return 3

    versions = Versions()
    engine = VLLMRolloutEngine.colocated(
        model, tokenizer, gpu_memory_utilization=0.4, sleep=False, seed=0, versions=versions
    )
    sampled = []  # per call of vLLM: (contexts, completions)
    sample = engine.sample

    def recording(prompts, params):
        completions, version = sample(prompts, params)
        sampled.append((prompts, completions, version))
        return completions, version

    engine.sample = recording
    endpoint = EndpointRolloutEngine(
        VLLMTurnSampler(engine), tokenizer, agent, call_format="tagged", describe_tools=False, sampling_logprobs=True
    )
    assert "each call by vLLM 0.32.0 on cpu" in endpoint.path
    records = load_task("tool-add", "train", size=3)
    try:
        batch = endpoint.generate(
            [[]] * 3,
            n=2,
            params=SamplingParams(max_new_tokens=40, temperature=1.0),
            generator=torch.Generator().manual_seed(0),
            records=records,
        )
    finally:
        endpoint.close()
    assert engine.syncs == 1 and engine.last_sync.max_diff <= 1e-3  # the weights synced and verified
    assert batch.policy_versions is not None and batch.rollout_logprobs is not None
    # vLLM's turns by context: what it sampled for each context it was given
    by_context = {}
    for contexts, completions, version in sampled:
        assert version == 3
        for context, [completion] in zip(contexts, completions):
            by_context.setdefault(tuple(context), []).append(completion)
    turns = 0
    for row, s in enumerate(endpoint.samples):
        context = list(s.prompt)
        at = 0
        while at < len(s.tokens):  # each generated run of the row is one call's turn
            if s.roles[at] != ROLE_GENERATED:
                context.append(s.tokens[at])
                at += 1
                continue
            end = at
            while end < len(s.tokens) and s.roles[end] == ROLE_GENERATED:
                end += 1
            ids, logprobs = s.tokens[at:end], s.logprobs[at:end]
            [completion] = [c for c in by_context[tuple(context)] if list(c.token_ids[: len(ids)]) == ids]
            assert logprobs == [step[t].logprob for step, t in zip(completion.logprobs, ids)]
            assert s.versions[at:end] == [3] * len(ids)
            assert batch.response_ids[row, at:end].tolist() == ids
            assert torch.equal(batch.rollout_logprobs[row, at:end], torch.tensor(logprobs, dtype=torch.float32))
            assert batch.policy_versions[row, at:end].tolist() == [3] * len(ids)
            context += ids
            at = end
            turns += 1
    assert turns >= len(records) * 2  # every episode's calls


def _train_on_vllm(model_dir, out, *extra: str):
    """The openai-client agent trained 2 steps through the endpoint on vLLM; the trainer and its ledgers'
    generated tokens."""
    pytest.importorskip("openai")
    overrides = [
        f"model.actor={model_dir}",
        f"output_dir={out}",
        "steps=2",
        "rollout.n=2",
        "rollout.max_new_tokens=40",  # the tiny model's 64 positions
        "rollout.engine=vllm",
        "data.eval_size=4",
        "batch.prompts_per_step=4",
        "batch.mini_batch_prompts=4",
        "batch.micro_batch_responses=4",
        "actor_optim.lr=0.01",
        "actor_optim.warmup_steps=0",
        "logging.eval_every=0",
        "logging.report=false",
        "logging.ledger_every=1",
        "logging.ledger_samples=8",
        "logging.checkpoint_every=0",
        *extra,
    ]
    trainer = preset_trainer("agents/tool_add_endpoint", overrides)
    assert "over the OpenAI-compatible endpoint" in trainer.paths["rollout"]
    assert "each call by vLLM 0.32.0 on cpu" in trainer.paths["rollout"]
    trainer.train()
    generated = 0
    for path in sorted((out / "ledgers").glob("step_*.jsonl")):
        for response in read_jsonl(path).responses:
            assert response.turns and response.score is not None
            for token in response.tokens:
                if token.response_mask:
                    generated += 1
                    assert abs(token.rollout_logprobs - token.logprobs) < 1e-3  # vLLM's μ is π_old: synced
    assert generated
    return trainer


def test_the_openai_client_agent_trains_through_the_endpoint_on_vllm(model_dir, tmp_path):
    _train_on_vllm(model_dir, tmp_path / "run")


@pytest.mark.slow
def test_on_ray_vllm_serves_the_endpoint_on_the_rollout_rank(model_dir, local_ray, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "run"
    trainer = _train_on_vllm(model_dir, out, *RAY_ROLLOUT_APART)
    assert trainer.workers.rollout.group.role == "rollout"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(m["perf/weight_sync_s"] > 0 for m in rows if m["step"] > 0)  # the broadcast ran each update
    diffs = [m["rollout/logprob_diff_max"] for m in rows if "rollout/logprob_diff_max" in m]
    assert len(diffs) == 2 and all(d < 1e-3 for d in diffs), diffs


def test_top_logprobs_come_from_vllm_and_leave_the_sampled_log_probs_as_they_were(model_dir):
    """OpenAI's ``top_logprobs`` on vLLM (vLLM's ``logprobs=k``): the sampler's turns with k = 3 are the
    turns with none, the sampled tokens' log-probs equal bit for bit; the alternatives are the actor's k
    most likely tokens under softmax(logits / T), most likely first. Through the endpoint, an openai-client
    agent gets them (no 400), each token's log-prob the captured one; under top-k = 2 the third
    alternative, cut, is -9999.0 as vLLM's own server writes -inf."""
    openai = pytest.importorskip("openai")
    from glassrl.agents.endpoint import EndpointRolloutEngine
    from glassrl.agents.vllm_turns import VLLMTurnSampler
    from glassrl.data.tasks import load_task

    model, tokenizer = load_causal_lm(model_dir, dtype="float32", device="cpu"), load_tokenizer(model_dir)
    engine = VLLMRolloutEngine.colocated(model, tokenizer, gpu_memory_utilization=0.4, sleep=False, seed=0)
    sampler = VLLMTurnSampler(engine)
    contexts = [tokenizer.encode("4821+975=?"), tokenizer.encode("12+30=? <call>")]
    params = SamplingParams(max_new_tokens=12, temperature=0.7)

    def turns(top):
        return sampler.sample(contexts, [12, 12], params, torch.Generator().manual_seed(1), (), True, top)

    plain, topped = turns(None), turns([3, 3])
    for without, with_top, context in zip(plain, topped, contexts):
        assert (with_top.tokens, with_top.logprobs) == (
            without.tokens,
            without.logprobs,
        ) and without.top_logprobs is None
        assert len(with_top.top_logprobs) == len(with_top.tokens) > 0
        ids = torch.tensor([context + with_top.tokens])
        with torch.no_grad():
            actor = torch.log_softmax(model(input_ids=ids).logits[0, len(context) - 1 : -1] / 0.7, dim=-1)  # (T, V)
        for i, (token, logprob, top) in enumerate(zip(with_top.tokens, with_top.logprobs, with_top.top_logprobs)):
            values = [v for _, v in top]
            assert len(top) == 3 and values == sorted(values, reverse=True) and logprob <= values[0]
            assert values == pytest.approx(actor[i].topk(3).values.tolist(), abs=1e-3)
            assert [actor[i, t].item() for t, _ in top] == pytest.approx(values, abs=1e-3)
            if token in dict(top):
                assert dict(top)[token] == logprob

    seen = []

    def agent(base_url, task):
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        messages = [{"role": "user", "content": task["prompt"]}]
        seen.append(client.chat.completions.create(model="policy", messages=messages, logprobs=True, top_logprobs=3))

    for top_k in (0, 2):
        seen.clear()
        endpoint = EndpointRolloutEngine(sampler, tokenizer, agent, call_format="tagged", describe_tools=False)
        try:
            endpoint.generate(
                [[]],
                n=1,
                params=SamplingParams(max_new_tokens=10, temperature=1.0, top_k=top_k),
                generator=torch.Generator().manual_seed(0),
                records=load_task("tool-add", "train", size=1),
            )
        finally:
            endpoint.close()
        [reply] = seen
        [sample] = endpoint.samples
        content = reply.choices[0].logprobs.content
        assert [c.logprob for c in content] == sample.logprobs[: len(content)] and content
        for entry in content:
            values = [t.logprob for t in entry.top_logprobs]
            assert len(values) == 3 and values == sorted(values, reverse=True)
            assert (values[2] == -9999.0) == (top_k == 2), values
