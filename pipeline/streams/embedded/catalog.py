"""The embedded store's catalog: one SQLite database (WAL) shared by every process.

Two connections with two durability levels:

- `meta` (synchronous=FULL): scopes, streams, segments, transactions, reader groups. A change
  here that returned has survived a power cut.
- `index` (synchronous=NORMAL): the block index and writer positions. They are derived from the
  segment files (each block header carries what the index holds), so an index row lost in a
  power cut is rebuilt by the next catch-up scan; a data block is fsynced before it is indexed.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FORMAT_VERSION = "1"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS scopes(name TEXT PRIMARY KEY, created_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS streams(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    scope TEXT NOT NULL, name TEXT NOT NULL, created_ns INTEGER NOT NULL,
    sealed INTEGER NOT NULL DEFAULT 0, deleted INTEGER NOT NULL DEFAULT 0,
    retention_bytes INTEGER, retention_seconds REAL);
CREATE UNIQUE INDEX IF NOT EXISTS streams_by_name ON streams(scope, name) WHERE deleted = 0;
CREATE TABLE IF NOT EXISTS segments(
    stream_id INTEGER NOT NULL, segment INTEGER NOT NULL,
    key_lo REAL NOT NULL, key_hi REAL NOT NULL,
    sealed INTEGER NOT NULL DEFAULT 0, head INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(stream_id, segment));
CREATE TABLE IF NOT EXISTS segment_predecessors(
    stream_id INTEGER NOT NULL, segment INTEGER NOT NULL, predecessor INTEGER NOT NULL,
    PRIMARY KEY(stream_id, segment, predecessor));
CREATE TABLE IF NOT EXISTS blocks(
    stream_id INTEGER NOT NULL, segment INTEGER NOT NULL, offset INTEGER NOT NULL,
    length INTEGER NOT NULL, events INTEGER NOT NULL, ingest_ns INTEGER NOT NULL,
    t_min INTEGER, t_max INTEGER,
    PRIMARY KEY(stream_id, segment, offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS writers(
    stream_id INTEGER NOT NULL, segment INTEGER NOT NULL, writer_id TEXT NOT NULL,
    last_event_number INTEGER NOT NULL,
    PRIMARY KEY(stream_id, segment, writer_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS txns(
    txn_id TEXT PRIMARY KEY, stream_id INTEGER NOT NULL, state TEXT NOT NULL,
    created_ns INTEGER NOT NULL, lease_expiry_ns INTEGER NOT NULL,
    t_min INTEGER, t_max INTEGER, ingest_ns INTEGER, finished_ns INTEGER);
CREATE TABLE IF NOT EXISTS txn_segments(
    txn_id TEXT NOT NULL, segment INTEGER NOT NULL,
    body_len INTEGER NOT NULL DEFAULT 0, events INTEGER NOT NULL DEFAULT 0,
    body_crc INTEGER NOT NULL DEFAULT 0, appended_at INTEGER, done INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(txn_id, segment));
CREATE TABLE IF NOT EXISTS reader_groups(
    name TEXT PRIMARY KEY, stream_id INTEGER NOT NULL, created_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS rg_positions(
    group_name TEXT NOT NULL, segment INTEGER NOT NULL, offset INTEGER NOT NULL, owner TEXT,
    PRIMARY KEY(group_name, segment));
CREATE TABLE IF NOT EXISTS rg_readers(
    group_name TEXT NOT NULL, reader_id TEXT NOT NULL, heartbeat_ns INTEGER NOT NULL,
    PRIMARY KEY(group_name, reader_id));
CREATE TABLE IF NOT EXISTS rg_checkpoints(
    group_name TEXT NOT NULL, name TEXT NOT NULL, cut TEXT NOT NULL, created_ns INTEGER NOT NULL,
    PRIMARY KEY(group_name, name));
"""


def _connect(path: Path, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 60000")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    return conn


class Catalog:
    """Thread-safe access to the catalog; `write()` is one IMMEDIATE transaction."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        self.meta = _connect(path, "FULL")
        with self.write(self.meta) as db:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('format_version', ?)",
                (FORMAT_VERSION,),
            )
        self.index = _connect(path, "NORMAL")

    @contextmanager
    def write(self, conn: sqlite3.Connection | None = None) -> Iterator[sqlite3.Cursor]:
        conn = conn or self.meta
        with self._lock:
            cur = conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

    def query(self, sql: str, params: tuple = (), *, index: bool = False) -> list[tuple]:
        """Read the metadata, or with `index` the block index and writer positions (the
        NORMAL-sync connection)."""
        with self._lock:
            return (self.index if index else self.meta).execute(sql, params).fetchall()

    def query_one(self, sql: str, params: tuple = (), *, index: bool = False) -> tuple | None:
        rows = self.query(sql, params, index=index)
        return rows[0] if rows else None

    def close(self) -> None:
        with self._lock:
            self.meta.close()
            self.index.close()


def now_ns() -> int:
    return time.time_ns()
