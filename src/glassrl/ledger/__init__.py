"""The token ledger: one row per response token with every number of DESIGN §1.

model.py holds the rows and their file formats; render.py the table, Markdown, CSV
and rich views and the legend.
"""

from glassrl.ledger.model import (
    ALL_FIELDS,
    RESPONSE_FIELDS,
    RUN_FIELDS,
    SYMBOLS,
    TOKEN_FIELDS,
    Ledger,
    ResponseLedger,
    TokenRow,
    read_jsonl,
)

__all__ = [
    "ALL_FIELDS",
    "RESPONSE_FIELDS",
    "RUN_FIELDS",
    "SYMBOLS",
    "TOKEN_FIELDS",
    "Ledger",
    "ResponseLedger",
    "TokenRow",
    "read_jsonl",
]
