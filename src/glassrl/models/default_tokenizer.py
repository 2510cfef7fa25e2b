"""The default model's tokenizer: byte-level BPE trained on the bundled tasks' text.

Pre-tokenisation, in order:
1. every Chinese character is its own piece, except the words of ``ZH_WORDS`` (a one-word
   lexicon, as a word segmenter would give): so "是的，等于2！" becomes
   [是, 的, ，, 等于, 2, ！], the token list of the reference documents;
2. every digit is its own piece (numbers are read digit by digit);
3. GPT-2's byte-level split (Radford et al. 2019, §2.2): no unknown characters, ever.

BPE merges then join the bytes of each frequent piece into one token. The vocabulary is the
256 bytes, the special tokens and the merges the training text asks for (about 30 here):
``vocab_size`` is an upper bound.

A plain-text prompt is encoded as BOS + text (the post-processor adds BOS); chat messages go
through ``CHAT_TEMPLATE``. See :func:`glassrl.data.formatting.format_prompt`.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, USER, ASSISTANT = "<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, USER, ASSISTANT)  # ids 0..4 in this order
ZH_WORDS = ("等于",)

# <|bos|><|user|>question<|assistant|>answer<|eos|> ... ; generation starts after <|assistant|>.
CHAT_TEMPLATE = (
    "<|bos|>{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>{{ m['content'] }}<|eos|>"
    "{% else %}<|user|>{{ m['content'] }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(
    texts: Iterable[str], *, vocab_size: int = 512, model_max_length: int = 128, isolate: bool = True
) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer on ``texts``; deterministic for the same texts.
    ``isolate`` False leaves out steps 1 and 2 of the pre-tokenisation (module docstring): BPE then
    merges Chinese phrases ("营收为", "万亿美元") and numbers (" 2025", "27") too, as GPT-2's does
    (the research agent's: glassrl.builtin.research_model)."""
    han = "|".join(ZH_WORDS) + r"|\p{Han}"
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    isolating = [
        pre_tokenizers.Split(Regex(han), behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True),
    ]
    tok.pre_tokenizer = pre_tokenizers.Sequence([*isolating, byte_level]) if isolate else byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[USER, ASSISTANT],
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        padding_side="left",  # prompts are left-padded (batch layout of glassrl.optim)
    )
