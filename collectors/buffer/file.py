"""One connection to an instance's buffer file: durability, the schema check, turns at writing.

The driver thread and the sender thread each open their own connection (SQLite in WAL mode
lets one write while the other reads). Writes use `BEGIN IMMEDIATE`, so the two never
deadlock on a lock upgrade, and take turns in arrival order (`WriteTurns`). The file's
tables and their meaning are in FORMAT.md next to this file.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from collectors.buffer.schema import SCHEMA, SCHEMA_VERSION
from collectors.errors import BufferNotWritable, BufferSchemaError, BufferUnusable
from pipeline.failpoints import Failpoints


def connect(path: Path, file_mode: int = 0o600) -> sqlite3.Connection:
    """Open (creating if needed, with `file_mode`) a buffer file with the collector's
    durability settings; `BufferUnusable` if it is not a SQLite database, or another
    program's. Nothing is written to a file that is refused."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, file_mode))
        conn = sqlite3.connect(path, isolation_level=None, timeout=60.0, check_same_thread=False)
    except OSError as exc:
        problem = f"cannot be opened ({exc.strerror or exc})"
        raise BufferUnusable(path, problem, "check buffer_file and its directory") from None
    try:
        return _prepare_when_unlocked(conn, path)
    except sqlite3.DatabaseError as exc:
        conn.close()
        refused = not_writable(path, exc)
        if refused is not None:
            raise refused from None
        problem = f"is not a SQLite database ({exc})"
        hint = "point buffer_file at a collector buffer, or move this file away"
        raise BufferUnusable(path, problem, hint) from None
    except BaseException:
        conn.close()
        raise


#: SQLite's primary result codes for a write its file system refused, and what they mean.
_REFUSED = {sqlite3.SQLITE_FULL: "no space left on its disk", sqlite3.SQLITE_READONLY: "read-only"}


def not_writable(path: Path, exc: sqlite3.Error) -> BufferNotWritable | None:
    """`BufferNotWritable` when `exc` says the disk is full or the file read-only, else None."""
    reason = _REFUSED.get(getattr(exc, "sqlite_errorcode", 0) & 0xFF)
    return None if reason is None else BufferNotWritable(path, f"{reason}: {exc}")


LOCKED_WAIT_SECONDS = 60.0


def _prepare_when_unlocked(conn: sqlite3.Connection, path: Path) -> sqlite3.Connection:
    """`_prepare`, retried while another connection holds the file: switching a new file to
    WAL takes an exclusive lock that SQLite's busy timeout does not wait for, so two
    connections opening a new buffer at once (the collector and `collect status`) would
    otherwise see "database is locked". A lock that outlasts the wait is an error."""
    deadline = time.monotonic() + LOCKED_WAIT_SECONDS
    while True:
        try:
            return _prepare(conn, path)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _prepare(conn: sqlite3.Connection, path: Path) -> sqlite3.Connection:
    conn.execute("PRAGMA busy_timeout = 60000")
    conn.execute("BEGIN")  # one snapshot: another connection may be creating the schema
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    finally:
        conn.execute("COMMIT")
    if version == 0:
        if tables:
            problem = f"is another program's SQLite database (tables {', '.join(sorted(tables))})"
            hint = "point buffer_file at a collector buffer, or move this file away"
            raise BufferUnusable(path, problem, hint)
    if version > SCHEMA_VERSION:
        raise BufferSchemaError(path, version, SCHEMA_VERSION)
    if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        conn.execute("PRAGMA page_size = 65536")
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    # Some SQLite builds zero every deleted byte (SECURE_DELETE): for sent samples that
    # doubles the writes. FAST zeroes only what costs no extra I/O.
    conn.execute("PRAGMA secure_delete = FAST")
    if version < SCHEMA_VERSION:
        conn.executescript(
            f"BEGIN IMMEDIATE; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
        )
    return conn


class WriteTurns:
    """First come, first served turns at the buffer's write lock.

    SQLite makes a blocked writer poll with growing sleeps, so a driver that appends back to
    back can starve the sender for seconds. The threads of one instance share one
    `WriteTurns` and queue here instead, in arrival order (other processes, such as
    `sluice collect status`, only read)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    @contextmanager
    def turn(self) -> Iterator[None]:
        with self._cond:
            ticket = self._next_ticket
            self._next_ticket += 1
            while ticket != self._serving:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._serving += 1
                self._cond.notify_all()


class BufferFile:
    """One connection to a buffer file, used by one thread.

    `room` is shared by the instance's connections: it wakes the sender when events arrive
    and a driver blocked on a full buffer when rows are dropped."""

    def __init__(
        self,
        path: Path,
        *,
        room: threading.Condition | None = None,
        failpoints: Failpoints | None = None,
        turns: WriteTurns | None = None,
        file_mode: int = 0o600,
    ) -> None:
        self.path = path
        self.room = room or threading.Condition()
        self.failpoints = failpoints or Failpoints()
        self.turns = turns or WriteTurns()
        self.conn = connect(path, file_mode)
        self._wal_to_truncate = False

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE), taken in turn with the instance's others.
        A write the disk refuses (full, read-only) is rolled back whole and raised as
        `BufferNotWritable`."""
        with self.turns.turn():
            self._truncate_wal()
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self.conn
                except BaseException:
                    if self.conn.in_transaction:  # SQLite rolls back itself on a full disk
                        self.conn.execute("ROLLBACK")
                    raise
                self.conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if self.conn.in_transaction:  # a failed COMMIT may leave it open
                    self.conn.execute("ROLLBACK")
                refused = not_writable(self.path, exc)
                if refused is None:
                    raise
                self._wal_to_truncate = True
                self._truncate_wal()
                raise refused from None

    def _truncate_wal(self) -> None:
        """After a write the disk refused, and before each write until it succeeds: move the
        write-ahead log into the database and empty it. With 64 KiB pages the log grows by
        megabytes between checkpoints: enough to fill a small disk by itself, and to take
        back the room an operator frees before it is ever checkpointed."""
        if not self._wal_to_truncate:
            return
        try:
            busy, _, _ = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.OperationalError:
            return
        self._wal_to_truncate = bool(busy)

    def notify_room(self) -> None:
        """Wake the threads waiting on `room` (new events, or rows dropped)."""
        with self.room:
            self.room.notify_all()
