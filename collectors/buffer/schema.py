"""The declared schema of an instance's buffer file: its tables and the records read from them.

Schema version 1 (`PRAGMA user_version = 1`); what each table holds, the states of a
transaction record and the durability settings are described in FORMAT.md next to this file.
Changing a table means a new version and a migration in `file.connect`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SCHEMA_VERSION = 1

TxnRecordState = Literal["open", "ready", "doubtful"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    routing_key TEXT,
    payload BLOB NOT NULL,
    min_ns INTEGER NOT NULL,
    max_ns INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    buffered_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS txns (
    txn_id TEXT PRIMARY KEY,
    stream TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('open', 'ready', 'doubtful')),
    first_id INTEGER,
    last_id INTEGER,
    events INTEGER NOT NULL DEFAULT 0,
    samples INTEGER NOT NULL DEFAULT 0,
    min_ns INTEGER,
    max_ns INTEGER,
    recorded_ns INTEGER NOT NULL,
    note TEXT
);
CREATE TABLE IF NOT EXISTS cursor (
    name TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS errors (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time_ns INTEGER NOT NULL,
    source TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantine (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time_ns INTEGER NOT NULL,
    source TEXT NOT NULL,
    reason TEXT NOT NULL,
    payload BLOB
);
"""

#: Counters kept in the `counters` table (all start at 0).
COUNTERS = (
    "events_buffered",
    "samples_buffered",
    "events_committed",
    "samples_committed",
    "txns_committed",
    "txns_recommitted",
    "txns_aborted",
    "txns_requeued",
    "txns_doubtful",
    "doubtful_dropped",
    "doubtful_resent",
    "events_shed",
    "samples_shed",
    "blocked_ms",
    "errors",
    "quarantined",
)

#: Keep this many rows in `errors` (older ones are deleted as new ones arrive).
ERRORS_KEPT = 50


@dataclass(frozen=True, slots=True)
class PendingEvent:
    """One event a driver hands to the buffer: a serialized batch of samples.

    `min_ns`/`max_ns` are the event-time bounds of its samples (ns since the epoch); the
    sender attaches the bounds of a whole transaction when it commits it.
    """

    payload: bytes
    routing_key: str | None
    min_ns: int
    max_ns: int
    samples: int


@dataclass(frozen=True, slots=True)
class BufferedEvent:
    """An event as read back from the buffer, with its queue position."""

    id: int
    payload: bytes
    routing_key: str | None
    min_ns: int
    max_ns: int
    samples: int


@dataclass(frozen=True, slots=True)
class TxnRecord:
    """A row of `txns` (schema version 1; its states are described in FORMAT.md)."""

    txn_id: str
    stream: str
    state: TxnRecordState
    first_id: int | None
    last_id: int | None
    events: int
    samples: int
    min_ns: int | None
    max_ns: int | None
    recorded_ns: int
    note: str | None = None

    @property
    def time_bounds(self) -> tuple[int, int] | None:
        if self.min_ns is None or self.max_ns is None:
            return None
        return (self.min_ns, self.max_ns)


@dataclass(frozen=True, slots=True)
class CursorState:
    """A driver position stored in `cursor`, with the version of the driver's format."""

    name: str
    version: int
    value: dict
