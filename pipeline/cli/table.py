"""Plain-text tables for the terminal: what `sluice sql` and `sluice slices list` print."""

from __future__ import annotations

from collections.abc import Sequence

MAX_CELL = 60


def _cell(value: object) -> str:
    text = "NULL" if value is None else str(value)
    text = text.replace("\n", " ")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def render(columns: Sequence[str], rows: Sequence[Sequence[object]], max_rows: int = 0) -> str:
    """Columns padded to their widest cell; numbers right-aligned; `max_rows` > 0 cuts the
    table and says how many rows were left out."""
    shown = rows if max_rows <= 0 else rows[:max_rows]
    cells = [[_cell(v) for v in row] for row in shown]
    widths = [len(c) for c in columns]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    numeric = [
        bool(shown) and all(isinstance(r[i], int | float) or r[i] is None for r in shown)
        for i in range(len(columns))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(columns), "  ".join("-" * w for w in widths)]
    out.extend(line(row) for row in cells)
    left_out = len(rows) - len(shown)
    footer = f"({len(rows)} row{'s' if len(rows) != 1 else ''}"
    footer += f", {left_out} not shown: use --max-rows)" if left_out else ")"
    out.append(footer)
    return "\n".join(out)
