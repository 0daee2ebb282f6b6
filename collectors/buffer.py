"""The persistent, bounded SQLite buffer between a driver and the sender.

A `Buffer` is one connection to an instance's buffer file; the driver thread and the sender
thread each open their own (SQLite in WAL mode lets one write while the other reads). Writes
use `BEGIN IMMEDIATE`, so the two never deadlock on a lock upgrade.

Capacity is counted in events. When a driver appends to a full buffer, the instance's
`when_full` policy decides: `block` waits for the sender to make room (counting the time
blocked), `shed` drops the new events (counting them). Both are logged. Nothing is ever held
in an unbounded memory queue.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Literal

from collectors.errors import BufferCorrupt, BufferSchemaError
from collectors.failpoints import Failpoints
from collectors.state import (
    ERRORS_KEPT,
    SCHEMA,
    SCHEMA_VERSION,
    BufferedEvent,
    CursorState,
    PendingEvent,
    TxnRecord,
    TxnRecordState,
)
from pipeline.streams import MAX_EVENT_SIZE, EventTooLarge

log = logging.getLogger(__name__)

WhenFull = Literal["block", "shed"]
#: Extra SQL a driver runs inside the append transaction (file state, ...).
TxnHook = Callable[[sqlite3.Connection], None]
#: The last buffer id promised to a recorded transaction; the send queue starts after it.
#: Every record with a range holds its rows out of the queue until it is resolved: `ready`
#: and `doubtful` ones, and `open` ones of the commit protocol (see coordinator.py).
PROMISED_UP_TO = "SELECT coalesce(max(last_id), 0) FROM txns WHERE last_id IS NOT NULL"


class Appended(Enum):
    """What happened to a batch handed to `Buffer.append`."""

    STORED = "stored"
    SHED = "shed"
    STOPPED = "stopped"  # shutdown arrived while blocked on a full buffer: nothing stored


def connect(path: Path) -> sqlite3.Connection:
    """Open (creating if needed) a buffer file with the collector's durability settings."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None, timeout=60.0, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 60000")
    if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        conn.execute("PRAGMA page_size = 65536")
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    # Some SQLite builds zero every deleted byte (SECURE_DELETE): for sent samples that
    # doubles the writes. FAST zeroes only what costs no extra I/O.
    conn.execute("PRAGMA secure_delete = FAST")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        conn.close()
        raise BufferSchemaError(path, version, SCHEMA_VERSION)
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


class Buffer:
    """One connection to an instance's buffer file, used by one thread."""

    def __init__(
        self,
        path: Path,
        capacity_events: int,
        when_full: WhenFull = "block",
        *,
        room: threading.Condition | None = None,
        failpoints: Failpoints | None = None,
        turns: WriteTurns | None = None,
    ) -> None:
        self.path = path
        self.capacity_events = capacity_events
        self.when_full = when_full
        self.room = room or threading.Condition()
        self.failpoints = failpoints or Failpoints()
        self.turns = turns or WriteTurns()
        self.conn = connect(path)
        self._shed_events = 0
        self._shed_samples = 0
        self._last_shed_log = 0.0
        self._last_counter_flush = 0.0
        # The sender's position is cached: only the sender thread moves it.
        self._queue_after: int | None = None

    def close(self) -> None:
        self.flush_counters()
        self.conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE), taken in turn with the instance's others."""
        with self.turns.turn():
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    # --- appending (driver side) ----------------------------------------------------------
    def append(
        self,
        events: Sequence[PendingEvent],
        cursor: CursorState | None = None,
        hook: TxnHook | None = None,
        stop: threading.Event | None = None,
    ) -> Appended:
        """Store `events` (with the driver's `cursor` and `hook` SQL) in one SQLite commit.

        An event over the store's size limit raises `EventTooLarge` (nothing is stored).
        When the buffer is full, `block` waits for room (returning STOPPED if `stop` is set
        meanwhile), `shed` drops the events and returns SHED. Returns STORED once durable.
        """
        for event in events:
            if len(event.payload) > MAX_EVENT_SIZE:
                raise EventTooLarge(len(event.payload), MAX_EVENT_SIZE)
        if len(events) > self.capacity_events:
            msg = (
                f"{len(events)} events can never fit a buffer of {self.capacity_events}: "
                "append at most capacity_events at a time"
            )
            raise ValueError(msg)
        blocked_since: float | None = None
        while True:
            if self._try_append(events, cursor, hook, blocked_since):
                with self.room:
                    self.room.notify_all()
                return Appended.STORED
            if self.when_full == "shed":
                self._count_shed(events)
                return Appended.SHED
            if blocked_since is None:
                blocked_since = time.monotonic()
                log.warning(
                    "%s: buffer full (%d events): blocking the driver until the sender makes room",
                    self.path.name,
                    self.capacity_events,
                )
            if stop is not None and stop.is_set():
                self.add_counters({"blocked_ms": _ms_since(blocked_since)})
                return Appended.STOPPED
            with self.room:
                self.room.wait(0.25)

    def _try_append(
        self,
        events: Sequence[PendingEvent],
        cursor: CursorState | None,
        hook: TxnHook | None,
        blocked_since: float | None,
    ) -> bool:
        now = time.time_ns()
        with self._write() as c:
            if events and self._depth(c) + len(events) > self.capacity_events:
                return False
            c.executemany(
                "INSERT INTO events (routing_key, payload, min_ns, max_ns, samples, buffered_ns)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [(e.routing_key, e.payload, e.min_ns, e.max_ns, e.samples, now) for e in events],
            )
            if cursor is not None:
                c.execute(
                    "INSERT OR REPLACE INTO cursor (name, version, value) VALUES (?, ?, ?)",
                    (cursor.name, cursor.version, json.dumps(cursor.value)),
                )
            if hook is not None:
                hook(c)
            deltas = {
                "events_buffered": len(events),
                "samples_buffered": sum(e.samples for e in events),
                **self._take_shed(),
            }
            if blocked_since is not None:
                deltas["blocked_ms"] = _ms_since(blocked_since)
            _add_counters(c, deltas)
            self.failpoints.hit("buffer.in_append_txn")
        if blocked_since is not None:
            log.warning("%s: room in the buffer again: driver resumed", self.path.name)
        return True

    @staticmethod
    def _depth(c: sqlite3.Connection) -> int:
        low, high = c.execute("SELECT min(id), max(id) FROM events").fetchone()
        return 0 if low is None else high - low + 1

    def _count_shed(self, events: Sequence[PendingEvent]) -> None:
        self._shed_events += len(events)
        self._shed_samples += sum(e.samples for e in events)
        now = time.monotonic()
        if now - self._last_shed_log >= 10.0:
            self._last_shed_log = now
            log.warning(
                "%s: buffer full (%d events): shedding new samples (%d events, %d samples "
                "shed so far in this run); raise capacity_events or fix the store connection",
                self.path.name,
                self.capacity_events,
                self._shed_events,
                self._shed_samples,
            )
        self.flush_counters(min_interval=1.0)

    def _take_shed(self) -> dict[str, int]:
        if not self._shed_events:
            return {}
        deltas = {"events_shed": self._shed_events, "samples_shed": self._shed_samples}
        self._shed_events = self._shed_samples = 0
        return deltas

    def flush_counters(self, min_interval: float = 0.0) -> None:
        """Persist in-memory shed counts (at most every `min_interval` seconds)."""
        now = time.monotonic()
        if not self._shed_events or now - self._last_counter_flush < min_interval:
            return
        self._last_counter_flush = now
        with self._write() as c:
            _add_counters(c, self._take_shed())

    # --- driver cursors and counters ------------------------------------------------------
    def cursor(self, name: str) -> CursorState | None:
        row = self.conn.execute(
            "SELECT version, value FROM cursor WHERE name = ?", (name,)
        ).fetchone()
        return None if row is None else CursorState(name, row[0], json.loads(row[1]))

    def add_counters(self, deltas: dict[str, int]) -> None:
        with self._write() as c:
            _add_counters(c, deltas)

    def counters(self) -> dict[str, int]:
        return dict(self.conn.execute("SELECT name, value FROM counters"))

    def record_error(self, source: str, message: str) -> None:
        """Keep `message` for `sluice collect status` (the last ERRORS_KEPT are kept)."""
        with self._write() as c:
            c.execute(
                "INSERT INTO errors (time_ns, source, message) VALUES (?, ?, ?)",
                (time.time_ns(), source, message[:2000]),
            )
            c.execute(
                "DELETE FROM errors WHERE id <= (SELECT max(id) FROM errors) - ?", (ERRORS_KEPT,)
            )
            _add_counters(c, {"errors": 1})

    def quarantine(self, c: sqlite3.Connection, source: str, reason: str, payload: bytes) -> None:
        """Inside an append `hook`: keep bad input with the reason it was refused."""
        c.execute(
            "INSERT INTO quarantine (time_ns, source, reason, payload) VALUES (?, ?, ?, ?)",
            (time.time_ns(), source, reason, payload),
        )
        _add_counters(c, {"quarantined": 1})

    def write(self, hook: TxnHook) -> None:
        """Run a driver's own SQL (its state tables) in one write transaction."""
        with self._write() as c:
            hook(c)

    def set_meta(self, values: dict[str, str]) -> None:
        with self._write() as c:
            c.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", values.items())

    def meta(self) -> dict[str, str]:
        return dict(self.conn.execute("SELECT key, value FROM meta"))

    # --- the send queue (sender side) -----------------------------------------------------
    def queue_after(self) -> int:
        """Ids up to this one are promised to a transaction; the queue starts after it."""
        if self._queue_after is None:
            self._queue_after = self.conn.execute(PROMISED_UP_TO).fetchone()[0]
        return self._queue_after

    def next_batch(self, max_events: int, max_bytes: int) -> list[BufferedEvent]:
        """The oldest queued events: at most `max_events`, at most `max_bytes` (but >= 1)."""
        rows = self.conn.execute(
            "SELECT id, payload, routing_key, min_ns, max_ns, samples FROM events"
            " WHERE id > ? ORDER BY id LIMIT ?",
            (self.queue_after(), max_events),
        )
        batch: list[BufferedEvent] = []
        size = 0
        for row in rows:
            size += len(row[1])
            if batch and size > max_bytes:
                break
            batch.append(BufferedEvent(*row))
        rows.close()
        return batch

    def queued(self) -> int:
        """Events waiting to be sent (not yet promised to a transaction)."""
        return self.conn.execute(
            "SELECT count(*) FROM events WHERE id > ?", (self.queue_after(),)
        ).fetchone()[0]

    def depth(self) -> int:
        """Events held (queued, or promised to a transaction not yet forgotten)."""
        return self._depth(self.conn)

    # --- transaction records: the SQLite half of the two-phase commit ---------------------
    def txns(self) -> list[TxnRecord]:
        rows = self.conn.execute(
            "SELECT txn_id, stream, state, first_id, last_id, events, samples, min_ns, max_ns,"
            " recorded_ns, note FROM txns ORDER BY coalesce(first_id, 0), recorded_ns"
        )
        return [TxnRecord(*row) for row in rows]

    def record_open(
        self,
        txn_id: str,
        stream: str,
        forget: TxnRecord | None = None,
        batch: Sequence[BufferedEvent] = (),
    ) -> TxnRecord:
        """Note a begun transaction, so that a crash before it is settled is settled later.

        Without `batch` (flush protocol) nothing is promised yet: recovery aborts it. With
        `batch` (commit protocol) the record carries the batch's range: its rows stay in the
        buffer but are held out of the send queue until the record is resolved, and recovery
        asks the store what became of it. `forget`, a committed transaction not forgotten
        yet, is forgotten in the same SQLite commit: one fsync fewer per batch while a
        backlog drains."""
        record = (
            _batch_record(txn_id, stream, "open", batch)
            if batch
            else TxnRecord(txn_id, stream, "open", None, None, 0, 0, None, None, time.time_ns())
        )
        with self._write() as c:
            if forget is not None:
                self._forget(c, forget, recommitted=False)
            if batch:
                self._check_contiguous(c, record)
            c.execute(
                "INSERT INTO txns (txn_id, stream, state, first_id, last_id, events, samples,"
                " min_ns, max_ns, recorded_ns) VALUES (?, ?, 'open', ?, ?, ?, ?, ?, ?, ?)",
                (txn_id, stream, *_range_values(record)),
            )
            if batch:
                self.failpoints.hit("sender.in_open_txn")
        if batch:
            self._queue_after = record.last_id
        return record

    def mark_ready(self, txn_id: str, stream: str, batch: Sequence[BufferedEvent]) -> TxnRecord:
        """In ONE SQLite transaction: the batch leaves the send queue and `txn_id` is recorded
        as flushed and ready to commit. After this returns, the batch belongs to the stream
        transaction: it will be committed (again, if need be), never sent a second time."""
        record = _batch_record(txn_id, stream, "ready", batch)
        with self._write() as c:
            self._check_contiguous(c, record)
            cur = c.execute(
                "UPDATE txns SET state = 'ready', first_id = ?, last_id = ?, events = ?,"
                " samples = ?, min_ns = ?, max_ns = ?, recorded_ns = ?"
                " WHERE txn_id = ? AND state = 'open'",
                (*_range_values(record), txn_id),
            )
            if cur.rowcount != 1:
                raise BufferCorrupt(self.path, f"transaction {txn_id} is not recorded as open")
            self.failpoints.hit("sender.in_ready_txn")
        self._queue_after = record.last_id
        return record

    def _check_contiguous(self, c: sqlite3.Connection, record: TxnRecord) -> None:
        first, last, n = record.first_id, record.last_id, record.events
        promised = c.execute(PROMISED_UP_TO).fetchone()[0]
        held = c.execute(
            "SELECT count(*) FROM events WHERE id BETWEEN ? AND ?", (first, last)
        ).fetchone()[0]
        if promised >= first or held != n or last - first + 1 != n:
            detail = (
                f"batch {first}..{last} of {n} events overlaps a promised range (up to "
                f"{promised}) or has gaps ({held} rows held)"
            )
            raise BufferCorrupt(self.path, detail)

    def _check_last_promise(self, c: sqlite3.Connection, txn_id: str, first_id: int) -> None:
        """Rows go back to the head of the queue only if no later range is promised."""
        later = c.execute(
            "SELECT count(*) FROM txns WHERE last_id IS NOT NULL AND first_id > ?", (first_id,)
        ).fetchone()[0]
        if later:
            detail = f"cannot requeue {txn_id}: later transactions are recorded"
            raise BufferCorrupt(self.path, detail)

    def forget(self, record: TxnRecord, recommitted: bool = False) -> None:
        """The stream transaction is committed: drop its rows and its record together."""
        with self._write() as c:
            self._forget(c, record, recommitted)
        with self.room:
            self.room.notify_all()

    def _forget(self, c: sqlite3.Connection, record: TxnRecord, recommitted: bool) -> None:
        c.execute("DELETE FROM events WHERE id BETWEEN ? AND ?", (record.first_id, record.last_id))
        c.execute("DELETE FROM txns WHERE txn_id = ?", (record.txn_id,))
        self.failpoints.hit("sender.in_forget_txn")
        if record.max_ns is not None:
            c.execute(
                "INSERT INTO meta (key, value) VALUES ('last_committed_ns', ?)"
                " ON CONFLICT (key) DO UPDATE SET value ="
                " max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
                (str(record.max_ns),),
            )
        deltas = {
            "events_committed": record.events,
            "samples_committed": record.samples,
            "txns_committed": 1,
            "txns_recommitted": int(recommitted),
        }
        _add_counters(c, deltas)

    def drop_open(self, txn_id: str) -> None:
        """An `open` transaction was aborted (or never reached the store): forget it. Rows it
        held (commit protocol) go back to the head of the send queue, to be sent again."""
        with self._write() as c:
            found = c.execute(
                "SELECT first_id FROM txns WHERE txn_id = ? AND state = 'open'", (txn_id,)
            ).fetchone()
            if found is not None and found[0] is not None:
                self._check_last_promise(c, txn_id, found[0])
            c.execute("DELETE FROM txns WHERE txn_id = ? AND state = 'open'", (txn_id,))
            _add_counters(c, {"txns_aborted": 1})
        self._queue_after = None

    def requeue(self, record: TxnRecord) -> None:
        """The store says this ready transaction was aborted (or its lease ran out), so none
        of its events are in the stream: put its rows back at the head of the queue."""
        with self._write() as c:
            self._check_last_promise(c, record.txn_id, record.first_id)
            c.execute("DELETE FROM txns WHERE txn_id = ?", (record.txn_id,))
            _add_counters(c, {"txns_requeued": 1})
        self._queue_after = None

    def mark_doubtful(self, record: TxnRecord, note: str) -> None:
        """Keep the rows of a transaction whose fate the store cannot tell (see state.py)."""
        with self._write() as c:
            c.execute(
                "UPDATE txns SET state = 'doubtful', note = ? WHERE txn_id = ?",
                (note, record.txn_id),
            )
            _add_counters(c, {"txns_doubtful": 1})


def _batch_record(
    txn_id: str, stream: str, state: TxnRecordState, batch: Sequence[BufferedEvent]
) -> TxnRecord:
    """The record of a transaction that carries `batch` (its range, counts, time bounds)."""
    return TxnRecord(
        txn_id=txn_id,
        stream=stream,
        state=state,
        first_id=batch[0].id,
        last_id=batch[-1].id,
        events=len(batch),
        samples=sum(e.samples for e in batch),
        min_ns=min(e.min_ns for e in batch),
        max_ns=max(e.max_ns for e in batch),
        recorded_ns=time.time_ns(),
    )


def _range_values(record: TxnRecord) -> tuple:
    """first_id, last_id, events, samples, min_ns, max_ns, recorded_ns (the SQL order)."""
    return (
        record.first_id,
        record.last_id,
        record.events,
        record.samples,
        record.min_ns,
        record.max_ns,
        record.recorded_ns,
    )


def _add_counters(c: sqlite3.Connection, deltas: dict[str, int]) -> None:
    rows = [(k, v) for k, v in deltas.items() if v]
    if rows:
        c.executemany(
            "INSERT INTO counters (name, value) VALUES (?, ?)"
            " ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
            rows,
        )


def _ms_since(start: float) -> int:
    return int((time.monotonic() - start) * 1000)
