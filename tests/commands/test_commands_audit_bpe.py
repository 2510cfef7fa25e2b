"""glassrl audit on a real byte-level BPE tokenizer (trained here with the ``tokenizers`` library on
local text, no download): the tagged call format's observations must not merge with the sampled
``</call>`` or with the next turn when the context is encoded in one piece (issue 44, item 5: a
Qwen-style BPE turned ``</call>`` + ``<result>`` into ``><``).

Two pre-tokenizers, the two families of byte-level BPE in use: GPT-2's regex (``ByteLevel`` with
its own regex: GPT-2, RoBERTa, Phi) and the Llama 3 / Qwen2 regex (punctuation runs take the
newlines after them; a letter run takes one punctuation character before it). The corpus holds
``</call><result>`` and ``</result>5796`` side by side, so each tokenizer has the merges that
would break a format whose pieces touch.
"""

from __future__ import annotations

import json

import pytest

from glassrl.cli import main

# Llama 3's pre-tokenizer regex (tokenizer.json of Meta-Llama-3; Qwen2's differs only in digits).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _corpus() -> list[str]:
    from glassrl.data.tasks import load_task

    lines = []
    for r in load_task("tool-add", "train", size=300):
        a, b = r.prompt.removesuffix("=?").split("+")
        s = int(a) + int(b)
        lines += [
            f"{r.prompt} <call>calculator {a}+{b}</call><result>{s}</result>{s}",
            f"<call>calculator {a}+{b}</call> <result>{s}</result>\n{s}",
            f"<b>{a}</b><i>{b}</i>\nThe sum is {s}.\n",
        ]
    return lines


def _bpe_model_dir(root, family: str):
    """A tiny Llama over a byte-level BPE trained on :func:`_corpus`, saved as a model directory."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if family == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    specials = ["<|bos|>", "<|eos|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=700, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_corpus(), trainer)
    assert tok.encode("</call><result>").tokens[-3:] != ["call", ">", "<"], "the corpus teaches the merge"
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>")
    out = root / family
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    return out


@pytest.mark.parametrize("family", ["gpt2", "llama3"])
def test_the_tagged_format_round_trips_on_a_real_byte_level_bpe(family, tmp_path, capsys):
    model = _bpe_model_dir(tmp_path, family)
    script = tmp_path / "script.json"
    # A call, then a second call right after the first result, then the answer: both boundaries of
    # each observation. The first turn starts with a space, as the task's transcripts do: where the
    # prompt ends and the response starts is the data's boundary, not the format's (the prompt's
    # "=?" and a "<call>" written right after it are one pre-token in Llama 3's regex).
    turns = [" <call>calculator 1+2</call>", "<call>calculator 3+4</call>", "The sum is 7"]
    script.write_text(json.dumps(turns))
    argv = ["audit", "grpo", "data.train=task:tool-add", f"model.actor={model}", "rollout.max_new_tokens=120"]
    code = main([*argv, "rollout.agent.max_turns=3", "--script", str(script), "--episodes", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "render        2/2   ok" in out


def test_a_join_of_the_data_is_named_as_such(tmp_path, capsys):
    """The prompt's "=?" and a first turn that starts "<call>" without a space: the audit names the
    two pieces that merge (not the format's)."""
    model = _bpe_model_dir(tmp_path, "llama3")
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["<call>calculator 1+2</call>", "3"]))
    argv = ["audit", "grpo", "data.train=task:tool-add", f"model.actor={model}", "rollout.max_new_tokens=120"]
    assert main([*argv, "--script", str(script), "--episodes", "1"]) == 1
    (failure,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("episode 0")]
    assert failure.endswith(
        ": the texts of the prompt and turn 0 (generated) merge where they meet when encoded in one piece"
    )
