"""JSON-lines files read one way everywhere (ledgers, prompt sets, SFT and preference pairs),
and text files read as UTF-8 with an error that names the line (:func:`read_utf8`).

A neutral module beside glassrl.errors: the ledger (which sits below data/), data/ and the
config loader all read through it. Every error names ``path:LINE`` (1-based).

Valid JSON (or YAML) is not always data (:func:`check_plain`): a ``\\uD800``–``\\uDFFF`` escape
without its pair decodes to a lone surrogate, which no tokenizer or UTF-8 file takes; nesting
deeper than :data:`MAX_DEPTH` would meet Python's recursion limit in whatever walks it next (the
checkpoint encoding, a JSON writer); an integer longer than Python's int-string limit
(``sys.get_int_max_str_digits()``, 4300 digits) cannot be read at all. Each is a GlassrlError
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

# Levels of arrays and objects a row or a config may nest: far more than any data needs, far
# fewer than the ~1000 frames of Python's recursion limit that code walking it may meet.
MAX_DEPTH = 100
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # strict UTF-8 text holds a surrogate only as an escape


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

    A line that is not JSON, or is JSON but not an object, is a GlassrlError naming
    ``path:LINE``. Lines are split on "\\n" only: a string may hold U+2028 or other
    characters that ``str.splitlines`` would break on (a ledger's token may).
    """
    path = Path(path)
    for number, line in enumerate(read_utf8(path).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise GlassrlError(f"{where}: not valid JSON: {err.msg} (column {err.colno})") from None
        except RecursionError:
            raise GlassrlError(f"{where}: nested more than {MAX_DEPTH} levels deep") from None
        except ValueError:  # the only other: an integer past the int-string limit
            raise GlassrlError(f"{where}: {_long_integer(line)}") from None
        if not isinstance(value, dict):
            raise GlassrlError(f"{where}: expected a JSON object, got {type(value).__name__}")
        if _ESCAPED_SURROGATE.search(line) or line.count("[") + line.count("{") > MAX_DEPTH:
            check_plain(value, where)  # else it cannot fail: a quick look spares the walk over a long ledger row
        yield value, where


def check_plain(value: Any, where: str, key: str = "") -> None:
    """``value`` (decoded JSON or YAML) nests at most MAX_DEPTH levels and holds no lone surrogate,
    in a string or a key; else a GlassrlError naming ``where`` and the field (``key`` its prefix)."""
    stack = [(value, key, 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, str):
            if found := _SURROGATE.search(node):
                raise GlassrlError(f"{where}: {_field(path)}{_lone(found)}")
            continue
        if not isinstance(node, (dict, list, tuple)):
            continue
        if depth == MAX_DEPTH:
            raise GlassrlError(f"{where}: {_field(path)}nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, dict):
            for name, child in node.items():
                field = f"{path}.{name}" if path else str(name)
                if isinstance(name, str) and (found := _SURROGATE.search(name)):
                    raise GlassrlError(f"{where}: {_field(field)}{_lone(found)}")
                stack.append((child, field, depth + 1))
        else:
            stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(node))


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
