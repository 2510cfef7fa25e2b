"""The token ledger: one row per response token with every number of DESIGN §1.

model.py holds the rows and their file formats; compute.py builds a ledger from a step's
Experience or from given numbers (it imports torch, so it is not imported here: reading a
ledger file needs no torch); render.py the table, Markdown, CSV and rich views; legend.py the legend, in the
sentences of phrases.py.
"""

from glassrl.ledger.model import (
    ALL_FIELDS,
    OFF_POLICY_FIELDS,
    RESPONSE_FIELDS,
    RUN_FIELDS,
    SYMBOLS,
    TOKEN_FIELDS,
    Ledger,
    LedgerTurn,
    ResponseLedger,
    TokenRow,
    read_jsonl,
)

__all__ = [
    "ALL_FIELDS",
    "OFF_POLICY_FIELDS",
    "RESPONSE_FIELDS",
    "RUN_FIELDS",
    "SYMBOLS",
    "TOKEN_FIELDS",
    "Ledger",
    "LedgerTurn",
    "ResponseLedger",
    "TokenRow",
    "read_jsonl",
]
