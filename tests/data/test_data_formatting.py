"""Prompt formatting: plain text is BOS + text, chat messages go through the template."""

from __future__ import annotations

import pytest

from glassrl.data.formatting import as_chat, format_prompt, format_prompts, prompt_text, truncate_left
from glassrl.data.tasks import TASKS, sft_pairs
from glassrl.errors import GlassrlError
from glassrl.models.default_tokenizer import build_tokenizer

MESSAGES = ({"role": "user", "content": "请问1+1=2？"},)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer([p + a for task in TASKS for p, a in sft_pairs(task, "train")])


def test_plain_text_is_bos_then_text(tokenizer):
    text_ids = tokenizer("请问1+1=2？", add_special_tokens=False)["input_ids"]
    assert format_prompt(tokenizer, "请问1+1=2？") == [tokenizer.bos_token_id, *text_ids]


def test_messages_use_the_chat_template(tokenizer):
    text_ids = tokenizer("请问1+1=2？", add_special_tokens=False)["input_ids"]
    bos, user, assistant = (tokenizer.convert_tokens_to_ids(t) for t in ("<|bos|>", "<|user|>", "<|assistant|>"))
    assert format_prompt(tokenizer, MESSAGES) == [bos, user, *text_ids, assistant]


def test_batched_equals_one_by_one_in_order(tokenizer):
    prompts = ["1+1=", MESSAGES, "Is 3+4=8?", MESSAGES]
    assert format_prompts(tokenizer, prompts) == [format_prompt(tokenizer, p) for p in prompts]


def test_prompt_text_is_what_the_ids_encode(tokenizer):
    assert prompt_text(tokenizer, "1+1=") == "1+1="
    assert prompt_text(tokenizer, MESSAGES) == "<|bos|><|user|>请问1+1=2？<|assistant|>"
    ids = tokenizer(prompt_text(tokenizer, MESSAGES), add_special_tokens=False)["input_ids"]
    assert ids == format_prompt(tokenizer, MESSAGES)


def test_messages_without_template_is_an_error():
    tokenizer = build_tokenizer(["1+1=2"])
    tokenizer.chat_template = None
    with pytest.raises(GlassrlError, match="no chat template"):
        format_prompt(tokenizer, [{"role": "user", "content": "hi"}])


def test_as_chat_makes_text_a_user_message_and_puts_the_system_prompt_first():
    user = {"role": "user", "content": "1+1="}
    system = {"role": "system", "content": "Be brief."}
    assert as_chat("1+1=") == (user,)
    assert as_chat("1+1=", "Be brief.") == (system, user)
    assert as_chat((user,), "Be brief.") == (system, user)
    own = {"role": "system", "content": "Mine."}
    assert as_chat((own, user), "Be brief.") == (own, user)  # a prompt's own system message stays


def test_truncate_left_keeps_the_last_tokens():
    assert truncate_left([1, 2, 3, 4, 5], 3) == [3, 4, 5]
    assert truncate_left([1, 2], 3) == [1, 2]
    assert truncate_left([1, 2, 3], 3) == [1, 2, 3]
