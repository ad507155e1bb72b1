"""NATS subject filters: their form, whether two of them can match the same subject, whether one takes all of another.

Pure rules, no I/O: a filter is dot-separated tokens, ``*`` matching one token and a final ``>`` one or more.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import combinations

_TOKEN = re.compile(r"^[^\s.*>]+$")


def filter_problem(text: str) -> str | None:
    """Why ``text`` is not a subject filter (None when it is one)."""
    if not text:
        return "a filter is empty"
    tokens = text.split(".")
    for index, token in enumerate(tokens):
        if token == ">" and index < len(tokens) - 1:
            return f"{text!r} has '>' before its last token"
        if token not in ("*", ">") and not _TOKEN.match(token):
            return f"{text!r} has an empty token, a space or a wildcard inside a token"
    return None


def collide(first: str, second: str) -> bool:
    """Whether some subject matches both filters."""
    a, b = first.split("."), second.split(".")
    for x, y in zip(a, b, strict=False):
        if x == ">" or y == ">":
            return True
        if x != y and "*" not in (x, y):
            return False
    return len(a) == len(b)


def covers(outer: str, inner: str) -> bool:
    """Whether every subject that matches ``inner`` matches ``outer`` too."""
    a, b = outer.split("."), inner.split(".")
    for index, token in enumerate(a):
        if token == ">":
            return index < len(b)
        if index >= len(b) or b[index] == ">" or token not in ("*", b[index]):
            return False
    return len(a) == len(b)


def overlapping(filters: Sequence[str]) -> tuple[str, str] | None:
    """The first pair of ``filters`` that both match some subject, or None."""
    return next(((a, b) for a, b in combinations(filters, 2) if collide(a, b)), None)
