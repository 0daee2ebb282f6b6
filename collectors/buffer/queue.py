"""The send queue: a persistent, bounded queue of events between a driver and the sender.

A `Buffer` is one thread's connection to an instance's buffer file (`file.py`). Drivers
append events (with their cursor and own SQL) in one SQLite commit each; the sender reads
them back in order, from after the last id promised to a transaction (`ledger.py`, reached
as `buffer.ledger`). Capacity is counted in events: when it is reached, the instance's
`when_full` decides: `block` waits for room, `shed` drops the new events; both are counted
and logged. Nothing is held in an unbounded memory queue. It plays the part of the Pravega
Sensor Collector's `PersistentQueue`.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from enum import Enum
from pathlib import Path
from typing import Literal

from collectors.buffer import status
from collectors.buffer.file import BufferFile, WriteTurns
from collectors.buffer.ledger import Held, TxnLedger, held
from collectors.buffer.schema import BufferedEvent, CursorState, PendingEvent
from collectors.errors import CURSOR_HINT, CursorUnreadable
from pipeline.failpoints import Failpoints
from pipeline.streams import MAX_EVENT_SIZE, EventTooLarge
from pipeline.wording import counted

log = logging.getLogger(__name__)

WhenFull = Literal["block", "shed"]
#: Extra SQL a driver runs inside the append transaction (file state, ...).
TxnHook = Callable[[sqlite3.Connection], None]


class Appended(Enum):
    """What happened to a batch handed to `Buffer.append`."""

    STORED = "stored"
    SHED = "shed"
    STOPPED = "stopped"  # shutdown arrived while blocked on a full buffer: nothing stored


class Buffer(BufferFile):
    """One thread's connection to an instance's buffer file: its send queue, and its
    transaction ledger (`ledger`) on the same connection."""

    def __init__(
        self,
        path: Path,
        capacity_events: int,
        when_full: WhenFull = "block",
        *,
        room: threading.Condition | None = None,
        failpoints: Failpoints | None = None,
        turns: WriteTurns | None = None,
        file_mode: int = 0o600,
    ) -> None:
        super().__init__(path, room=room, failpoints=failpoints, turns=turns, file_mode=file_mode)
        self.capacity_events = capacity_events
        self.when_full = when_full
        self.ledger = TxnLedger(self)
        self._shed_events = 0
        self._shed_samples = 0
        self._last_shed_log = 0.0
        self._last_counter_flush = 0.0

    def close(self) -> None:
        self.flush_counters()
        super().close()

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
                f"{counted(len(events), 'event')} can never fit a buffer of "
                f"{self.capacity_events}: "
                "append at most capacity_events at a time"
            )
            raise ValueError(msg)
        blocked_since: float | None = None
        while True:
            if self._try_append(events, cursor, hook, blocked_since):
                self.notify_room()
                return Appended.STORED
            if self.when_full == "shed":
                self._count_shed(events)
                return Appended.SHED
            if blocked_since is None:
                blocked_since = time.monotonic()
                log.warning(
                    "%s: buffer full (%s): blocking the driver until the sender makes room",
                    self.path.name,
                    counted(self.capacity_events, "event"),
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
        with self.transaction() as c:
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
            status.add_counters(c, deltas)
            self.failpoints.hit("buffer.in_append_txn")
        if blocked_since is not None:
            log.warning("%s: room in the buffer again: driver resumed", self.path.name)
        return True

    @staticmethod
    def _depth(c: sqlite3.Connection) -> int:
        return held(c).total

    def _count_shed(self, events: Sequence[PendingEvent]) -> None:
        self._shed_events += len(events)
        self._shed_samples += sum(e.samples for e in events)
        now = time.monotonic()
        if now - self._last_shed_log >= 10.0:
            self._last_shed_log = now
            log.warning(
                "%s: buffer full (%s): shedding new samples (%s, %s shed so far in this "
                "run); raise capacity_events or fix the store connection",
                self.path.name,
                counted(self.capacity_events, "event"),
                counted(self._shed_events, "event"),
                counted(self._shed_samples, "sample"),
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
        with self.transaction() as c:
            status.add_counters(c, self._take_shed())

    # --- driver state ---------------------------------------------------------------------
    def cursor(self, name: str) -> CursorState | None:
        """The driver position stored as `name`; `CursorUnreadable` when its row is damaged
        (its version not a whole number, its value not a JSON object)."""
        try:
            row = self.conn.execute(
                "SELECT version, value FROM cursor WHERE name = ?", (name,)
            ).fetchone()
        except sqlite3.DatabaseError as exc:
            self.raise_typed(exc)
        if row is None:
            return None
        version, text = row
        try:
            value = json.loads(text)
        except (TypeError, ValueError):
            value = None
        if isinstance(version, bool) or not isinstance(version, int) or not isinstance(value, dict):
            problem = f"is damaged (version {version!r}, value {text!r:.200})"
            raise CursorUnreadable(self.path, name, problem, CURSOR_HINT)
        return CursorState(name, version, value)

    def write(self, hook: TxnHook) -> None:
        """Run a driver's own SQL (its state tables) in one write transaction."""
        with self.transaction() as c:
            hook(c)

    def quarantine(self, c: sqlite3.Connection, source: str, reason: str, payload: bytes) -> None:
        """Inside an append `hook`: keep bad input with the reason it was refused."""
        status.quarantine(c, source, reason, payload)

    # --- status (status.py) ---------------------------------------------------------------
    def add_counters(self, deltas: dict[str, int]) -> None:
        with self.transaction() as c:
            status.add_counters(c, deltas)

    def counters(self) -> dict[str, int]:
        return status.read_counters(self.conn)

    def record_error(self, source: str, message: str) -> None:
        """Keep `message` for `sluice collect status` (the last ERRORS_KEPT are kept)."""
        with self.transaction() as c:
            status.record_error(c, source, message)

    def set_meta(self, values: dict[str, str]) -> None:
        with self.transaction() as c:
            status.set_meta(c, values)

    def meta(self) -> dict[str, str]:
        return status.read_meta(self.conn)

    # --- the send queue (sender side) -----------------------------------------------------
    def next_batch(self, max_events: int, max_bytes: int) -> list[BufferedEvent]:
        """The oldest queued events: at most `max_events`, at most `max_bytes` (but >= 1)."""
        try:
            rows = self.conn.execute(
                "SELECT id, payload, routing_key, min_ns, max_ns, samples FROM events"
                " WHERE id > ? ORDER BY id LIMIT ?",
                (self.ledger.promised_up_to(), max_events),
            )
            batch: list[BufferedEvent] = []
            size = 0
            for row in rows:
                size += len(row[1])
                if batch and size > max_bytes:
                    break
                batch.append(BufferedEvent(*row))
            rows.close()
        except sqlite3.DatabaseError as exc:  # a damaged page: refused, never skipped
            self.raise_typed(exc)
        return batch

    def queued(self) -> int:
        """Events waiting to be sent (not yet promised to a transaction)."""
        return self.conn.execute(
            "SELECT count(*) FROM events WHERE id > ?", (self.ledger.promised_up_to(),)
        ).fetchone()[0]

    def depth(self) -> int:
        """Events held (queued, promised to a transaction not yet forgotten, or doubtful)."""
        return self._depth(self.conn)

    def held(self) -> Held:
        """Events held, pending (sent by the collector) and doubtful (by the operator)."""
        return held(self.conn)


def _ms_since(start: float) -> int:
    return int((time.monotonic() - start) * 1000)
