"""Chat templates rendered within bounds: the one renderer of every chat template glassrl applies
(a tokenizer's own, ``glassrl audit --chat-template FILE``'s, any a config names).

A chat template is Jinja code that came with a model or from a user. transformers renders it in
Jinja's ``ImmutableSandboxedEnvironment`` (``transformers.utils.chat_template_utils``), which keeps
it from Python's internals but not from the machine's memory or time: ``{{ 'x' * 10**10 }}``
allocated until the OOM killer came. Here the template is compiled once, in the same sandbox with
the same globals and filters as transformers' (``raise_exception``, ``tojson``, ``strftime_now``,
``namespace``, ``dict``, the ``{% generation %}`` tag: taken from transformers' own environment, so
a template renders to the same text), and rendered within two bounds:

- **size**: no text, list or number the template builds holds more than :data:`MAX_CHARS`
  characters (items, digits), and the rendered text neither: checked at every ``*``, ``**``, ``+``
  and ``%``, every call and filter (an argument larger than that is refused before the call), every
  ``namespace`` write, and every piece of output;
- **time**: :data:`MAX_SECONDS` per rendering, checked at the same places and at each step of a
  ``range`` loop.

A template that breaks a bound, one Jinja cannot parse, one that reaches what the sandbox keeps out
(``cycler.__init__.__globals__``) and one that raises (``raise_exception``) are each one
:class:`GlassrlError` line naming the template (its file, or the tokenizer's directory) and, where
Jinja knows it, the line.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

import jinja2
import jinja2.sandbox

from glassrl.errors import GlassrlError

MAX_CHARS = 1 << 24  # 16 Mi characters: ~100 times the longest prompt a 32 k-position model reads
MAX_SECONDS = 10.0  # a real template renders in milliseconds
SOURCE_ATTR = "glassrl_chat_template_source"  # set on a tokenizer whose template came from elsewhere


class _Bound(jinja2.exceptions.TemplateError):
    """A size or time bound broken while rendering (module docstring)."""


_clock = threading.local()  # the running rendering's deadline (tool workers render in threads)


def _tick() -> None:
    deadline = getattr(_clock, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise _Bound(f"rendering took more than {MAX_SECONDS:g} s")


def _size(value: Any) -> int:
    """Characters, items or decimal digits (about bits·0.3) of ``value``; 0 for anything else."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value.bit_length() * 3 // 10
    if isinstance(value, (str, bytes, list, tuple, dict)):
        return len(value)
    return 0


def _check(value: Any, what: str) -> Any:
    if _size(value) > MAX_CHARS:
        raise _Bound(f"{what} would hold more than {MAX_CHARS} characters")
    return value


def _product_size(operator: str, left: Any, right: Any) -> int:
    """The size of ``left operator right`` before it is computed (``*`` and ``**`` only)."""
    if operator == "*" and isinstance(left, int) and not isinstance(right, int):
        left, right = right, left
    if operator == "*" and isinstance(right, int) and not isinstance(left, (int, float)):
        return _size(left) * max(right, 0)
    if operator == "*" and isinstance(left, int) and isinstance(right, int):
        return _size(left) + _size(right)
    if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        return max(abs(left), 1).bit_length() * right * 3 // 10
    return 0


class BoundedEnvironment(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with the bounds of the module docstring. Intercepted operators are
    never folded at compile time, so ``10**10**10`` is bounded too."""

    intercepted_binops = frozenset(["*", "**", "+", "%"])

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        _tick()
        if _product_size(operator, left, right) > MAX_CHARS:
            raise _Bound(f"{operator!r} would build more than {MAX_CHARS} characters")
        if operator == "%" and isinstance(left, str) and (_WIDE.search(left) or _too_large(_flat(right))):
            raise _Bound(f"'%' was given a width or an argument over {MAX_CHARS}")
        return _check(super().call_binop(context, operator, left, right), f"the result of {operator!r}")

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's signature
        _tick()
        _check_arguments(args, kwargs)
        return _check(super().call(__context, __obj, *args, **kwargs), "a call's result")


def _flat(value: Any) -> tuple:
    return tuple(value) if isinstance(value, tuple) else (value,)


def _too_large(values: Sequence[Any]) -> bool:
    return any(isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_CHARS for v in values)


_WIDE = re.compile(r"%[-+ #0]*\d{9}")  # a %-format width of 9 digits or more ('%10000000000d')


def _check_arguments(args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """An int argument past MAX_CHARS (a width, a count) is refused before the call."""
    if _too_large((*args, *kwargs.values())):
        raise _Bound(f"a call was given a number over {MAX_CHARS}")


def _bounded_filter(fn):
    @functools.wraps(fn)  # keeps jinja_pass_arg (pass_context, pass_environment)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        _check_arguments(args, kwargs)
        return _check(fn(*args, **kwargs), "a filter's result")

    return bounded


def _bounded_range(*args: int):
    """Jinja's sandboxed range (at most MAX_RANGE items), with the clock checked at each step."""
    for i in jinja2.sandbox.safe_range(*args):
        _tick()
        yield i


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> tuple[jinja2.Template | None, str | None]:
    """(the compiled template, None) or (None, why Jinja could not parse it)."""
    # transformers' globals, filters and tags, from its environment (compiled for an empty template:
    # compiling the user's there would fold `'x' * 10**10` at compile time, unbounded). Imported here:
    # glassrl.data stays importable without transformers (the reward worker: glassrl.rewards.timeout).
    from transformers.utils.chat_template_utils import _compile_jinja_template

    theirs = _compile_jinja_template("").environment
    env = BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[type(e) for e in theirs.extensions.values()]
    )
    env.filters = {name: _bounded_filter(fn) for name, fn in theirs.filters.items()}
    env.tests = dict(theirs.tests)
    env.globals.update(theirs.globals)
    env.globals["range"] = _bounded_range
    namespace = theirs.globals["namespace"]

    class BoundedNamespace(namespace):  # a namespace write is where a loop could double a text
        def __setitem__(self, name, value):
            _tick()
            super().__setitem__(name, _check(value, f"namespace value {name!r}"))

    env.globals["namespace"] = BoundedNamespace
    try:
        return env.from_string(template), None
    except jinja2.exceptions.TemplateSyntaxError as err:
        return None, f"line {err.lineno}: {err.message}"
    except _Bound as err:
        return None, str(err)


def template_source(tokenizer) -> str:
    """The template's name in an error: where it came from (:func:`use_template`), else the tokenizer's."""
    return getattr(tokenizer, SOURCE_ATTR, None) or f"chat template of {tokenizer.name_or_path}"


def use_template(tokenizer, template: str, source: str) -> None:
    """Give ``tokenizer`` the chat template ``template`` (read from ``source``, e.g. a file), parsed now:
    a template Jinja cannot parse is one line before anything runs."""
    _, why = _compile(template)
    if why is not None:
        raise GlassrlError(f"{source}: not a chat template Jinja can read: {why}")
    tokenizer.chat_template = template
    setattr(tokenizer, SOURCE_ATTR, source)


def render_chat(
    tokenizer, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = False, tools=None
) -> str:
    """The text of ``messages`` as the tokenizer's chat template writes it (as transformers'
    ``apply_chat_template(..., tokenize=False)`` does), within the module docstring's bounds."""
    source = template_source(tokenizer)
    try:
        template = tokenizer.get_chat_template(None, tools)
    except ValueError as err:  # no template, or none of the names it holds
        raise GlassrlError(f"{source}: {_one_line(err)}") from None
    compiled, why = _compile(template)
    if compiled is None:
        raise GlassrlError(f"{source}: not a chat template Jinja can read: {why}")
    chat = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
    variables = {**tokenizer.special_tokens_map, "messages": chat, "tools": tools, "documents": None}
    variables["add_generation_prompt"] = add_generation_prompt
    _clock.deadline = time.monotonic() + MAX_SECONDS
    pieces, length = [], 0
    try:
        for piece in compiled.generate(**variables):
            length += len(piece)
            if length > MAX_CHARS:
                raise _Bound(f"the rendered text is over {MAX_CHARS} characters")
            _tick()
            pieces.append(piece)
    except _Bound as err:
        raise GlassrlError(f"{source}: stopped at a bound of chat templates: {err}") from None
    except jinja2.exceptions.SecurityError as err:
        raise GlassrlError(f"{source}: reaches what a chat template may not: {_one_line(err)}") from None
    except jinja2.exceptions.TemplateError as err:
        raise GlassrlError(f"{source}: {_one_line(err)}") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ZeroDivisionError, OverflowError) as err:
        raise GlassrlError(f"{source}: failed to render: {type(err).__name__}: {_one_line(err)}") from None
    finally:
        _clock.deadline = None
    return "".join(pieces)


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())[:300]
