"""SFT: response-only loss, batch layout, schedule, data errors, a short run whose loss falls, the CLI."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from rich.console import Console
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from glassrl.cli import main
from glassrl.data.collate import collate, encode_response
from glassrl.data.formatting import format_prompt
from glassrl.data.tasks import TASKS, sft_pairs
from glassrl.errors import GlassrlError
from glassrl.models.default_tokenizer import build_tokenizer
from glassrl.optim import OptimConfig, lr_factor
from glassrl.supervised.sft import SFTConfig, load_pairs, response_loss, tokenize_pairs, train_sft

QUIET = Console(file=io.StringIO())
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sft.yaml"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer([p + a for task in TASKS for p, a in sft_pairs(task, "train")])


def tiny_model(tokenizer, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def tiny_path(tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_sft_start")
    tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_collate_layout_hand_table():
    """Prompts left-padded, responses right-padded, positions counting real tokens only."""
    batch = collate([([5, 6], [7]), ([8], [9, 10])], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0], [0, 8, 9, 10]]
    assert batch["attention_mask"].tolist() == [[True, True, True, False], [False, True, True, True]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 2], [0, 0, 1, 2]]
    assert batch["response_mask"].tolist() == [[True, False], [True, True]]
    assert int(batch["prompt_len"]) == 2


def test_lr_schedule_hand_values():
    """warmup 2, total 6: 1/2, 1, then half a cosine over the 4 remaining steps."""
    got = [lr_factor(s, 2, 6) for s in range(7)]
    want = [0.5, 1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0]
    assert got == pytest.approx(want)


def test_response_loss_matches_per_example_reference(tokenizer):
    """Batched, padded, masked loss == the sum over examples of CE on response tokens alone."""
    model = tiny_model(tokenizer).eval()
    pairs = [("请问12+7=19？", "是的，等于19！"), ("3+4=", "7"), ("Is 99+99=199?", "No, it equals 198!")]
    examples = [(format_prompt(tokenizer, p), encode_response(tokenizer, r)) for p, r in pairs]
    with torch.no_grad():
        loss_sum, count = response_loss(model, collate(examples, tokenizer.pad_token_id))
        want = 0.0
        for prompt, response in examples:  # slow reference: no padding, one example at a time
            logits = model(torch.tensor([prompt + response])).logits[0]
            want += F.cross_entropy(logits[len(prompt) - 1 : -1], torch.tensor(response), reduction="sum").item()
    assert int(count) == sum(len(r) for _, r in examples)
    assert loss_sum.item() == pytest.approx(want, rel=1e-5)


def test_response_ends_with_eos(tokenizer):
    assert encode_response(tokenizer, "7") == [*tokenizer("7", add_special_tokens=False)["input_ids"], 2]


def test_sft_loss_falls_and_writes_a_loadable_checkpoint(tokenizer, tmp_path):
    cfg = SFTConfig(
        model="in memory",
        data="task:add",
        seed=0,
        optim=OptimConfig(lr=1e-2, warmup_steps=2, decay="cosine"),
        steps=30,
        batch_size=16,
        output_dir=str(tmp_path / "run"),
        log_every=5,
        eval_every=15,
        device="cpu",
    )
    metrics = train_sft(cfg, model=tiny_model(tokenizer), tokenizer=tokenizer, console=QUIET)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    evals = [r["eval/loss"] for r in rows if "eval/loss" in r]
    assert [r["step"] for r in rows] == [5, 10, 15, 20, 25, 30] and len(evals) == 2
    assert losses[-1] < 0.7 * losses[0]
    assert metrics["train/loss"] == losses[-1] and metrics["eval/loss"] == evals[-1] and metrics["steps"] == 30
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run")
    assert (tmp_path / "run" / "model.safetensors").is_file() and (tmp_path / "run" / "tokenizer.json").is_file()
    assert reloaded.config.vocab_size == len(tokenizer)


def test_sft_is_deterministic(tokenizer, tmp_path):
    data = tmp_path / "add.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "response": r}) + "\n" for p, r in sft_pairs("add", "test")[:64]))
    runs = []
    for name in ("a", "b"):
        cfg = SFTConfig(data=str(data), steps=4, batch_size=8, output_dir=str(tmp_path / name), device="cpu")
        runs.append(train_sft(cfg, model=tiny_model(tokenizer), tokenizer=tokenizer, console=QUIET)["train/loss"])
    assert runs[0] == runs[1]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


def test_jsonl_data_with_text_and_messages(tokenizer, tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": "1+1=", "response": "2"}, {"prompt": [{"role": "user", "content": "2+2="}], "response": "4"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    loaded = load_pairs(str(path))
    assert [(p, r) for p, r, _ in loaded] == [("1+1=", "2"), (({"role": "user", "content": "2+2="},), "4")]
    assert [s for _, _, s in loaded] == [f"{path}:1", f"{path}:2"]
    examples = tokenize_pairs(tokenizer, loaded, max_length=64)
    assert examples[1][0][:2] == [tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids("<|user|>")]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"prompt": "a", "response": "b"}', '{"prompt": "a"}'], r"d.jsonl:2: missing field \"response\""),
        (["{oops"], r"d.jsonl:1: not valid JSON"),
        (['{"prompt": 3, "response": "b"}'], r"d.jsonl:1: field \"prompt\" must be"),
        (['{"prompt": [{"role": "user"}], "response": "b"}'], r"d.jsonl:1: field \"prompt\": messages"),
        (['{"prompt": "a", "response": null}'], r"d.jsonl:1: field \"response\" must be a string"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, lines, message):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(GlassrlError, match=message):
        load_pairs(str(path))


def test_bad_data_spec_and_too_long_examples(tokenizer):
    with pytest.raises(GlassrlError, match="unknown task 'nope'.*valid: task:arith-verify, task:add"):
        load_pairs("task:nope")
    with pytest.raises(GlassrlError, match="neither task:NAME"):
        load_pairs("missing.jsonl")
    with pytest.raises(GlassrlError, match=r"src:1: prompt\+response is \d+ tokens, more than max_length=4"):
        tokenize_pairs(tokenizer, [("12+34=", "46", "src:1")], max_length=4)


def test_cli_sft_with_example_config(tiny_path, tmp_path, capsys):
    """examples/sft.yaml as shipped, pointed at a tiny model by overrides."""
    out = tmp_path / "cli"
    args = [f"model={tiny_path}", "steps=2", f"output_dir={out}", "device=cpu", "optim.kernel=fused"]
    code = main(["sft", str(EXAMPLE), *args])
    assert code == 0 and (out / "model.safetensors").is_file() and (out / "sft_config.yaml").is_file()
    out_text = capsys.readouterr().out
    assert "glassrl sft: resolved" in out_text and "training length" in out_text  # the table printed at start
    assert "optimiser: AdamW, fused kernel (optim.kernel fused)" in out_text  # the kernel that runs, and why
    assert main(["sft", str(EXAMPLE), "nonsense=1"]) == 2
    assert "unknown key nonsense" in capsys.readouterr().err
    assert main(["sft", str(EXAMPLE), "batch_size=0"]) == 2
    assert capsys.readouterr().err == "glassrl sft: error: batch_size = 0: must be >= 1\n"


def test_sft_renders_text_prompts_as_train_does(tmp_path):
    """An SFT → GRPO pipeline trains the format it samples: the same text prompts, the same ids,
    under the tokenizer's chat template with a system prompt; chat_template=none keeps them plain."""
    from glassrl.config import load_config
    from glassrl.rl.config import TrainConfig
    from glassrl.rl.prompts import build_prompts
    from glassrl.supervised.sft import render_pairs
    from helpers import chatml_tokenizer, tiny_llama_config

    questions = ["What is 3+4?", "Is 2+2=4?", "Natalia sold 48 clips in April and half as many in May."]
    chatml = chatml_tokenizer(questions * 3)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": q, "response": "7"}) + "\n" for q in questions))
    tiny_llama_config(400, max_position_embeddings=512).save_pretrained(tmp_path / "model")
    for overrides in (["system_prompt=Be brief."], [], ["chat_template=none"]):
        sft = SFTConfig(**dict(o.split("=") for o in overrides), data=str(data), max_length=512)
        rows = render_pairs(chatml, sft, load_pairs(str(data)), "data")
        sft_ids = [prompt for prompt, _ in tokenize_pairs(chatml, rows, 512)]
        train = load_config(
            TrainConfig, None, ["data.eval_size=0", f"data.train={data}", *("data." + o for o in overrides)]
        )
        prompts = build_prompts(train, chatml, tmp_path / "model")
        assert sft_ids == prompts.ids(prompts.sources[0].records)
    assert chatml.decode(sft_ids[0]) == questions[0]  # the last: plain text
    with pytest.raises(GlassrlError, match=r"^system_prompt: the text prompts of data stay plain text \(chat_template"):
        render_pairs(chatml, SFTConfig(chat_template="none", system_prompt="Hi"), load_pairs(str(data)), "data")
