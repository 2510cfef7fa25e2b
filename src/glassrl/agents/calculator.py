"""The ``calculator`` tool: exact arithmetic on an expression, read with ``ast``, never ``eval``.

Accepted: numbers (integers, decimals), + - * / // % **, unary + and -, parentheses. Integers
stay exact (Python's big integers); "/" gives an exact integer when it divides, else a float
rounded to 12 significant digits. Anything else (names, calls, attributes, strings, comparisons)
is refused with a message naming it. Limits keep one call cheap: at most ``MAX_CHARS`` characters,
and an exponent at most ``MAX_EXPONENT`` with a result of at most ``MAX_DIGITS`` digits.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

MAX_CHARS = 200
MAX_EXPONENT = 1000
MAX_DIGITS = 1000

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(expression: str) -> int | float:
    """The value of ``expression``; ValueError (or ZeroDivisionError) saying what is not allowed."""
    if len(expression) > MAX_CHARS:
        raise ValueError(f"expression longer than {MAX_CHARS} characters")
    # Full-width digits and operators (１２３＋４５６) are the same expression.
    text = expression.translate({0xFF0B: "+", 0xFF0D: "-", 0xFF0A: "*", 0xFF0F: "/", 0x00D7: "*", 0x00F7: "/"})
    text = "".join(chr(ord(c) - 0xFEE0) if "０" <= c <= "９" else c for c in text).replace("=", "").strip()
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        if isinstance(node.op, ast.Div) and isinstance(left, int) and isinstance(right, int) and right != 0:
            quotient, remainder = divmod(left, right)
            if remainder == 0:
                return quotient
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"not allowed in an arithmetic expression: {ast.unparse(node)!r}")


def _check_power(base: Any, exponent: Any) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponent {exponent} is larger than {MAX_EXPONENT}")
    if base not in (0, 1, -1) and exponent > 0 and abs(exponent) * math.log10(max(abs(base), 1e-300)) > MAX_DIGITS:
        raise ValueError(f"result would have more than {MAX_DIGITS} digits")


def format_number(value: int | float) -> str:
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.12g}"
    return str(value)


class Calculator:
    """``calculator(expression)`` -> the value as text ("5796")."""

    name = "calculator"
    description = "Evaluate an arithmetic expression (+ - * / // % ** and parentheses) exactly."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "for example 4821+975"}},
        "required": ["expression"],
    }

    def call(self, arguments: dict[str, Any]) -> str:
        return format_number(evaluate(arguments["expression"]))
