"""JSON-lines files read one way everywhere (ledgers, prompt sets, SFT and preference pairs),
text files read as UTF-8 with an error that names the line (:func:`read_utf8`), and JSON values
nested no deeper than :data:`MAX_NESTING` (:func:`load_json`).

A neutral module beside glassrl.errors: the ledger (which sits below data/), data/ and the
config loader all read through it. Every error names ``path:LINE`` (1-based).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from glassrl.errors import GlassrlError

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


def load_json(text: str) -> Any:
    """``json.loads(text)``; a value nested deeper than :data:`MAX_NESTING` raises :class:`TooDeep`
    (json.JSONDecodeError as json raises it)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep from None
    if too_deep(value):
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
            value = load_json(line)
        except json.JSONDecodeError as err:
            raise GlassrlError(f"{where}: not valid JSON: {err.msg} (column {err.colno})") from None
        except TooDeep as err:
            raise GlassrlError(f"{where}: {err}") from None
        if not isinstance(value, dict):
            raise GlassrlError(f"{where}: expected a JSON object, got {type(value).__name__}")
        yield value, where
