"""The embedded store's catalog: one SQLite database (WAL) shared by every process.

Two connections with two durability levels (a catalog that is unreadable or refused raises a
typed error from every query and write; one a newer Sluice wrote is not opened at all):
- `meta` (synchronous=FULL): scopes, streams, segments, transactions, reader groups. A change
  here that returned has survived a power cut.
- `index` (synchronous=NORMAL): the block index and writer positions. They are derived from the
  segment files (each block header carries what the index holds), so an index row lost in a
  power cut is rebuilt by the next catch-up scan; a data block is fsynced before it is indexed.
  Also the transaction rows a power cut may lose because something else rebuilds them: a
  one-segment commit's `landing` and `committed` (from its block; an `open` row from the
  transaction's id, `txn_ids.py`).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from pipeline.streams.errors import (
    CatalogDamaged,
    StoreFormatTooNew,
    StoreFull,
    StoreUnavailable,
    StreamStoreError,
)

#: The store's format (FORMAT.md, "Versions"), kept in `meta` and in `store.json`. A store of
#: a higher one is refused with `StoreFormatTooNew`; a lower one is upgraded when opened.
FORMAT_VERSION = 3
#: The `meta` key of a catalog that `repair` is rebuilding: a catalog that still holds it when
#: opened is one whose rebuild was stopped (not every segment indexed), refused until repaired.
REBUILDING = "rebuilding"
_SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_NOTADB = 11, 13, 26
#: Why a closed store handle refuses every later use (`StoreUnavailable`).
CLOSED = "this handle was closed (close() was called); open the store again"

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
CREATE TABLE IF NOT EXISTS damage(
    stream_id INTEGER NOT NULL, segment INTEGER NOT NULL, offset INTEGER NOT NULL,
    problem TEXT NOT NULL, found_ns INTEGER NOT NULL, PRIMARY KEY(stream_id, segment));
CREATE TABLE IF NOT EXISTS rg_checkpoints(
    group_name TEXT NOT NULL, name TEXT NOT NULL, cut TEXT NOT NULL, created_ns INTEGER NOT NULL,
    PRIMARY KEY(group_name, name));
"""


BUSY_SECONDS = 60.0


def _connect(path: Path, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path, timeout=BUSY_SECONDS, isolation_level=None, check_same_thread=False
    )
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_SECONDS * 1000)}")
    _into_wal(conn)
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    return conn


def _into_wal(conn: sqlite3.Connection) -> None:
    """Put the catalog in WAL mode. Switching a new database takes an exclusive lock, and
    SQLite refuses it at once ("database is locked", whatever the busy timeout: waiting could
    deadlock) while another process opening the same new store holds its shared lock: so it
    is tried again until the busy timeout, as any other lock is waited for."""
    deadline = time.monotonic() + BUSY_SECONDS
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        else:
            if mode == "wal":
                return
            msg = f"the catalog stays in {mode} journal mode, not WAL"
            raise sqlite3.OperationalError(msg)
        time.sleep(0.005)


class Catalog:
    """Thread-safe access to the catalog; `write()` is one IMMEDIATE transaction. The refusal
    is checked under the lock, so a `close()` by another thread never leaves a query facing a
    closed connection: it gets `StoreUnavailable`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        self.refusal: StreamStoreError | None = None
        self.meta: sqlite3.Connection | None = None
        self.index: sqlite3.Connection | None = None
        try:
            self.meta = _connect(path, "FULL")
            with self.write(self.meta) as db:
                _refuse_newer(db, path)  # before the schema: such a catalog is never changed
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
            self.index = _connect(path, "NORMAL")
        except StoreFormatTooNew:
            self.close()
            raise
        except (sqlite3.DatabaseError, CatalogDamaged) as exc:
            self.close()
            error = self._translate(exc) if isinstance(exc, sqlite3.Error) else exc
            if not isinstance(error, CatalogDamaged):
                raise error from None
            self.meta = self.index = None
            self.refusal = error

    @property
    def readable(self) -> bool:
        """False when the database could not be opened at all (see `refusal`)."""
        return self.meta is not None

    def identity(self) -> tuple[str | None, str | None]:
        """The catalog's format version and store id (None, None for a new or emptied one)."""
        rows = dict(self.query("SELECT key, value FROM meta", unchecked=True))
        return rows.get("format_version"), rows.get("store_id")

    def refuse(self, error: StreamStoreError | None) -> None:
        """Raise `error` from every later query and write (None: serve again)."""
        self.refusal = error

    def _translate(self, exc: sqlite3.Error) -> Exception:
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        if code == _SQLITE_FULL:
            return StoreFull(str(self.path), "the catalog database cannot grow")
        if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
            return CatalogDamaged(str(self.path), str(exc))
        return exc

    @contextmanager
    def write(
        self, conn: sqlite3.Connection | None = None, *, unchecked: bool = False
    ) -> Iterator[sqlite3.Cursor]:
        with self._lock:
            self._check(unchecked)
            conn = conn or self.meta
            try:
                cur = conn.cursor()
                cur.execute("BEGIN IMMEDIATE")
                try:
                    yield cur
                    cur.execute("COMMIT")
                except BaseException:
                    with suppress(sqlite3.Error):
                        cur.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self._translate(exc) from None

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Cursor]:
        """A cursor on the metadata for several queries in a row (no transaction)."""
        with self._lock:
            self._check(unchecked=False)
            try:
                yield self.meta.cursor()
            except sqlite3.Error as exc:
                raise self._translate(exc) from None

    def query(
        self, sql: str, params: tuple = (), *, index: bool = False, unchecked: bool = False
    ) -> list[tuple]:
        """Read the metadata, or with `index` the block index and writer positions (the
        NORMAL-sync connection)."""
        with self._lock:
            self._check(unchecked)
            try:
                return (self.index if index else self.meta).execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise self._translate(exc) from None

    def query_one(
        self, sql: str, params: tuple = (), *, index: bool = False, unchecked: bool = False
    ) -> tuple | None:
        rows = self.query(sql, params, index=index, unchecked=unchecked)
        return rows[0] if rows else None

    def _check(self, unchecked: bool) -> None:
        """Raise the refusal (the caller holds the lock); `unchecked` reads go on while the
        database is open."""
        if self.refusal is not None and (not unchecked or self.meta is None):
            raise self.refusal

    def close(self) -> None:
        """Close both connections once no query is in flight; later ones raise
        `StoreUnavailable` (or the refusal there was)."""
        with self._lock:
            for conn in (self.meta, self.index):
                if conn is not None:
                    conn.close()
            self.meta = self.index = None
            if self.refusal is None:
                self.refusal = StoreUnavailable(f"embedded:{self.path.parent}", CLOSED)


def is_newer(version: object) -> bool:
    """Whether a stored format version is one this code does not know: a higher number, or
    no number at all."""
    try:
        return int(str(version)) > FORMAT_VERSION
    except ValueError:
        return True


def _refuse_newer(db: sqlite3.Cursor, path: Path) -> None:
    """`StoreFormatTooNew` if a newer Sluice wrote this catalog."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone():
        row = db.execute("SELECT value FROM meta WHERE key='format_version'").fetchone()
        if row is not None and is_newer(row[0]):
            raise StoreFormatTooNew(str(path), str(row[0]), FORMAT_VERSION)


def now_ns() -> int:
    return time.time_ns()
