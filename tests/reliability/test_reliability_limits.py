"""Inputs too deep and outputs too large (issue 33, item 8): a config or a data file nested deeper
than anyone writes is one line, not a RecursionError; a reward function that floods stdout reaches
the terminal capped."""

from __future__ import annotations

import textwrap
import time

import pytest
from harness import assert_one_error_line

from glassrl.data.records import PromptRecord
from glassrl.jsonl import MAX_NESTING
from glassrl.rewards import RewardRequest, UserFunctionSource
from glassrl.worker_pool import MAX_OUTPUT_BYTES
from helpers import tiny_run_overrides

DEEP = 5000  # yaml and json both raised RecursionError


@pytest.mark.parametrize(
    ("where", "match"),
    [
        ("file", r"deep\.yaml: not valid YAML: nested deeper than 64 levels"),
        ("override", r"algo: '\[\[\[.*' is not a YAML value: nested deeper than 64 levels"),
        ("file-65", r"deep\.yaml: not valid YAML: nested deeper than 64 levels"),  # loads, but deeper than 64
    ],
    ids=["file", "override", "file-65"],
)
def test_a_config_nested_too_deep_is_one_line(where, match, capsys, tmp_path):
    depth = MAX_NESTING + 1 if where == "file-65" else DEEP
    value = "[" * depth + "]" * depth
    (tmp_path / "deep.yaml").write_text(f"steps: 1\nalgo: {value}\n")
    argv = ["train", str(tmp_path / "deep.yaml")] if where.startswith("file") else ["train", "grpo", f"algo={value}"]
    assert_one_error_line(capsys, argv, match)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_an_explain_input_nested_too_deep_is_one_line(suffix, capsys, tmp_path):
    path = tmp_path / f"deep{suffix}"
    path.write_text('{"responses": ' + "[" * DEEP + "]" * DEEP + "}")
    assert_one_error_line(capsys, ["explain", "--input", path], rf"deep\{suffix}: .*nested deeper than 64 levels")


def test_a_data_file_nested_too_deep_is_one_line(capsys, tmp_path, tiny_model_dir, prompt_files):
    deep = '{"prompt": "1+1", "answer": "2", "meta": ' + "[" * DEEP + "]" * DEEP + "}"
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "2+2", "answer": "4"}\n' + deep + "\n")
    run = tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "run")
    argv = ["train", "grpo", *run, f"data.train={tmp_path / 'prompts.jsonl'}"]
    assert_one_error_line(capsys, argv, r"prompts\.jsonl:2: nested deeper than 64 levels")


CHATTY = """
import os, subprocess, sys

def chatty(prompt, response, answer, metadata):
    print("o" * 3_000_000, flush=True)
    os.write(2, b"e" * 3_000_000)
    subprocess.run([sys.executable, "-c", "import os; os.write(1, b'c' * 3_000_000)"], check=True)
    return 1.0
"""


def test_a_reward_that_floods_its_output_reaches_the_terminal_capped(tmp_path, monkeypatch, capfd):
    """Was: 9 MB printed by one call went to the trainer's terminal and logs as they were."""
    (tmp_path / "glassrl_chatty_reward.py").write_text(textwrap.dedent(CHATTY))
    monkeypatch.syspath_prepend(str(tmp_path))
    # a pool of its own (recycle_after picks it), started under capfd: a shared pool's workers may
    # hold the streams of an earlier test
    source = UserFunctionSource("glassrl_chatty_reward:chatty", style="glassrl", timeout_s=60.0, recycle_after=977)
    (result,) = source.score([RewardRequest("p", "r", PromptRecord("p", "a", {}, "t#0"))])
    assert result.status == "ok" and result.score == 1.0
    out = err = ""
    note = f"[glassrl: a reward call wrote more than {MAX_OUTPUT_BYTES} bytes here; the rest is dropped]"
    end = time.monotonic() + 60  # the worker passes its output on from a thread of its own
    while time.monotonic() < end and not (note in out and note in err):
        more = capfd.readouterr()
        out, err = out + more.out, err + more.err
        time.sleep(0.1)
    for text in (out, err):
        assert note in text and len(text) < MAX_OUTPUT_BYTES + 500
    assert out.count("c") < 200  # the child's output shared the call's budget, spent by then


# ---------------------------------------------------------------- sizes that cannot fit (item 5)


def test_a_batch_that_cannot_fit_is_refused_at_start_with_the_figure(
    capsys, monkeypatch, tmp_path, tiny_model_dir, prompt_files
):
    """batch.prompts_per_step=100000 took 23.7 GB and died by the OOM killer after 157 s, silent (the test asks
    for 1000000: since the estimate counts the longest prompt read, not the limit, 100000 fits in 8 GiB).
    Now the step's memory is estimated before any model loads and the run refused, with the figures
    (the memory available fixed at 8 GiB here, so that the test reads the same on any machine)."""
    import glassrl.rl.memory as memory

    monkeypatch.setattr(memory, "available_bytes", lambda device: 8 * 2**30)
    run = tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "run")
    big = ["batch.prompts_per_step=1000000", "batch.mini_batch_prompts=1000000", "batch.micro_batch_responses=8"]
    assert_one_error_line(
        capsys,
        ["train", "grpo", *run, *big],
        r"batch\.prompts_per_step = 1000000 × rollout\.n = 4: one step needs about \d+\.\d GiB \(key-value cache "
        r"\d+\.\d, per-token tensors \d+\.\d, weights 0\.0, update activations 0\.0, log-prob chunks 0\.0; "
        r"responses of up to \d+ \+ 16 tokens\), more than the "
        r"8\.0 GiB available on cpu; lower batch\.prompts_per_step",
    )
    assert not (tmp_path / "run" / "checkpoints").exists()
    terms = memory.step_memory(*_resolved([*run, *big]), tiny_model_dir, 48)
    # the default model: 2 layers, 2 key-value heads of 16; float32; 4,000,000 responses of 48 + 16 tokens
    assert terms["key-value cache"] == 4_000_000 * 2 * 2 * 2 * 16 * 64 * 4
    assert terms["per-token tensors"] == 4_000_000 * 64 * 64


def test_the_decoding_loops_reordered_weights_are_counted_where_they_are_held(
    monkeypatch, tmp_path, tiny_model_dir, prompt_files
):
    """On a CPU the decoding loop holds a reordered copy of the linear weights larger than the last-level cache
    (glassrl.rollout.packed_weights): ``generate``/``eval`` count it; a training step counts it as a term of its
    own under LoRA only (full training frees the gradients before the rollout: the copy takes their room)."""
    import torch

    import glassrl.rl.memory as memory

    cpu = torch.device("cpu")
    weights = memory.weight_bytes(tiny_model_dir, 4)
    monkeypatch.setattr(memory, "last_level_cache_bytes", lambda: weights - 1)
    assert memory.reordered_bytes(weights, cpu) == weights
    assert memory.reordered_bytes(weights, torch.device("cuda")) == 0
    monkeypatch.setattr(memory, "last_level_cache_bytes", lambda: weights)
    assert memory.reordered_bytes(weights, cpu) == 0
    monkeypatch.setattr(memory, "last_level_cache_bytes", lambda: None)  # unknown: 32 MiB assumed
    assert memory.reordered_bytes(weights, cpu) == 0 and memory.reordered_bytes(2**30, cpu) == 2**30
    monkeypatch.setattr(memory, "last_level_cache_bytes", lambda: 1)
    run = tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "run")
    assert "reordered weights" not in memory.step_memory(*_resolved(run), tiny_model_dir, 48)
    lora = memory.step_memory(*_resolved([*run, "model.lora.r=4"]), tiny_model_dir, 48)
    assert lora["reordered weights"] == weights


def _resolved(overrides):
    from glassrl.config import load_config
    from glassrl.rl.config import TrainConfig
    from glassrl.rl.resolve import resolve
    from helpers import EXAMPLES

    cfg = load_config(TrainConfig, EXAMPLES / "grpo.yaml", overrides)
    return cfg, resolve(cfg)


def test_parquet_rows_are_read_a_batch_at_a_time(monkeypatch, tmp_path):
    """10⁶ Parquet rows took 3.7 GB at start-up: the whole table, then all of it as Python rows. Rows
    now come PARQUET_BATCH_ROWS at a time (the whole table is never read at once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import glassrl.data.datasets as datasets

    n = 3 * datasets.PARQUET_BATCH_ROWS + 5
    pq.write_table(
        pa.table({"prompt": [f"{i}+1" for i in range(n)], "answer": [str(i + 1) for i in range(n)]}),
        tmp_path / "p.parquet",
    )

    def whole_table(*args, **kwargs):
        raise AssertionError("the whole table read at once")

    monkeypatch.setattr(pq, "read_table", whole_table)
    records = datasets.load_prompts(tmp_path / "p.parquet")
    assert len(records) == n and records[-1].prompt == f"{n - 1}+1" and records[-1].source.endswith(f"#{n - 1}")


def test_prompt_lengths_are_measured_a_chunk_at_a_time(monkeypatch, tmp_path, tiny_model_dir):
    """At start-up every prompt is tokenised to hold it to the length rule; the token ids of all
    prompts at once held gigabytes for a million prompts. They are measured LENGTH_CHUNK at a time."""
    import glassrl.rl.prompts as prompts
    from glassrl.data.sources import Source
    from glassrl.models.loading import load_tokenizer

    n = 2 * prompts.LENGTH_CHUNK + 3
    (tmp_path / "p.jsonl").write_text("".join(f'{{"prompt": "{i}+1", "answer": "{i + 1}"}}\n' for i in range(n)))
    sizes = []
    real = prompts.prompt_ids
    monkeypatch.setattr(
        prompts, "prompt_ids", lambda tok, records, fmt: sizes.append(len(records)) or real(tok, records, fmt)
    )
    cfg, _ = _resolved([f"model.actor={tiny_model_dir}"])
    loaded = prompts.load_source(
        Source(str(tmp_path / "p.jsonl")), "train", load_tokenizer(tiny_model_dir), chat=False, limit=48, cfg=cfg
    )
    assert len(loaded.records) == n and sizes == [prompts.LENGTH_CHUNK, prompts.LENGTH_CHUNK, 3]


# -------------------- one memory estimate for every command (issue 37 item 9, issue 45 item 4)


@pytest.fixture
def eight_gib(monkeypatch):
    """The memory available fixed at 8 GiB, for every command's estimate (glassrl.models.memory, glassrl.rl.memory)."""
    import glassrl.models.memory as shared
    import glassrl.rl.memory as step

    for module in (shared, step):
        monkeypatch.setattr(module, "available_bytes", lambda device: 8 * shared.GIB)


@pytest.mark.parametrize(
    "backend",
    [["trainer.backend=ray"], ["rollout.engine=vllm"]],
    ids=["ray-on-this-machine", "vllm"],
)
def test_trains_guard_also_counts_ray_and_vllm(backend, eight_gib, tiny_model_dir, prompt_files, tmp_path):
    """The step's estimate returned early for trainer.backend=ray and rollout.engine=vllm. A Ray cluster
    this process starts on CPU shares this machine: every term counts; vLLM sizes its own key-value cache."""
    import glassrl.rl.memory as memory
    from glassrl.errors import GlassrlError

    run = tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "run")
    big = ["batch.prompts_per_step=1000000", "batch.mini_batch_prompts=1000000", "batch.micro_batch_responses=8"]
    cfg, resolved = _resolved([*run, *big, *backend])
    with pytest.raises(GlassrlError, match=r"one step needs about \d+\.\d GiB") as caught:
        memory.check_step_fits(cfg, resolved, tiny_model_dir, 48)
    assert ("key-value cache" in str(caught.value)) == (backend == ["trainer.backend=ray"])


@pytest.mark.parametrize(
    "case",
    [
        "generate-n",
        "generate-positions",
        "generate-surrogate",
        "explain-sample",
        "explain-surrogate",
        "eval",
        "dpo",
        "kto",
        "sft",
        "rm",
    ],
)
def test_every_command_refuses_what_cannot_fit_before_loading(case, eight_gib, capsys, tmp_path, tiny_model_dir):
    """``generate --n 100000000`` and ``dpo batch_size=1000000`` had no estimate (a traceback or a hang);
    ``generate rollout.max_new_tokens=1000000000`` on the 64-position model ran until memory ran out;
    ``generate MODEL $'hi\\xff'`` was a traceback. Each is one line now, before the model loads."""
    model, out = str(tiny_model_dir), f"output_dir={tmp_path / 'out'}"
    argv, match = {
        "generate-n": (
            ["generate", model, "1+1=", "--n", "100000000"],
            r"--n 100000000 × 1 prompts: needs about \d+\.\d GiB \(key-value cache \d+\.\d, per-token tensors "
            r"\d+\.\d, weights 0\.0\), more than the 8\.0 GiB available on cpu; lower --n",
        ),
        "generate-positions": (
            ["generate", model, "1+1=", "rollout.max_new_tokens=1000000000"],
            r"rollout\.max_new_tokens = 1000000000: the longest prompt \(\d+ tokens\) \+ 1000000000 is more than "
            r"the model's 64 positions",
        ),
        "generate-surrogate": (
            ["generate", model, "hi\udcff"],
            r"command line: field 'PROMPT 1': \\udcff at character 2 is a lone surrogate",
        ),
        "explain-sample": (
            ["explain", "--model", model, "--prompt", "1+1=", "--sample", "100000000"],
            r"--sample 100000000 needs about \d+\.\d GiB \(key-value cache \d+\.\d, per-token tensors \d+\.\d, "
            r"logits \d+\.\d, weights 0\.0\), more than the 8\.0 GiB available on cpu; lower --sample",
        ),
        "explain-surrogate": (
            ["explain", "--model", model, "--prompt", "1+1=", "--response", "x\udcff"],
            r"command line: field '--response': \\udcff at character 1 is a lone surrogate",
        ),
        "eval": (
            [
                "eval",
                model,
                "task:arith-verify/test",
                "batch.prompts_per_step=10000000",
                "batch.mini_batch_prompts=10000000",
            ],
            r"batch\.prompts_per_step = 10000000 × rollout\.n = \d+: needs about .*key-value cache",
        ),
        "dpo": (
            ["dpo", "dpo", f"model={model}", "batch_size=1000000", out],
            r"batch_size = 1000000 × max_length = 64: needs about \d+\.\d GiB \(logits \d+\.\d, hidden states",
        ),
        "kto": (["dpo", "kto", f"model={model}", "batch_size=10000000", out], r"batch_size = 10000000 .*logits"),
        "sft": (["sft", "sft", f"model={model}", "batch_size=10000000", out], r"batch_size = 10000000 .*logits"),
        "rm": (
            ["rm", "rm", f"model={model}", "batch_size=100000000", out],
            r"batch_size = 100000000 pairs × max_length = 64: needs about \d+\.\d GiB \(hidden states",
        ),
    }[case]
    assert_one_error_line(capsys, argv, match)
    assert not (tmp_path / "out").exists()


def test_the_step_estimate_at_0_5b_counts_lora_the_critic_checkpointing_and_log_prob_chunks(tmp_path, monkeypatch):
    """Qwen2.5-0.5B's config.json and a safetensors file of its bf16 size (a header, the data sparse): the
    per-part figures change as LoRA, a critic, activation checkpointing and a token budget say they should
    (issue 40). The weights count at the dtype they load in (float32 on CPU), not at the file's bf16: the
    disk size halved them (16.6 GiB of PPO's weights read 8.3)."""
    import glassrl.rl.memory as memory
    from glassrl.builtin.qwen import ARCHITECTURES
    from glassrl.errors import GlassrlError

    ARCHITECTURES["qwen2.5-0.5b"]().save_pretrained(tmp_path)
    _sparse_safetensors(tmp_path / "model.safetensors", 494_032_768)
    base = [f"model.actor={tmp_path}", "batch.prompts_per_step=2", "batch.mini_batch_prompts=2", "rollout.n=8"]
    base += ["rollout.max_new_tokens=128", "batch.micro_batch_responses=8"]

    def terms(*more):
        return memory.step_memory(*_resolved([*base, *more]), tmp_path, 200)

    full, lora = terms(), terms("model.lora.r=8")
    weights = 494_032_768 * 4  # float32, as loaded on CPU
    assert terms("model.dtype=bfloat16")["weights"] == 5 * 494_032_768 * 2
    assert full["weights"] == 5 * weights  # the actor trains (× 4), π_ref for the KL (× 1)
    assert lora["weights"] == weights  # π_ref is the actor with its adapters off
    ppo = terms("algo.advantage=gae")
    assert ppo["weights"] == 9 * weights  # + a critic that trains (× 4)
    tokens = 8 * 328  # a micro-batch: 8 responses of 200 + 128 tokens
    assert full["update activations"] == tokens * 24 * (6 * 896 + 3 * 4864) * 4
    assert terms("model.gradient_checkpointing=true")["update activations"] == tokens * 24 * 896 * 4
    assert terms("batch.max_tokens_per_micro_batch=1024")["update activations"] == 1024 * 24 * (6 * 896 + 3 * 4864) * 4
    kept = 8 * 128 * 151_936 * 4  # the fused head's kept logits: 8 responses × 128 positions, within 1 GiB
    assert full["log-prob chunks"] == 3 * 128 * 151_936 * 4 + 151_936 * 896 * 4 + kept
    assert terms("rollout.max_new_tokens=512")["log-prob chunks"] == 3 * 128 * 151_936 * 4 + 151_936 * 896 * 4
    assert terms("model.compute_dtype=bfloat16")["log-prob chunks"] == full["log-prob chunks"]  # the fused head too
    cfg, resolved = _resolved([*base, "algo.advantage=gae"])
    monkeypatch.setattr(memory, "available_bytes", lambda device: 6 * 2**30)
    with pytest.raises(
        GlassrlError,
        match=r"weights 16\.6, update activations 4\.7, log-prob chunks 1\.3; .*model\.gradient_checkpointing",
    ):
        memory.check_step_fits(cfg, resolved, tmp_path, 200)


def _sparse_safetensors(path, elements: int) -> None:
    """A safetensors file of one bf16 tensor of ``elements`` elements: its header, then sparse data."""
    import json
    import struct

    header = json.dumps({"w": {"dtype": "BF16", "shape": [elements], "data_offsets": [0, 2 * elements]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + 2 * elements)


def test_a_supervised_trainer_counts_its_float32_weights_of_a_bf16_file(tmp_path, monkeypatch):
    """SFT, DPO and RM load float32 whatever the file holds: 4 copies of 4 bytes an element (issue 40)."""
    import glassrl.models.memory as memory
    from glassrl.builtin.qwen import ARCHITECTURES
    from glassrl.errors import GlassrlError

    ARCHITECTURES["qwen2.5-0.5b"]().save_pretrained(tmp_path)
    _sparse_safetensors(tmp_path / "model.safetensors", 494_032_768)
    assert memory.weight_bytes(tmp_path) == (tmp_path / "model.safetensors").stat().st_size  # as on disk
    assert memory.weight_bytes(tmp_path, 4) == 494_032_768 * 4
    monkeypatch.setattr(memory, "available_bytes", lambda device: 7 * 2**30)
    with pytest.raises(GlassrlError, match=r"weights 7\.4\)"):  # 4 × 1.84 GiB; the file's size read 3.7
        memory.check_training_fits(tmp_path, 1, 64, torch_cpu(), "sft:", "lower", vocabulary=True)


def torch_cpu():
    import torch

    return torch.device("cpu")


def test_the_step_estimate_counts_the_longest_prompt_read_not_the_positions_left(
    capsys, monkeypatch, tmp_path, tiny_model_dir, prompt_files
):
    """A model of 32,768 positions (Qwen2.5's) left a prompt limit of 32,752 tokens under
    data.max_prompt_tokens = auto, and the estimate counted every response at that length: 2 steps of
    the tiny model were refused with 1 GiB available (issue 40: every 0.5 B run asked for 40 GiB of
    activations). The longest prompt the data hold is what a response can start from."""
    import json
    import shutil

    import glassrl.rl.memory as memory
    from glassrl.cli import main

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 32_768}))
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2**30)
    seen = []
    refuse = memory.refuse_if_over
    monkeypatch.setattr(memory, "refuse_if_over", lambda terms, *a, **k: (seen.append(a[-1]), refuse(terms, *a, **k)))
    run = tiny_run_overrides(model, prompt_files, tmp_path / "run")
    assert main(["train", "grpo", *run, "steps=1"]) == 0, capsys.readouterr().err
    assert "responses of up to 32752" not in seen[0] and "+ 16 tokens" in seen[0]
