"""Errors a user can act on. The CLI prints them as one line and exits with code 2."""


class GlassrlError(Exception):
    """Bad input from the user: a file, line, field or argument that is wrong.

    The message must name what is wrong (``--values: expected 6 numbers, got 5``,
    ``data/train.jsonl:17: missing field "prompt"``); the CLI prints it without a
    traceback.
    """
