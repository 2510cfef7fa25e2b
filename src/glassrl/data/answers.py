"""Reading an answer out of a response's text: the rules that verifiers and tasks share.

Text is compared after Unicode NFKC normalisation, which maps full-width forms to their ASCII
twins (``"，"`` -> ``","``, ``"２"`` -> ``"2"``), so a rule does not care which punctuation
width the model picked. A number is read as the last one in the text.
"""

from __future__ import annotations

import re
import unicodedata

# A number not glued to a preceding digit: in "3-5" the "-" is an operator, not a sign.
_NUMBER = re.compile(r"(?<!\d)-?\d+(?:\.\d+)?")


def normalize_text(text: str) -> str:
    """NFKC (full-width -> ASCII forms) and runs of whitespace collapsed to one space."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def extract_last_number(text: str) -> str | None:
    """The last number in ``text`` in canonical form ("2.0" -> "2"), or None if there is none."""
    found = _NUMBER.findall(unicodedata.normalize("NFKC", text))
    if not found:
        return None
    value = float(found[-1])
    return str(int(value)) if value.is_integer() else repr(value)
