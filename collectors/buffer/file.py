"""One connection to an instance's buffer file: durability, the schema check, turns at writing.

The driver thread and the sender thread each open their own connection (SQLite in WAL mode
lets one write while the other reads). Writes use `BEGIN IMMEDIATE`, so the two never
deadlock on a lock upgrade, and take turns in arrival order (`WriteTurns`). The file's
tables and their meaning are in FORMAT.md next to this file.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from collectors.buffer.schema import SCHEMA, SCHEMA_VERSION
from collectors.errors import (
    MOVE_ASIDE_COST,
    BufferBusy,
    BufferDamaged,
    BufferNotWritable,
    BufferSchemaError,
    BufferUnusable,
    CollectorError,
)
from pipeline.durable import fsync_dir, fsync_path
from pipeline.failpoints import Failpoints

log = logging.getLogger(__name__)


def connect(path: Path, file_mode: int = 0o600) -> sqlite3.Connection:
    """Open (creating if needed, with `file_mode`) a buffer file with the collector's
    durability settings; `BufferUnusable` if it is not a SQLite database, or another
    program's; `BufferDamaged` if it is a damaged buffer (see `_prepare`). Nothing is
    written to a file that is refused. A new file is created whole, under another name,
    and linked into place: a buffer file is never empty nor without its tables."""
    wal_present = wal_path(path).exists()  # before SQLite opens (and so creates) it
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(path):
            _create(path, file_mode)
        _check_openable(path)
        conn = sqlite3.connect(
            path, isolation_level=None, timeout=LOCKED_WAIT_SECONDS, check_same_thread=False
        )
    except OSError as exc:
        problem = f"cannot be opened ({exc.strerror or exc})"
        raise BufferUnusable(path, problem, "check buffer_file and its directory") from None
    except sqlite3.DatabaseError as exc:  # creating it: a full disk
        raise refusal(path, exc) from None
    try:
        return _prepare_when_unlocked(conn, path, wal_present)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise refusal(path, exc) from None
    except BaseException:
        conn.close()
        raise


def _check_openable(path: Path) -> None:
    """Raise `OSError` when `path` cannot be opened for reading and writing, asking the file
    system without opening it. Closing any descriptor of the buffer file drops every POSIX
    lock this process holds on it, those of its open SQLite connections too (SQLite's "How
    To Corrupt", 2.2): the sender's connection, opened beside the driver's, then left the
    file unlocked, and the next process to close a connection to it (`collect status`) took
    itself for the last one and deleted the write-ahead log the collector was still writing
    to, which left the buffer "malformed"."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not path.exists():  # a dangling link
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    effective = os.access in os.supports_effective_ids
    if os.access(path, os.R_OK | os.W_OK, effective_ids=effective):
        return
    read_only = os.statvfs(path).f_flag & os.ST_RDONLY
    code = errno.EROFS if read_only else errno.EACCES
    raise OSError(code, os.strerror(code), str(path))


def wal_path(path: Path) -> Path:
    """The buffer's write-ahead log: its latest commits, until SQLite copies them over."""
    return path.with_name(path.name + "-wal")


def _create(path: Path, file_mode: int) -> None:
    """Make a buffer file with its tables under a temporary name, then link it to `path`
    (unless another connection made one first: then that one is used)."""
    tmp = path.with_name(f".{path.name}.new-{os.getpid()}-{threading.get_ident()}")
    os.close(os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, file_mode))
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("PRAGMA page_size = 65536")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(
                f"BEGIN IMMEDIATE; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            )
        finally:
            conn.close()  # the last connection: SQLite moves the log into the file
        fsync_path(tmp)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links (FAT): rename, not over a file
            if not os.path.lexists(path):
                os.rename(tmp, path)
        fsync_dir(path.parent)
    finally:
        for leftover in (tmp, wal_path(tmp), tmp.with_name(tmp.name + "-shm")):
            leftover.unlink(missing_ok=True)


#: SQLite's primary result codes for a damaged file.
_DAMAGED = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}
_SQLITE_MAGIC = b"SQLite format 3\x00"


def refusal(path: Path, exc: sqlite3.DatabaseError) -> CollectorError:
    """The typed error for a SQLite error met while opening a buffer: a full or read-only
    disk, a lock held too long, a damaged buffer, or a file that is no SQLite database."""
    refused = not_writable(path, exc)
    if refused is not None:
        return refused
    if "locked" in str(exc):
        return BufferBusy(path, LOCKED_WAIT_SECONDS)
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code == sqlite3.SQLITE_CORRUPT or (code in _DAMAGED and _looks_like_sqlite(path)):
        return BufferDamaged(path, f"SQLite reports {exc}")
    problem = (
        f"is not a SQLite database ({exc}); if it was this collector's buffer, its header "
        "is damaged"
    )
    hint = f"point buffer_file at a collector buffer, or move this file away ({MOVE_ASIDE_COST})"
    return BufferUnusable(path, problem, hint)


def damaged(path: Path, exc: BaseException) -> BufferDamaged | None:
    """`BufferDamaged` when `exc` is SQLite finding the file damaged, else None."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if isinstance(exc, sqlite3.DatabaseError) and code in _DAMAGED:
        return BufferDamaged(path, f"SQLite reports {exc}")
    return None


def _looks_like_sqlite(path: Path) -> bool:
    # opens the file: only on the way to refusing it (see `_check_openable`)
    try:
        with path.open("rb") as fh:
            return fh.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        return False


#: SQLite's primary result codes for a write its file system refused, and what they mean.
_REFUSED = {sqlite3.SQLITE_FULL: "no space left on its disk", sqlite3.SQLITE_READONLY: "read-only"}


def not_writable(path: Path, exc: sqlite3.Error) -> BufferNotWritable | None:
    """`BufferNotWritable` when `exc` says the disk is full or the file read-only, else None."""
    reason = _REFUSED.get(getattr(exc, "sqlite_errorcode", 0) & 0xFF)
    return None if reason is None else BufferNotWritable(path, f"{reason}: {exc}")


LOCKED_WAIT_SECONDS = 60.0


def _prepare_when_unlocked(
    conn: sqlite3.Connection, path: Path, wal_present: bool
) -> sqlite3.Connection:
    """`_prepare`, retried while another connection holds the file: switching a file to
    WAL takes an exclusive lock that SQLite's busy timeout does not wait for, so two
    connections opening a buffer at once (the collector and `collect status`) would
    otherwise see "database is locked". A lock that outlasts the wait is an error."""
    deadline = time.monotonic() + LOCKED_WAIT_SECONDS
    while True:
        try:
            return _prepare(conn, path, wal_present)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


#: `meta` key: "open" while a `BufferFile` may hold commits only in the write-ahead log,
#: "closed" once one closed cleanly (the last connection to close makes SQLite move the log
#: into the file and delete it). "open" without a log means the log, and the commits in it,
#: were lost.
WAL_STATE = "wal"


def _prepare(conn: sqlite3.Connection, path: Path, wal_present: bool) -> sqlite3.Connection:
    conn.execute(f"PRAGMA busy_timeout = {int(LOCKED_WAIT_SECONDS * 1000)}")
    conn.execute("BEGIN")  # one snapshot: another connection may be writing
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        wal_state = None
        if "meta" in tables:
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (WAL_STATE,)).fetchone()
            wal_state = row and row[0]
    finally:
        conn.execute("COMMIT")
    if version == 0:
        if tables:
            problem = f"is another program's SQLite database (tables {', '.join(sorted(tables))})"
            hint = "point buffer_file at a collector buffer, or move this file away"
            raise BufferUnusable(path, problem, hint)
        raise BufferDamaged(path, why_without_tables(path))
    if version > SCHEMA_VERSION:
        raise BufferSchemaError(path, version, SCHEMA_VERSION)
    # (a log made meanwhile by another connection opening the file holds its commits)
    problem = lost_wal(path, wal_state, wal_present or _wal_size(path) > 0)
    if problem is not None:
        raise BufferDamaged(path, problem)
    if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
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


def lost_wal(path: Path, wal_state: str | None, wal_present: bool) -> str | None:
    """Why the buffer lost its write-ahead log (`wal_state` "open", and no log), else None.
    An empty log is not taken for a lost one: a checkpoint that truncates it (after a full
    disk) leaves one, with everything in the file itself."""
    if wal_state != "open" or wal_present:
        return None
    return (
        f"its write-ahead log {wal_path(path).name} is gone, but the collector that wrote it "
        "last did not close it: the commits it held (events, the driver's position, batches "
        "sent since) are lost, and what is left is older than the stream"
    )


def _wal_size(path: Path) -> int:
    try:
        return wal_path(path).stat().st_size
    except FileNotFoundError:
        return 0


def _set_wal_state(conn: sqlite3.Connection, state: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (WAL_STATE, state))
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def why_without_tables(path: Path) -> str:
    """Why a buffer file holds no tables: `connect` creates every buffer with its tables."""
    size = path.stat().st_size
    if size == 0:
        return (
            "it is empty (0 bytes), truncated or replaced (a buffer is never empty, even "
            "new); if nothing was ever buffered in it, delete it"
        )
    return (
        f"it holds no tables ({size:,} bytes): its tables were only in its write-ahead log "
        f"{wal_path(path).name}, which is gone or was cut short"
    )


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
        try:
            _set_wal_state(self.conn, "open")
            self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")  # the file itself says so
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise refusal(path, exc) from None
        self._wal_to_truncate = False

    def close(self) -> None:
        """Close the connection, first noting that it closed cleanly (`WAL_STATE`); a disk
        that refuses the note leaves "open" with the log still there, which is as good."""
        try:
            _set_wal_state(self.conn, "closed")
        except sqlite3.Error as exc:
            log.warning("%s: cannot note a clean close: %s", self.path.name, exc)
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
            except sqlite3.DatabaseError as exc:
                if self.conn.in_transaction:  # a failed COMMIT may leave it open
                    self.conn.execute("ROLLBACK")
                refused = not_writable(self.path, exc)
                if refused is None:
                    self.raise_typed(exc)
                self._wal_to_truncate = True
                self._truncate_wal()
                raise refused from None

    def raise_typed(self, exc: sqlite3.DatabaseError) -> NoReturn:
        """Raise `exc` as the collector's error when it says the file is damaged
        (`BufferDamaged`) or locked by another process past the wait (`BufferBusy`); else
        re-raise it (called in its `except` block)."""
        if "locked" in str(exc):
            raise BufferBusy(self.path, LOCKED_WAIT_SECONDS) from None
        typed = damaged(self.path, exc)
        if typed is None:
            raise exc
        raise typed from None

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
