"""A generative judge: a local causal LM answers a rubric question; its number is the score.

This is the RLAIF setting (Bai et al. 2022, Constitutional AI, §4; Lee et al. 2023,
RLAIF): instead of a trained reward model, a language model is asked about each
(prompt, response) and its answer is parsed. The question is ``question_template``
formatted with ``{prompt}``, ``{response}`` and ``{answer}`` (the reference answer,
"" when there is none); with a chat template it is sent as the user's message.
The first match of ``parse`` (its first group, if it has one) is read as a number
in [0, ``max_score``] and divided by ``max_score``, so the score lies in [0, 1]
and the judge can score a rubric criterion.

Decoding is greedy, so the same question gets the same answer.

Timeout: ``timeout_s`` bounds each ``generate`` call (one batch of questions),
enforced by transformers' ``max_time`` stopping criterion, which is checked after
every generated token from whatever thread runs it — unlike ``signal.alarm``,
which works in the main thread only. The judge is our code running a model
already in memory, so a cooperative deadline suffices (user code, which may hang
anywhere, runs in a killable process instead: :mod:`glassrl.worker_pool`).
An answer that had neither ended (EOS) nor reached ``max_new_tokens`` when the
time ran out is a ``timeout`` result; an answer without a parsable score is an
``error`` result carrying the judge's text.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

from glassrl.data.formatting import as_chat, format_prompts
from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardRequest, RewardResult

_FIELDS = {"prompt", "response", "answer"}


class JudgeSource:
    """Scores responses by asking the causal LM at ``model_path`` a question about each."""

    name = "judge"

    def __init__(
        self,
        model_path: str,
        question_template: str,
        parse: str = r"-?\d+(?:\.\d+)?",
        max_score: float = 10.0,
        max_new_tokens: int = 32,
        timeout_s: float = 60.0,
        batch_size: int = 8,
        dtype: str = "auto",
        device: str = "auto",
    ) -> None:
        fields = {name for _, name, _, _ in string.Formatter().parse(question_template) if name is not None}
        if fields - _FIELDS:
            raise GlassrlError(
                f"judge: question_template uses {{{sorted(fields - _FIELDS)[0]}}}; "
                "valid fields: {prompt}, {response}, {answer}"
            )
        if "response" not in fields:
            raise GlassrlError("judge: question_template must contain {response}, or the judge never sees the response")
        try:
            self.parse = re.compile(parse)
        except re.error as err:
            raise GlassrlError(f"judge: parse {parse!r} is not a regular expression: {err}") from None
        if not max_score > 0 or not timeout_s > 0 or max_new_tokens < 1 or batch_size < 1:
            raise GlassrlError(
                "judge: max_score and timeout_s must be > 0, max_new_tokens and batch_size >= 1; got "
                f"{max_score}, {timeout_s}, {max_new_tokens}, {batch_size}"
            )
        # torch and transformers load when a judge is built, so that importing
        # glassrl.rewards stays torch-free (worker_pool.py's user-function worker imports it)
        from glassrl.models import load_causal_lm, load_tokenizer

        self.model = load_causal_lm(model_path, dtype=dtype, device=device)
        self.tokenizer = load_tokenizer(model_path)
        self.tokenizer.padding_side = "left"  # generation continues the prompt's last token
        self.question_template = question_template
        self.max_score = float(max_score)
        self.max_new_tokens = max_new_tokens
        self.timeout_s = float(timeout_s)
        self.batch_size = batch_size

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        results = []
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start : start + self.batch_size]
            questions = [self._question(r) for r in chunk]
            results.extend(self._read(text, finished) for text, finished in self._generate(questions))
        return results

    def _question(self, request: RewardRequest) -> str:
        answer = request.record.answer if request.record.answer is not None else ""
        return self.question_template.format(prompt=request.prompt, response=request.response, answer=answer)

    def _generate(self, questions: list[str]) -> list[tuple[str, bool]]:
        """Greedy answers to ``questions``; each with whether it finished (EOS or max_new_tokens)."""
        import torch  # see __init__

        tok = self.tokenizer
        # the question holds the policy's response: its text is read as text (glassrl.data.formatting)
        prompts = [as_chat(q) if tok.chat_template else q for q in questions]
        enc = tok.pad({"input_ids": format_prompts(tok, prompts)}, return_tensors="pt")
        device = next(self.model.parameters()).device
        with torch.no_grad():
            out = self.model.generate(
                input_ids=enc["input_ids"].to(device),
                attention_mask=enc["attention_mask"].to(device),
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                max_time=self.timeout_s,
                pad_token_id=tok.pad_token_id,
            )
        new = out[:, enc["input_ids"].shape[1] :].tolist()  # (B, N), N <= max_new_tokens
        answers = []
        for row in new:
            ended = tok.eos_token_id in row
            if ended:
                row = row[: row.index(tok.eos_token_id)]
            answers.append((tok.decode(row, skip_special_tokens=True), ended or len(new[0]) == self.max_new_tokens))
        return answers

    def _read(self, text: str, finished: bool) -> RewardResult:
        details = {"judge_text": text}
        if not finished:
            message = f"judge did not finish within {self.timeout_s:g} s; partial answer {text!r}"
            return RewardResult.timeout(message, details)
        match = self.parse.search(text)
        if match is None:
            return RewardResult.error(f"no score in the judge's answer {text!r}", details)
        raw = match.group(1) if self.parse.groups else match.group(0)
        try:
            value = float(raw)
        except ValueError:
            return RewardResult.error(f"judge score {raw!r} is not a number (answer {text!r})", details)
        if not 0.0 <= value <= self.max_score:
            message = f"judge score {value:g} is outside [0, {self.max_score:g}] (answer {text!r})"
            return RewardResult.error(message, details)
        return RewardResult.ok(value / self.max_score, details={**details, "judge_score": value})
