"""JSON-lines files read one way everywhere (ledgers, prompt sets, SFT and preference pairs),
text files read as UTF-8 with an error that names the line (:func:`read_utf8`), and JSON values
nested no deeper than :data:`MAX_NESTING` (:func:`load_json`).

A neutral module beside glassrl.errors: the ledger (which sits below data/), data/ and the
config loader all read through it. Every error names ``path:LINE`` (1-based).

Valid JSON (or YAML) is not always data: a ``\\uD800``–``\\uDFFF`` escape without its pair
decodes to a lone surrogate, which no tokenizer or UTF-8 file takes (:func:`check_plain`); an
integer longer than Python's int-string limit (``sys.get_int_max_str_digits()``, 4300 digits)
cannot be read at all. Each is a GlassrlError
naming the row and, where there is one, the field.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from glassrl.errors import GlassrlError

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # strict UTF-8 text holds a surrogate only as an escape
# Lists and objects nested deeper than this are refused wherever glassrl reads JSON (or YAML) it did
# not write: a model's tool call, a data file, a config. json.loads itself fails near the interpreter's
# recursion limit (about 1,000) with a RecursionError, and values nested a little less deep fail later,
# wherever they are walked recursively (the checkpoint codec, json.dumps); no real value nests this deep.
MAX_NESTING = 64


class TooDeep(ValueError):
    """A JSON (or YAML) value nested deeper than :data:`MAX_NESTING`."""

    def __init__(self) -> None:
        super().__init__(f"nested deeper than {MAX_NESTING} levels")


def too_deep(value: Any) -> bool:
    """Whether lists and dicts nest in ``value`` deeper than :data:`MAX_NESTING` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple, dict)):
            if depth > MAX_NESTING:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


class DuplicateKey(ValueError):
    """A JSON object that holds a key twice (json keeps the last value silently)."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) < len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise DuplicateKey(f"the key {twice!r} is given twice in one object (JSON would keep the last silently)")
    return value


def load_json(text: str, unique_keys: bool = False) -> Any:
    """``json.loads(text)``; a value nested deeper than :data:`MAX_NESTING` raises :class:`TooDeep`
    (json.JSONDecodeError as json raises it); with ``unique_keys``, an object holding a key twice
    raises :class:`DuplicateKey`."""
    try:
        value = json.loads(text, object_pairs_hook=_unique if unique_keys else None)
    except RecursionError:
        raise TooDeep from None
    # a value nests no deeper than it has opening brackets: most lines (a ledger's token rows) need no walk
    if text.count("[") + text.count("{") > MAX_NESTING and too_deep(value):
        raise TooDeep
    return value


def read_utf8(path: str | Path) -> str:
    """The text of ``path`` (a leading byte-order mark dropped); bytes that are not UTF-8 are a
    GlassrlError naming ``path:LINE``."""
    data = Path(path).read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise GlassrlError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x} at column {column}); save the file as UTF-8"
        ) from None


def jsonl_objects(path: str | Path) -> Iterator[tuple[dict[str, Any], str]]:
    """(object, "path:LINE") for each non-blank line of ``path``.

    A line that is not JSON, is JSON but not an object, or holds an object with a key twice (json
    would keep the last value silently) is a GlassrlError naming ``path:LINE``. Lines are split on "\\n" only: a
    string may hold U+2028 or other
    characters that ``str.splitlines`` would break on (a ledger's token may).
    """
    path = Path(path)
    for number, line in enumerate(read_utf8(path).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            value = load_json(line, unique_keys=True)
        except json.JSONDecodeError as err:
            raise GlassrlError(f"{where}: not valid JSON: {err.msg} (column {err.colno})") from None
        except (TooDeep, DuplicateKey) as err:
            raise GlassrlError(f"{where}: {err}") from None
        except ValueError:  # the only other: an integer past the int-string limit
            raise GlassrlError(f"{where}: {_long_integer(line)}") from None
        if not isinstance(value, dict):
            raise GlassrlError(f"{where}: expected a JSON object, got {type(value).__name__}")
        if _ESCAPED_SURROGATE.search(line):
            check_plain(value, where)  # else it cannot fail: a quick look spares the walk over a long ledger row
        yield value, where


def check_plain(value: Any, where: str, key: str = "") -> None:
    """``value`` (decoded JSON or YAML, nested at most MAX_NESTING levels) holds no lone surrogate, in
    a string or a key; else a GlassrlError naming ``where`` and the field (``key`` its prefix)."""
    stack = [(value, key)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if found := _SURROGATE.search(node):
                raise GlassrlError(f"{where}: {_field(path)}{_lone(found)}")
            continue
        if not isinstance(node, (dict, list, tuple)):
            continue
        if isinstance(node, dict):
            for name, child in node.items():
                field = f"{path}.{name}" if path else str(name)
                if isinstance(name, str) and (found := _SURROGATE.search(name)):
                    raise GlassrlError(f"{where}: {_field(field)}{_lone(found)}")
                stack.append((child, field))
        else:
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node))


def as_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (a high and a low one in a row joined into
    their character), as bytes decoded with errors="replace" would read."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _field(path: str) -> str:
    return f"field {path!r}: " if path else ""


def _lone(found: re.Match) -> str:
    return (
        f"{ascii(found[0])[1:-1]} at character {found.start()} is a lone surrogate, not text "
        "(a \\uD800-\\uDFFF escape must be half of a pair)"
    )


def _long_integer(line: str) -> str:
    digits = max(len(run) for run in re.findall(r"\d+", line))
    return f"an integer of {digits} digits; at most {sys.get_int_max_str_digits()} are read (write it as a string)"
