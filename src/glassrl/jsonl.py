"""JSON-lines files read one way everywhere (ledgers, prompt sets, SFT and preference pairs).

A neutral module beside glassrl.errors: the ledger (which sits below data/) and data/
both read through it. Every error names ``path:LINE`` (1-based).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from glassrl.errors import GlassrlError


def jsonl_objects(path: str | Path) -> Iterator[tuple[dict[str, Any], str]]:
    """(object, "path:LINE") for each non-blank line of ``path``.

    A line that is not JSON, or is JSON but not an object, is a GlassrlError naming
    ``path:LINE``. Lines are split on "\\n" only: a string may hold U+2028 or other
    characters that ``str.splitlines`` would break on (a ledger's token may).
    """
    path = Path(path)
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise GlassrlError(f"{where}: not valid JSON: {err.msg} (column {err.colno})") from None
        if not isinstance(value, dict):
            raise GlassrlError(f"{where}: expected a JSON object, got {type(value).__name__}")
        yield value, where
