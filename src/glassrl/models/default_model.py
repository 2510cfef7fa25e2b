"""The embedded default model: a small Llama trained from scratch on the bundled tasks.

No model is downloaded, ever. The model is a ``LlamaForCausalLM`` of ``DefaultModelSpec``'s
size (:func:`llama_config`) with the byte-level BPE tokenizer of :mod:`.default_tokenizer`,
cached in ``default_model_dir()`` = ``$GLASSRL_HOME/models/default-v2`` (GLASSRL_HOME
defaults to ``~/.cache/glassrl``). A directory holds a complete build when its ``MARKER``
file (``glassrl.json``: build parameters, seed, SFT steps and loss, held-out accuracies)
names the same seed and spec (:func:`is_built`).

The recipe that builds it (tokenizer, initialisation, SFT mix, evaluation) is
:mod:`glassrl.builtin.default_model`; ``ensure_default_model()`` there installs the shipped
weights (glassrl.builtin.shipped) or builds it.

A second variant, the tool-using agent model (``AgentModelSpec``, ``AGENT_VERSION``, cached in
``default_model_dir(AGENT_VERSION)``), answers the tool-add task with calculator calls in the
tagged format; its recipe is :mod:`glassrl.builtin.agent_model`. ``model.actor: default-agent``
names it as ``model.actor: default`` names the default model.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from transformers import LlamaConfig

VERSION = "default-v2"
MARKER = "glassrl.json"  # written last: its presence means the build is complete


@dataclass(frozen=True)
class DefaultModelSpec:
    """Build parameters of the default model (all recorded in glassrl.json)."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 64
    vocab_size: int = 512  # upper bound; BPE stops when the text has no pair left to merge
    tasks: tuple[str, ...] = ("arith-verify", "add")
    english_answered_in_chinese: float = 0.6  # of the English arith-verify SFT answers (glassrl.builtin.default_model)
    sft_steps: int = 800
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.1


DEFAULT_SPEC = DefaultModelSpec()

AGENT_VERSION = "default-agent-v1"


@dataclass(frozen=True)
class AgentModelSpec:
    """Build parameters of the tool-using agent model (glassrl.builtin.agent_model; all recorded
    in glassrl.json). Its SFT transcripts answer tool-add prompts three ways, in these shares:
    a calculator call that runs, a malformed call (then an answer worked out in its head), an
    answer worked out in its head; RL then has a behaviour to sharpen (docs/agentic.md)."""

    hidden_size: int = 128
    num_layers: int = 2  # learns to copy (operands into the call, the result into the answer) sooner than 4
    num_heads: int = 8
    intermediate_size: int = 512
    max_position_embeddings: int = 128  # prompt ~12 tokens; a call, its result and the answer ~26; room for retries
    vocab_size: int = 512  # upper bound, as DefaultModelSpec's
    task: str = "tool-add"
    sft_examples: int = 8000  # transcripts, one per train record
    valid_call: float = 0.3  # share of transcripts that call the calculator correctly
    malformed_call: float = 0.2  # share whose call fails (unknown tool, cut expression, bad JSON, no argument)
    sft_steps: int = 800
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.1
    eval_size: int = 200  # tool-add test prompts answered after SFT (glassrl.json's held-out rates)


AGENT_SPEC = AgentModelSpec()

RESEARCH_VERSION = "default-research-v1"


@dataclass(frozen=True)
class ResearchModelSpec:
    """Build parameters of the research-agent model (glassrl.builtin.research_model; all recorded in
    glassrl.json). Its SFT transcripts search, open one page and report, in these shares: the
    official release with a citation, the same without, the rumour, the forecast stated as fact;
    the starting policy opens the official page about 6 times in 10 (docs/agentic.md)."""

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4  # heads of 32 dimensions
    intermediate_size: int = 512
    max_position_embeddings: int = 320  # prompt ~30 tokens, three turns and two observations ~175
    vocab_size: int = 1536  # upper bound; enough merges that every two-digit figure is one token
    task: str = "research"
    sft_examples: int = 4000  # transcripts, one per train episode
    official: float = 0.5  # share that opens the official release and cites it
    no_cite: float = 0.1  # share that opens it and forgets the citation
    rumour: float = 0.25  # share that opens the rumour page and reports its claim
    forecast: float = 0.15  # share that opens the forecast and reports it as fact
    sft_steps: int = 1200
    batch_size: int = 16
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.1
    eval_size: int = 50  # research test episodes answered after SFT (glassrl.json's held-out rates)


RESEARCH_SPEC = ResearchModelSpec()


def llama_config(spec: DefaultModelSpec | AgentModelSpec | ResearchModelSpec, tokenizer) -> LlamaConfig:
    """The architecture: a Llama of ``spec``'s size over ``tokenizer``'s vocabulary, embeddings tied."""
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def default_model_dir(version: str = VERSION) -> Path:
    """``$GLASSRL_HOME/models/<version>`` (default-v2, or AGENT_VERSION); GLASSRL_HOME defaults to
    ``~/.cache/glassrl``."""
    home = os.environ.get("GLASSRL_HOME") or Path.home() / ".cache" / "glassrl"
    return Path(home) / "models" / version


def is_built(path: Path, seed: int, spec: DefaultModelSpec | AgentModelSpec | ResearchModelSpec = DEFAULT_SPEC) -> bool:
    """Whether ``path`` holds a complete default model built from ``seed`` and ``spec``."""
    try:
        info = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return info.get("seed") == seed and info.get("spec") == spec_json(spec)


def spec_json(spec: DefaultModelSpec | AgentModelSpec | ResearchModelSpec) -> dict:
    """``spec`` as glassrl.json records it (tuples as lists, as JSON reads them back)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(spec).items()}
