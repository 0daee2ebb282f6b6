"""The buffer's status tables: counters, meta, errors and quarantined input.

They are written inside the same SQLite transactions as the events and transaction records
they count (a committed batch and `events_committed` move together), and read by `sluice
collect status` (`collectors/status.py`). The writers take an open write transaction `c`.
"""

from __future__ import annotations

import sqlite3
import time

from collectors.buffer.schema import ERRORS_KEPT


def add_counters(c: sqlite3.Connection, deltas: dict[str, int]) -> None:
    rows = [(k, v) for k, v in deltas.items() if v]
    if rows:
        c.executemany(
            "INSERT INTO counters (name, value) VALUES (?, ?)"
            " ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
            rows,
        )


def record_error(c: sqlite3.Connection, source: str, message: str) -> None:
    """Keep `message` (the last ERRORS_KEPT are kept) and count it."""
    c.execute(
        "INSERT INTO errors (time_ns, source, message) VALUES (?, ?, ?)",
        (time.time_ns(), source, message[:2000]),
    )
    c.execute("DELETE FROM errors WHERE id <= (SELECT max(id) FROM errors) - ?", (ERRORS_KEPT,))
    add_counters(c, {"errors": 1})


def quarantine(c: sqlite3.Connection, source: str, reason: str, payload: bytes) -> None:
    """Keep bad input with the reason it was refused, and count it."""
    c.execute(
        "INSERT INTO quarantine (time_ns, source, reason, payload) VALUES (?, ?, ?, ?)",
        (time.time_ns(), source, reason, payload),
    )
    add_counters(c, {"quarantined": 1})


def set_meta(c: sqlite3.Connection, values: dict[str, str]) -> None:
    c.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", values.items())


def raise_last_committed(c: sqlite3.Connection, max_ns: int) -> None:
    """`meta.last_committed_ns` becomes `max_ns` if that is later."""
    c.execute(
        "INSERT INTO meta (key, value) VALUES ('last_committed_ns', ?)"
        " ON CONFLICT (key) DO UPDATE SET value ="
        " max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
        (str(max_ns),),
    )


def read_counters(conn: sqlite3.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT name, value FROM counters ORDER BY name"))


def read_meta(conn: sqlite3.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT key, value FROM meta"))
