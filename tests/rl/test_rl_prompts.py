"""The run's prompts (glassrl.rl.prompts): a ChatML tokenizer's template and system prompt on
text prompts, the default model kept on plain text, the prompt limit (auto = positions − new
tokens), the overlong rules with their counts, and the weighted mixture with exact resume."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from rich.console import Console
from transformers import LlamaForCausalLM

from glassrl.config import load_config
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.ledger import read_jsonl
from glassrl.rl.config import TrainConfig
from glassrl.rl.loop import Trainer
from glassrl.rl.prompts import MixtureStream, applies_template, build_prompts, prompt_limit
from glassrl.run import state
from glassrl.run.checkpoint import CheckpointManager
from helpers import chatml_tokenizer, tiny_llama_config

QUESTIONS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
    "Betty is saving money for a new wallet which costs $100. Betty has only half of the money she needs. "
    "Her parents decided to give her $15 for that purpose, and her grandparents twice as much as her parents. "
    "How much more money does Betty need to buy the wallet?",
    "James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?",
    "What is 3+4?",
    "Is 2+2=4?",
]


@pytest.fixture(scope="module")
def chatml():
    """A tiny byte-level BPE with Qwen's <|im_start|>/<|im_end|> and EOS <|endoftext|> (not <|im_end|>)."""
    return chatml_tokenizer(QUESTIONS * 3)


@pytest.fixture(scope="module")
def default_tokenizer():
    from glassrl.models.default_tokenizer import build_tokenizer

    return build_tokenizer(QUESTIONS)


def model_dir(tmp_path, positions: int):
    """A directory with only a model config.json (the limit reads positions without weights)."""
    tiny_llama_config(400, max_position_embeddings=positions).save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def gsm8k_file(tmp_path, questions=QUESTIONS):
    path = tmp_path / "gsm8k.jsonl"
    rows = [{"question": q, "answer": f"...\n#### {i}"} for i, q in enumerate(questions)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def config(*overrides) -> TrainConfig:
    return load_config(TrainConfig, None, ["data.eval_size=0", *overrides])


def test_a_chatml_tokenizer_renders_text_prompts_with_the_template_and_the_system_prompt(chatml, tmp_path):
    data = gsm8k_file(tmp_path)
    cfg = config(f"data.train={data}", "data.prompt_key=question", "data.system_prompt=Reason step by step.")
    prompts = build_prompts(cfg, chatml, model_dir(tmp_path, 512))
    records = prompts.sources[0].records
    assert [r.prompt for r in records] == [
        ({"role": "system", "content": "Reason step by step."}, {"role": "user", "content": q}) for q in QUESTIONS
    ]
    text = chatml.decode(prompts.ids(records[:1])[0])
    assert text.startswith("<|im_start|>system\nReason step by step.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert prompts.limit == 512 - 16 and "auto: the model's 512 positions" in prompts.limit_text
    assert "the tokenizer's chat template" in prompts.summary()[-1]
    # without a system prompt the template's own default system message appears
    plain = build_prompts(config(f"data.train={data}", "data.prompt_key=question"), chatml, model_dir(tmp_path, 512))
    assert chatml.decode(plain.ids(plain.sources[0].records[:1])[0]).startswith(
        "<|im_start|>system\nYou are a helpful assistant."
    )
    # data.chat_template = none: text stays text (no template, no BOS in this tokenizer)
    none = build_prompts(
        config(f"data.train={data}", "data.prompt_key=question", "data.chat_template=none"), chatml, tmp_path / "model"
    )
    record = none.train.take(1)[0]
    assert isinstance(record.prompt, str) and chatml.decode(none.ids([record])[0]) == record.prompt


def test_auto_keeps_the_default_model_on_plain_text(chatml, default_tokenizer):
    assert applies_template(chatml, "auto") and not applies_template(chatml, "none")
    # the default model's tokenizer has a template for chat messages, but the model answers plain prompts
    assert default_tokenizer.chat_template and not applies_template(default_tokenizer, "auto")
    saved = chatml.chat_template
    chatml.chat_template = None
    try:
        assert not applies_template(chatml, "auto")
    finally:
        chatml.chat_template = saved


def test_a_system_prompt_with_plain_text_prompts_is_an_error(default_tokenizer, tmp_path):
    data = gsm8k_file(tmp_path)
    cfg = config(f"data.train={data}", "data.prompt_key=question", "data.system_prompt=Be brief.")
    with pytest.raises(GlassrlError, match=r"^data.system_prompt: the text prompts of data.train stay plain text "):
        build_prompts(cfg, default_tokenizer, model_dir(tmp_path, 512))


def overlong(chatml, tmp_path, policy: str, limit: int):
    data = gsm8k_file(tmp_path)
    cfg = config(
        f"data.train={data}",
        "data.prompt_key=question",
        f"data.max_prompt_tokens={limit}",
        f"data.overlong_prompts={policy}",
    )
    return build_prompts(cfg, chatml, model_dir(tmp_path, 512))


def lengths(chatml, tmp_path):
    data = gsm8k_file(tmp_path)
    prompts = build_prompts(config(f"data.train={data}", "data.prompt_key=question"), chatml, model_dir(tmp_path, 512))
    return [len(ids) for ids in prompts.ids(prompts.sources[0].records)]


def test_overlong_prompts_error_by_default_naming_the_count_the_first_row_and_the_way_out(chatml, tmp_path):
    n = lengths(chatml, tmp_path)
    limit = sorted(n)[1]  # 2 prompts fit, 4 do not
    assert len(set(n)) == len(n)
    over = [i for i, length in enumerate(n) if length > limit]
    with pytest.raises(GlassrlError) as info:
        overlong(chatml, tmp_path, "error", limit)
    message = str(info.value)
    path = tmp_path / "gsm8k.jsonl"
    assert message == (
        f"data.train = '{path}': 4 of 6 prompts are longer than the prompt limit of {limit} tokens "
        f"(data.max_prompt_tokens; first: {path}:{over[0] + 1}, {n[over[0]]} tokens; longest {max(n)}); "
        "raise data.max_prompt_tokens, or set data.overlong_prompts = drop | truncate_left"
    )
    cfg = config(f"data.train={path}", "data.prompt_key=question", "rollout.max_new_tokens=440")
    with pytest.raises(GlassrlError, match=r"\(auto: the model's 512 positions − rollout.max_new_tokens = 440; first"):
        build_prompts(cfg, chatml, tmp_path / "model")


def test_drop_and_truncate_left_are_counted(chatml, tmp_path):
    n = lengths(chatml, tmp_path)
    limit = sorted(n)[1]
    dropped = overlong(chatml, tmp_path, "drop", limit)
    assert len(dropped.sources[0].records) == 2
    assert dropped.metrics() == {"data/prompts_dropped": 4, "data/prompts_truncated": 0}
    longest = max(n)
    assert dropped.summary()[0] == (
        f"data.train: {tmp_path / 'gsm8k.jsonl'}: 6 prompts read, longest {longest} tokens; 4 dropped, 0 truncated; "
        "2 kept, 2 with an answer"
    )

    cut = overlong(chatml, tmp_path, "truncate_left", limit)
    assert cut.metrics() == {"data/prompts_dropped": 0, "data/prompts_truncated": 4}
    records = cut.sources[0].records
    ids = cut.ids(records)
    assert [len(x) for x in ids] == [min(length, limit) for length in n]
    full = build_prompts(
        config(f"data.train={tmp_path / 'gsm8k.jsonl'}", "data.prompt_key=question"), chatml, tmp_path / "model"
    ).ids(records)
    assert all(x == f[-limit:] for x, f in zip(ids, full))  # the end (question, generation prompt) stays
    with pytest.raises(GlassrlError, match="all 6 prompts are longer than the prompt limit of 3 tokens"):
        overlong(chatml, tmp_path, "drop", 3)


def test_the_limit_adapts_to_the_model_and_must_fit_it(tmp_path):
    assert prompt_limit(config(), 64, tmp_path)[0] == 48  # the default model: 64 positions − 16 new tokens
    assert prompt_limit(config("rollout.max_new_tokens=512"), 32768, tmp_path)[0] == 32256
    assert prompt_limit(config("data.max_prompt_tokens=40"), 64, tmp_path) == (40, "data.max_prompt_tokens")
    with pytest.raises(GlassrlError, match=r"data.max_prompt_tokens \+ rollout.max_new_tokens = 60 \+ 16 is more"):
        prompt_limit(config("data.max_prompt_tokens=60"), 64, tmp_path)
    with pytest.raises(GlassrlError, match="rollout.max_new_tokens = 64: leaves no room for a prompt"):
        prompt_limit(config("rollout.max_new_tokens=64"), 64, tmp_path)
    with pytest.raises(GlassrlError, match="gives no max_position_embeddings; set a number"):
        prompt_limit(config(), None, tmp_path)


def records(name: str, n: int) -> list[PromptRecord]:
    return [PromptRecord(f"{name}{i}", source=f"{name}#{i}") for i in range(n)]


def test_a_mixture_draws_sources_by_weight_and_each_source_in_its_own_order():
    stream = MixtureStream([records("a", 5), records("b", 7)], [3.0, 1.0], seed=0, keys=["x[0]", "x[1]"])
    drawn = stream.take(4000)
    counts = Counter(r.source[0] for r in drawn)
    assert abs(counts["a"] / 4000 - 0.75) < 0.03  # 0.75 ± 4.4 standard deviations
    a = [r.prompt for r in drawn if r.source[0] == "a"]
    assert sorted(a[:5]) == [f"a{i}" for i in range(5)]  # each epoch of a source visits each record once


def test_a_mixture_resumes_exactly_through_a_checkpoint(tmp_path):
    def fresh():
        return MixtureStream([records("a", 5), records("b", 3)], [1.0, 2.0], seed=4, keys=["x[0]", "x[1]"])

    whole = fresh()
    expected = [r.source for r in whole.take(17)]
    first = fresh()
    head = [r.source for r in first.take(6)]
    manager = CheckpointManager(tmp_path / "ckpt", keep=1)
    counters = state.Counters()
    counters.step = 1  # a checkpoint's counters say its own step (glassrl.run.state.check_restored)
    state.save(manager, 1, [first, counters])
    resumed = fresh()
    state.restore(manager, [resumed, state.Counters()])
    assert head + [r.source for r in resumed.take(11)] == expected
    other = MixtureStream([records("a", 5)], [1.0], seed=4, keys=["x[0]"])
    with pytest.raises(GlassrlError, match="a mixture of 2 sources, but data.train now has 1"):
        state.restore(manager, [other, state.Counters()])


@pytest.mark.slow
def test_build_prompts_mixes_a_file_and_a_task(chatml, tmp_path):
    data = gsm8k_file(tmp_path)
    cfg = config(f"data.train=[{{path: {data}, weight: 1, prompt_key: question}}, {{path: task:add, weight: 1}}]")
    prompts = build_prompts(cfg, chatml, model_dir(tmp_path, 512))
    assert isinstance(prompts.train, MixtureStream)
    assert [s.key for s in prompts.sources] == ["data.train[0]", "data.train[1]"]
    assert len(prompts.sources[0].records) == len(QUESTIONS) and len(prompts.sources[1].records) == 8000
    assert "data.train mixture: data.train[0] 50%, data.train[1] 50% of the prompts drawn" in prompts.summary()
    assert {r.source.startswith("task:add") for r in prompts.train.take(50)} == {True, False}


def test_a_run_on_gsm8k_with_a_chatml_model(chatml, tmp_path):
    """GSM8K's own file, a ChatML tokenizer with a system prompt, the numeric reward: the trainer
    reads the columns, renders the template, says so at start, and evaluates with the reward."""
    model = tmp_path / "chatml-model"
    llama_config = tiny_llama_config(len(chatml), max_position_embeddings=256, eos_token_id=chatml.eos_token_id)
    LlamaForCausalLM(llama_config).save_pretrained(model)
    chatml.save_pretrained(model)
    data, out = gsm8k_file(tmp_path), tmp_path / "run"
    overrides = [
        f"model.actor={model}",
        f"data.train={data}",
        f"data.test={data}",
        "data.prompt_key=question",
        "data.system_prompt=Reason step by step.",
        "data.eval_size=4",
        "reward.sources=[{name: numeric}]",
        f"output_dir={out}",
        "steps=1",
        "rollout.n=2",
        "rollout.max_new_tokens=8",
        "rollout.stop=['####']",
        "batch.prompts_per_step=2",
        "batch.mini_batch_prompts=2",
        "batch.micro_batch_responses=4",
        "logging.ledger_every=1",
        "logging.report=false",
    ]
    console = Console(record=True, width=300)
    Trainer(load_config(TrainConfig, None, overrides), console=console, progress=False).train()
    text = console.export_text()
    assert f"data.train: {data}: 6 prompts read, longest " in text
    assert "0 dropped, 0 truncated; 6 kept, 6 with an answer" in text
    assert "max prompt length: 248 tokens (auto: the model's 256 positions − rollout.max_new_tokens = 8)" in text
    assert "text prompts: the tokenizer's chat template (data.chat_template = auto)" in text
    assert (
        "responses stop at: <|endoftext|> (tokenizer EOS; generation_config), <|im_end|> (chat template end "
        "of turn); stop strings: '####'"
    ) in text
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"eval/accuracy", "eval/reward/numeric/mean"} <= set(rows[0]) and rows[0]["eval/reward/failure_rate"] == 0
    assert rows[1]["data/prompts_dropped"] == 0 and rows[1]["data/prompts_truncated"] == 0
    ledger = read_jsonl(out / "ledgers" / "step_000001.jsonl")
    assert all(r.prompt.startswith("<|im_start|>system\nReason step by step.<|im_end|>\n") for r in ledger.responses)


def test_the_rollout_engines_stop_at_the_templates_turn_end_and_at_rollout_stop(chatml):
    """Issue 13: the ChatML tokenizer's EOS is <|endoftext|>; its turns end with <|im_end|>."""
    from glassrl.rl.build import rollout_engine
    from glassrl.rollout.stops import StopSet

    model = LlamaForCausalLM(tiny_llama_config(len(chatml), eos_token_id=chatml.eos_token_id, bos_token_id=None))
    expected = StopSet((chatml.eos_token_id, chatml.convert_tokens_to_ids("<|im_end|>")), ("####",))
    assert rollout_engine(config("rollout.stop=['####']"), model, chatml).stops == expected
    agent = rollout_engine(config("data.train=task:tool-add", "rollout.stop=['####']"), model, chatml)
    assert agent.sampler.stops == expected  # the call format's </call> joins per turn
