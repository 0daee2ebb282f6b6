"""The transaction ledger: the SQLite half of the two-phase commit (the `txns` table).

It records the stream transactions that may hold buffered events, and moves each one's batch
out of the send queue, back into it, or out of the buffer, in the same SQLite transaction that
changes its record. It shares its connection with the queue (`queue.py`), as the Pravega
Sensor Collector's `TransactionCoordinator` shares its `PersistentQueue`'s; the protocols that
drive it are in `collectors/coordinator.py`, the record states in FORMAT.md.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass

from collectors.buffer.file import BufferFile
from collectors.buffer.schema import BufferedEvent, TxnRecord, TxnRecordState
from collectors.buffer.status import add_counters, raise_last_committed
from collectors.errors import BufferCorrupt
from pipeline.wording import counted

#: The last buffer id promised to a recorded transaction; the send queue starts after it.
#: Every record with a range holds its rows out of the queue until it is resolved: `ready`
#: and `doubtful` ones, and `open` ones of the commit protocol (see coordinator.py).
PROMISED_UP_TO = "SELECT coalesce(max(last_id), 0) FROM txns WHERE last_id IS NOT NULL"


@dataclass(frozen=True, slots=True)
class Held:
    """The events a buffer holds: `pending` ones (queued, or promised to a transaction that
    recovery settles) go to the stream by themselves; `doubtful` ones wait for the operator
    (`sluice collect resolve`)."""

    pending: int
    doubtful: int

    @property
    def total(self) -> int:
        return self.pending + self.doubtful


def held(conn: sqlite3.Connection) -> Held:
    """What the buffer on `conn` holds, counted from the ends of its id ranges (SQLite counts
    rows one by one). Doubtful ranges lie below every other row: nothing is sent while a
    recorded transaction is unsettled, and they never move. The other rows are one run of
    ids after them (batches leave from its head, requeued ones return to it)."""
    doubtful, doubtful_up_to = conn.execute(
        "SELECT coalesce(sum(events), 0), coalesce(max(last_id), 0) FROM txns"
        " WHERE state = 'doubtful'"
    ).fetchone()
    low, high = conn.execute(
        "SELECT min(id), max(id) FROM events WHERE id > ?", (doubtful_up_to,)
    ).fetchone()
    return Held(0 if low is None else high - low + 1, doubtful)


class TxnLedger:
    """The transaction records of one buffer file, on one connection (the sender's)."""

    def __init__(self, file: BufferFile) -> None:
        self.file = file
        # Cached: only the sender thread moves it.
        self._promised_up_to: int | None = None

    def promised_up_to(self) -> int:
        """Ids up to this one are promised to a transaction; the send queue starts after it."""
        if self._promised_up_to is None:
            self._promised_up_to = self.file.conn.execute(PROMISED_UP_TO).fetchone()[0]
        return self._promised_up_to

    def txns(self) -> list[TxnRecord]:
        rows = self.file.conn.execute(
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
        with self.file.transaction() as c:
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
                self.file.failpoints.hit("sender.in_open_txn")
        if batch:
            self._promised_up_to = record.last_id
        return record

    def mark_ready(self, txn_id: str, stream: str, batch: Sequence[BufferedEvent]) -> TxnRecord:
        """In ONE SQLite transaction: the batch leaves the send queue and `txn_id` is recorded
        as flushed and ready to commit. After this returns, the batch belongs to the stream
        transaction: it will be committed (again, if need be), never sent a second time."""
        record = _batch_record(txn_id, stream, "ready", batch)
        with self.file.transaction() as c:
            self._check_contiguous(c, record)
            cur = c.execute(
                "UPDATE txns SET state = 'ready', first_id = ?, last_id = ?, events = ?,"
                " samples = ?, min_ns = ?, max_ns = ?, recorded_ns = ?"
                " WHERE txn_id = ? AND state = 'open'",
                (*_range_values(record), txn_id),
            )
            if cur.rowcount != 1:
                detail = f"transaction {txn_id} is not recorded as open"
                raise BufferCorrupt(self.file.path, detail)
            self.file.failpoints.hit("sender.in_ready_txn")
        self._promised_up_to = record.last_id
        return record

    def forget(self, record: TxnRecord, recommitted: bool = False) -> None:
        """The stream transaction is committed: drop its rows and its record together."""
        with self.file.transaction() as c:
            self._forget(c, record, recommitted)
        self.file.notify_room()

    def drop_open(self, txn_id: str) -> None:
        """An `open` transaction was aborted (or never reached the store): forget it. Rows it
        held (commit protocol) go back to the head of the send queue, to be sent again."""
        with self.file.transaction() as c:
            found = c.execute(
                "SELECT first_id FROM txns WHERE txn_id = ? AND state = 'open'", (txn_id,)
            ).fetchone()
            if found is not None and found[0] is not None:
                self._check_last_promise(c, txn_id, found[0])
            c.execute("DELETE FROM txns WHERE txn_id = ? AND state = 'open'", (txn_id,))
            add_counters(c, {"txns_aborted": 1})
        self._promised_up_to = None

    def requeue(self, record: TxnRecord) -> None:
        """The store says this ready transaction was aborted (or its lease ran out), so none
        of its events are in the stream: put its rows back at the head of the queue."""
        with self.file.transaction() as c:
            self._check_last_promise(c, record.txn_id, record.first_id)
            c.execute("DELETE FROM txns WHERE txn_id = ?", (record.txn_id,))
            add_counters(c, {"txns_requeued": 1})
        self._promised_up_to = None

    def mark_doubtful(self, record: TxnRecord, note: str) -> None:
        """Keep the rows of a transaction whose fate the store cannot tell (see FORMAT.md)."""
        with self.file.transaction() as c:
            c.execute(
                "UPDATE txns SET state = 'doubtful', note = ? WHERE txn_id = ?",
                (note, record.txn_id),
            )
            add_counters(c, {"txns_doubtful": 1})

    def doubtful(self) -> list[TxnRecord]:
        """The doubtful records, oldest first."""
        return [r for r in self.txns() if r.state == "doubtful"]

    def rows(self, record: TxnRecord) -> list[BufferedEvent]:
        """The buffered events of `record`'s range, in order."""
        rows = self.file.conn.execute(
            "SELECT id, payload, routing_key, min_ns, max_ns, samples FROM events"
            " WHERE id BETWEEN ? AND ? ORDER BY id",
            (record.first_id, record.last_id),
        )
        return [BufferedEvent(*row) for row in rows]

    def drop_doubtful(self, record: TxnRecord) -> None:
        """The operator says the doubtful batch is in the stream (or not wanted): drop its
        rows and its record together."""
        with self.file.transaction() as c:
            self._check_doubtful(c, record)
            c.execute(
                "DELETE FROM events WHERE id BETWEEN ? AND ?", (record.first_id, record.last_id)
            )
            c.execute("DELETE FROM txns WHERE txn_id = ?", (record.txn_id,))
            add_counters(c, {"doubtful_dropped": record.events})
        self._promised_up_to = None
        self.file.notify_room()

    def resend_doubtful(self, record: TxnRecord) -> None:
        """The operator says the doubtful batch is not in the stream: its rows move, in order,
        to the tail of the send queue (new ids: the rows after the doubtful ones stay one run
        of ids, see `held`) and its record goes, in one SQLite transaction."""
        with self.file.transaction() as c:
            self._check_doubtful(c, record)
            c.execute(
                "INSERT INTO events (routing_key, payload, min_ns, max_ns, samples, buffered_ns)"
                " SELECT routing_key, payload, min_ns, max_ns, samples, buffered_ns FROM events"
                " WHERE id BETWEEN ? AND ? ORDER BY id",
                (record.first_id, record.last_id),
            )
            c.execute(
                "DELETE FROM events WHERE id BETWEEN ? AND ?", (record.first_id, record.last_id)
            )
            c.execute("DELETE FROM txns WHERE txn_id = ?", (record.txn_id,))
            add_counters(c, {"doubtful_resent": record.events})
        self._promised_up_to = None

    def _check_doubtful(self, c: sqlite3.Connection, record: TxnRecord) -> None:
        found = c.execute(
            "SELECT count(*) FROM events WHERE id BETWEEN ? AND ?",
            (record.first_id, record.last_id),
        ).fetchone()[0]
        state = c.execute("SELECT state FROM txns WHERE txn_id = ?", (record.txn_id,)).fetchone()
        if state != ("doubtful",) or found != record.events:
            detail = (
                f"transaction {record.txn_id} is not a doubtful record of "
                f"{counted(record.events, 'event')} ({counted(found, 'row')} held)"
            )
            raise BufferCorrupt(self.file.path, detail)

    def _forget(self, c: sqlite3.Connection, record: TxnRecord, recommitted: bool) -> None:
        c.execute("DELETE FROM events WHERE id BETWEEN ? AND ?", (record.first_id, record.last_id))
        c.execute("DELETE FROM txns WHERE txn_id = ?", (record.txn_id,))
        self.file.failpoints.hit("sender.in_forget_txn")
        if record.max_ns is not None:
            raise_last_committed(c, record.max_ns)
        deltas = {
            "events_committed": record.events,
            "samples_committed": record.samples,
            "txns_committed": 1,
            "txns_recommitted": int(recommitted),
        }
        add_counters(c, deltas)

    def _check_contiguous(self, c: sqlite3.Connection, record: TxnRecord) -> None:
        first, last, n = record.first_id, record.last_id, record.events
        promised = c.execute(PROMISED_UP_TO).fetchone()[0]
        held = c.execute(
            "SELECT count(*) FROM events WHERE id BETWEEN ? AND ?", (first, last)
        ).fetchone()[0]
        if promised >= first or held != n or last - first + 1 != n:
            detail = (
                f"batch {first}..{last} of {counted(n, 'event')} overlaps a promised range "
                f"(up to {promised}) or has gaps ({counted(held, 'row')} held)"
            )
            raise BufferCorrupt(self.file.path, detail)

    def _check_last_promise(self, c: sqlite3.Connection, txn_id: str, first_id: int) -> None:
        """Rows go back to the head of the queue only if no later range is promised."""
        later = c.execute(
            "SELECT count(*) FROM txns WHERE last_id IS NOT NULL AND first_id > ?", (first_id,)
        ).fetchone()[0]
        if later:
            detail = f"cannot requeue {txn_id}: later transactions are recorded"
            raise BufferCorrupt(self.file.path, detail)


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
