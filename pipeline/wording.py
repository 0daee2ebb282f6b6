"""Counts in words, one rule for every message Sluice prints: `1 event`, `2 events`,
`1,000 samples`.

A leaf: the command line, the jobs, the stream store and the edge collectors all import it.
"""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`1 event`, `2 events`, `1,000 events` (a noun that does not just take an s: `plural`)."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def agreeing(count: int, singular: str, plural: str) -> str:
    """The verb (or any word) that agrees with `count`: `agreeing(1, "stays", "stay")`."""
    return singular if count == 1 else plural
