"""Counts in the collector's words: `1 event`, `2 events`, `1,000 samples`.

The same rule as the `sluice` command's `pipeline/cli/table.py: counted`, kept here because the
edge service may import only the stream store and the leaves beneath it, never the command
line (docs/architecture.md).
"""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`1 event`, `2 events`, `1,000 events` (a noun that does not just take an s: `plural`)."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"
