"""What ends a response: stop tokens and stop strings (one rule for every rollout engine).

A response ends at the first of:

- a **stop token**: the tokenizer's EOS; every EOS id of the model's ``generation_config``
  (its ``eos_token_id`` is an int or a list: Llama 3 Instruct lists ``<|end_of_text|>`` and
  ``<|eot_id|>``); the chat template's **end-of-turn token**, the special token the template
  writes right after an assistant message (ChatML's ``<|im_end|>``, Gemma's ``<end_of_turn>``,
  Phi-3's ``<|end|>``: :func:`end_of_turn_id`);
- the token that completes a **stop string** (``rollout.stop``) in the decoded response text
  (special tokens kept in the text).

The stopping token is part of the response, as EOS is (glassrl.rollout.base, the EOS
convention): ``response_mask`` is True on it, the outcome score sits on it, and it trains, so
the policy learns when to stop; tokens after it are padding; the finish reason is "stop".
A stop string stays in the response's text (it was generated and trains); a stop token that is
a special token does not (texts are decoded without special tokens).

Why the end-of-turn token: a chat model ends its turn with it, and many tokenizers' EOS is
another token (Qwen2.5's: EOS ``<|endoftext|>``, turns end with ``<|im_end|>``). Stopping at
EOS alone lets every response run through ``<|im_end|>`` into a made-up next turn until
``max_new_tokens`` (issue 13: 8 of 8 responses did).

Stop strings while decoding: after each token, the last :attr:`StopSet.window` tokens of a row
are decoded and searched. A string of L UTF-8 bytes lies within the last L tokens that wrote it
(every token writes at least one byte), and one token more is decoded because some decoders
treat a text's first token differently (a leading space dropped). The response's exact end is
then found on the whole text (:meth:`StopSet.end`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import StoppingCriteria

from glassrl.data.chat_template import render_chat

# Assistant content the end-of-turn probe renders; a template may trim or reformat content, not this.
PROBE = "glassrl end-of-turn probe"

# How a response ended: at a stop token, at a stop string, or neither (it ran out of tokens).
TOKEN, STRING = "token", "string"


@dataclass(frozen=True)
class StopSet:
    """Stop token ids (sorted, distinct) and stop strings (module docstring)."""

    ids: tuple[int, ...]
    strings: tuple[str, ...] = ()

    def with_strings(self, strings: Sequence[str]) -> StopSet:
        """These stop ids with ``strings`` added (the agent's ``</call>`` to the run's ``rollout.stop``)."""
        return StopSet(self.ids, tuple(dict.fromkeys((*self.strings, *strings))))

    @property
    def window(self) -> int:
        """Tokens at the end of a response that hold any stop string its last token completed, plus one."""
        return max((len(s.encode("utf-8")) for s in self.strings), default=0) + 1

    def has_string(self, text: str) -> bool:
        return any(s in text for s in self.strings)

    def completes_string(self, tails: list[list[int]], decode: Callable[[list[list[int]]], list[str]]) -> list[bool]:
        """Per row: its last token completed a stop string. ``tails``: the last :attr:`window`
        tokens of each row still writing; ``decode``: token-id lists -> texts, special tokens kept."""
        return [self.has_string(text) for text in decode(tails)]

    def end(self, tokens: Sequence[int], decode: Callable[[list[int]], str]) -> tuple[int, str | None]:
        """(the response's length in ``tokens``, how it ended): through the first stop token
        (TOKEN), or through the token that completes the first stop string (STRING), whichever
        comes first; (len(tokens), None) when neither occurs. ``decode``: ids -> text, special
        tokens kept."""
        stops = set(self.ids)
        first = next((i for i, t in enumerate(tokens) if t in stops), None)
        before = list(tokens if first is None else tokens[:first])
        if self.strings and self.has_string(decode(before)):
            lo, hi = 1, len(before)  # the shortest prefix whose text holds a stop string
            while lo < hi:
                mid = (lo + hi) // 2
                if self.has_string(decode(before[:mid])):
                    hi = mid
                else:
                    lo = mid + 1
            return lo, STRING
        if first is not None:
            return first + 1, TOKEN
        return len(tokens), None

    def response_mask(
        self, response_ids: torch.Tensor, decode: Callable[[list[int]], str]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(response_mask (B, T) bool: True up to and including each row's stop, everywhere in a
        row without one; stopped (B,) bool: the row ended at a stop token or string).

        response_ids (B, T) long; ``decode`` as :meth:`end` (read only when there are stop strings).
        """
        is_stop = torch.isin(response_ids, torch.tensor(self.ids, dtype=torch.long, device=response_ids.device))
        if not self.strings:
            stops_before = is_stop.long().cumsum(-1) - is_stop.long()  # (B, T) stop tokens strictly before i
            return stops_before == 0, is_stop.any(-1)
        ends = [self.end(row, decode) for row in response_ids.tolist()]
        lengths = torch.tensor([n for n, _ in ends], device=response_ids.device)  # (B,)
        positions = torch.arange(response_ids.shape[1], device=response_ids.device)  # (T,)
        stopped = torch.tensor([how is not None for _, how in ends], device=response_ids.device)
        return positions[None, :] < lengths[:, None], stopped


class StopStringCriteria(StoppingCriteria):
    """``model.generate``'s criterion for :class:`StopSet`'s strings: a row is done when its last
    token completed one (the check of the decoding loop, glassrl.rollout.hf.decode, so both
    sampling paths stop at the same token). ``prompt_width``: columns of ``input_ids`` before the
    first generated token."""

    def __init__(self, stops: StopSet, decode: Callable[[list[list[int]]], list[str]], prompt_width: int) -> None:
        self.stops, self.decode, self.prompt_width = stops, decode, prompt_width

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        start = max(self.prompt_width, input_ids.shape[1] - self.stops.window)
        done = self.stops.completes_string(input_ids[:, start:].tolist(), self.decode)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def generation_eos_ids(generation_config) -> tuple[int, ...]:
    """The EOS ids of a model's ``generation_config`` (its ``eos_token_id``: None, an int or a list)."""
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is None:
        return ()
    return (int(eos),) if isinstance(eos, int) else tuple(int(i) for i in eos)


def special_ids(tokenizer) -> set[int]:
    """Ids of the tokenizer's special tokens: its named and additional ones, and every added token marked special."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return set(tokenizer.all_special_ids) | {i for i, token in added.items() if getattr(token, "special", False)}


def end_of_turn_id(tokenizer) -> int | None:
    """The special token the chat template writes right after an assistant message's content
    (``<|im_end|>`` for ChatML); None without a chat template, when the template writes no special
    token there, or when it cannot render a user/assistant exchange.

    Found by rendering [user, assistant = :data:`PROBE`] and taking the first special token of
    what follows the probe: the token a model trained on the template writes to end its turn.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        return None
    messages = [{"role": "user", "content": "1+1=?"}, {"role": "assistant", "content": PROBE}]
    try:
        text = render_chat(tokenizer, messages)
    except Exception:  # noqa: BLE001 - a user's template may refuse this exchange in any way; then none is detected
        return None
    if not isinstance(text, str) or PROBE not in text:
        return None
    after = tokenizer.encode(text[text.rindex(PROBE) + len(PROBE) :], add_special_tokens=False)
    specials = special_ids(tokenizer)
    return next((i for i in after if i in specials), None)


def stop_sources(tokenizer, generation_config=None) -> dict[int, list[str]]:
    """Each stop token id -> where it comes from ("tokenizer EOS", "generation_config",
    "chat template end of turn"), in id order."""
    sources: dict[int, list[str]] = {}
    found = [(tokenizer.eos_token_id, "tokenizer EOS")]
    found += [(i, "generation_config") for i in generation_eos_ids(generation_config)]
    found.append((end_of_turn_id(tokenizer), "chat template end of turn"))
    for token_id, source in found:
        if token_id is not None and source not in sources.setdefault(token_id, []):
            sources[token_id].append(source)
    return dict(sorted(sources.items()))


def stop_set(tokenizer, generation_config=None, strings: Sequence[str] = ()) -> StopSet:
    """The stop tokens of ``tokenizer`` and ``generation_config`` (the model's; None: the
    tokenizer's alone) and the stop ``strings`` (``rollout.stop``)."""
    return StopSet(tuple(stop_sources(tokenizer, generation_config)), tuple(dict.fromkeys(strings)))


def describe(tokenizer, generation_config=None, strings: Sequence[str] = ()) -> str:
    """The start-up line naming every stop token (and why) and every stop string."""
    tokens = ", ".join(
        f"{tokenizer.convert_ids_to_tokens(i)} ({'; '.join(why)})"
        for i, why in stop_sources(tokenizer, generation_config).items()
    )
    texts = ", ".join(repr(s) for s in dict.fromkeys(strings)) or "none (rollout.stop)"
    return f"responses stop at: {tokens or 'no token'}; stop strings: {texts}"


def saved_generation_config(path):
    """The ``generation_config`` a checkpoint directory's model loads with: its
    generation_config.json, else the one transformers derives from its config.json."""
    from transformers import AutoConfig, GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path, local_files_only=True)
    except OSError:
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(path, local_files_only=True))
